//! f16 vector helpers for attention over the f16 KV cache: dot products, multiply-add into an
//! f16 accumulator, and scaling, with an F16C/AVX2/FMA path chosen at run time and a scalar
//! path that computes the same thing.
//!
//! The reduction order of [`dot_f16`] follows ggml's `ggml_vec_dot_f16` (four 8-lane
//! accumulators over steps of 32, reduced pairwise), so that attention scores agree bit for bit
//! with llama.cpp's on x86.

use half::f16;
use std::sync::OnceLock;

fn has_f16c() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let forced_scalar = std::env::var("NUCLEUS_SIMD").is_ok_and(|v| v == "scalar");
            !forced_scalar
                && is_x86_feature_detected!("f16c")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Σ x[i]·y[i] for f16 vectors.
pub fn dot_f16(x: &[f16], y: &[f16]) -> f32 {
    assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU supports F16C, AVX2 and FMA (checked above); lengths are equal.
        return unsafe { x86::dot_f16(x, y) };
    }
    dot_f16_scalar(x, y)
}

/// y[i] = f16(y[i] + x[i]·v): ggml's `ggml_vec_mad_f16`, the accumulator kept in f16.
pub fn mad_f16(y: &mut [f16], x: &[f16], v: f32) {
    assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: as in `dot_f16`.
        return unsafe { x86::mad_f16(y, x, v) };
    }
    for (a, b) in y.iter_mut().zip(x) {
        *a = f16::from_f32(b.to_f32().mul_add(v, a.to_f32()));
    }
}

/// y[i] = f16(y[i]·v).
pub fn scale_f16(y: &mut [f16], v: f32) {
    for a in y.iter_mut() {
        *a = f16::from_f32(a.to_f32() * v);
    }
}

/// One key's update of an f16 attention accumulator: rescale by `rescale` when the running
/// maximum grew, then add the key's value vector times `weight`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AccStep {
    pub rescale: Option<f32>,
    pub weight: f32,
}

/// Applies several keys' steps to `acc` in one pass over it. Per element this performs exactly
/// the operations of calling [`scale_f16`] and [`mad_f16`] once per step, in the same order
/// (each rounded to f16), so the result is bit-identical; it only saves reloading and storing
/// the accumulator between keys.
pub fn acc_steps_f16(acc: &mut [f16], values: &[&[f16]], steps: &[AccStep]) {
    assert_eq!(values.len(), steps.len());
    assert!(values.iter().all(|v| v.len() == acc.len()));
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: as in `dot_f16`; every value row has `acc.len()` elements (asserted).
        return unsafe { x86::acc_steps_f16(acc, values, steps) };
    }
    for (d, a) in acc.iter_mut().enumerate() {
        let mut y = *a;
        for (v, st) in values.iter().zip(steps) {
            if let Some(ms) = st.rescale {
                y = f16::from_f32(y.to_f32() * ms);
            }
            y = f16::from_f32(v[d].to_f32().mul_add(st.weight, y.to_f32()));
        }
        *a = y;
    }
}

/// Scalar `dot_f16` with ggml's accumulation order.
pub fn dot_f16_scalar(x: &[f16], y: &[f16]) -> f32 {
    let n32 = x.len() / 32 * 32;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..n32).step_by(32) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, lane) in lanes.iter_mut().enumerate() {
                let k = i + j * 8 + l;
                *lane = x[k].to_f32().mul_add(y[k].to_f32(), *lane);
            }
        }
    }
    let mut sum = reduce(&acc) as f64;
    for k in n32..x.len() {
        sum += (x[k].to_f32() * y[k].to_f32()) as f64;
    }
    sum as f32
}

/// ggml's GGML_F16_VEC_REDUCE on AVX: pairwise over the four accumulators, then across lanes.
fn reduce(acc: &[[f32; 8]; 4]) -> f32 {
    let mut a = [0f32; 8];
    for l in 0..8 {
        let s02 = acc[0][l] + acc[2][l];
        let s13 = acc[1][l] + acc[3][l];
        a[l] = s02 + s13;
    }
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let h = [t[0] + t[1], t[2] + t[3]];
    h[0] + h[1]
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// # Safety
    /// Requires F16C, AVX2 and FMA; `x.len() == y.len()`.
    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn dot_f16(x: &[f16], y: &[f16]) -> f32 {
        let n32 = x.len() / 32 * 32;
        let (px, py) = (x.as_ptr() as *const __m128i, y.as_ptr() as *const __m128i);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < n32 {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: i + 8j + 8 <= n32 <= len, so both 8-element (16-byte) loads are in
                // bounds; unaligned loads are used.
                let (vx, vy) = unsafe {
                    (
                        _mm256_cvtph_ps(_mm_loadu_si128(px.add((i + j * 8) / 8))),
                        _mm256_cvtph_ps(_mm_loadu_si128(py.add((i + j * 8) / 8))),
                    )
                };
                *a = _mm256_fmadd_ps(vx, vy, *a);
            }
            i += 32;
        }
        let s02 = _mm256_add_ps(acc[0], acc[2]);
        let s13 = _mm256_add_ps(acc[1], acc[3]);
        let s = _mm256_add_ps(s02, s13);
        let t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        let mut sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1)) as f64;
        for k in n32..x.len() {
            sum += (x[k].to_f32() * y[k].to_f32()) as f64;
        }
        sum as f32
    }

    /// # Safety
    /// Requires F16C, AVX2 and FMA; every row of `values` has `acc.len()` elements.
    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn acc_steps_f16(acc: &mut [f16], values: &[&[f16]], steps: &[super::AccStep]) {
        let n8 = acc.len() / 8 * 8;
        let pa = acc.as_mut_ptr() as *mut __m128i;
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= len of `acc` and of every value row: loads and the store
            // stay inside them.
            unsafe {
                let mut a = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i / 8)));
                for (v, st) in values.iter().zip(steps) {
                    if let Some(ms) = st.rescale {
                        // scale_f16: f16(y·ms)
                        let r = _mm256_mul_ps(a, _mm256_set1_ps(ms));
                        a = _mm256_cvtph_ps(_mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
                    }
                    // mad_f16: f16(fma(x, v, y))
                    let x =
                        _mm256_cvtph_ps(_mm_loadu_si128((v.as_ptr() as *const __m128i).add(i / 8)));
                    let r = _mm256_fmadd_ps(x, _mm256_set1_ps(st.weight), a);
                    a = _mm256_cvtph_ps(_mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
                }
                _mm_storeu_si128(pa.add(i / 8), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
            }
            i += 8;
        }
        // Leftovers exactly as the per-step scalar tails of `scale_f16` and `mad_f16` here.
        for d in n8..acc.len() {
            let mut y = acc[d];
            for (v, st) in values.iter().zip(steps) {
                if let Some(ms) = st.rescale {
                    y = f16::from_f32(y.to_f32() * ms);
                }
                y = f16::from_f32(y.to_f32() + v[d].to_f32() * st.weight);
            }
            acc[d] = y;
        }
    }

    /// # Safety
    /// Requires F16C, AVX2 and FMA; `x.len() == y.len()`.
    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn mad_f16(y: &mut [f16], x: &[f16], v: f32) {
        let n8 = x.len() / 8 * 8;
        let vv = _mm256_set1_ps(v);
        let (px, py) = (x.as_ptr() as *const __m128i, y.as_mut_ptr() as *mut __m128i);
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= len: the loads and the store stay inside `x` and `y`.
            unsafe {
                let vx = _mm256_cvtph_ps(_mm_loadu_si128(px.add(i / 8)));
                let vy = _mm256_cvtph_ps(_mm_loadu_si128(py.add(i / 8)));
                let r = _mm256_fmadd_ps(vx, vv, vy);
                _mm_storeu_si128(py.add(i / 8), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
            }
            i += 8;
        }
        for k in n8..x.len() {
            y[k] = f16::from_f32(y[k].to_f32() + x[k].to_f32() * v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vecs(n: usize, seed: u32) -> (Vec<f16>, Vec<f16>) {
        let f = |i: usize, s: u32| {
            f16::from_f32((((i as u32).wrapping_mul(2654435761) ^ s) % 2000) as f32 / 500.0 - 2.0)
        };
        (
            (0..n).map(|i| f(i, seed)).collect(),
            (0..n).map(|i| f(i, seed + 7)).collect(),
        )
    }

    #[test]
    fn acc_steps_equal_per_key_scale_and_mad() {
        for n in [8, 64, 256, 12, 3] {
            let (a0, _) = vecs(n, 3);
            let rows: Vec<Vec<f16>> = (0..4).map(|k| vecs(n, 10 + k).0).collect();
            let steps = [
                AccStep {
                    rescale: None,
                    weight: 0.73,
                },
                AccStep {
                    rescale: Some(0.41),
                    weight: 1.0,
                },
                AccStep {
                    rescale: None,
                    weight: 0.05,
                },
                AccStep {
                    rescale: Some(0.999),
                    weight: 1.0,
                },
            ];
            for g in 1..=4 {
                let mut want = a0.clone();
                for k in 0..g {
                    if let Some(ms) = steps[k].rescale {
                        scale_f16(&mut want, ms);
                    }
                    mad_f16(&mut want, &rows[k], steps[k].weight);
                }
                let mut got = a0.clone();
                let vals: Vec<&[f16]> = rows[..g].iter().map(|r| r.as_slice()).collect();
                acc_steps_f16(&mut got, &vals, &steps[..g]);
                let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "n={n} g={g}");
            }
        }
    }

    #[test]
    fn simd_and_scalar_agree_exactly() {
        for n in [32, 64, 256, 40, 7, 0] {
            let (x, y) = vecs(n, n as u32);
            assert_eq!(
                dot_f16(&x, &y).to_bits(),
                dot_f16_scalar(&x, &y).to_bits(),
                "n={n}"
            );
            let want: f64 = x.iter().zip(&y).map(|(a, b)| a.to_f64() * b.to_f64()).sum();
            assert!((dot_f16(&x, &y) as f64 - want).abs() < 1e-3 * (1.0 + want.abs()));
            let mut a = y.clone();
            mad_f16(&mut a, &x, 0.37);
            for i in 0..n {
                let r = f16::from_f32(x[i].to_f32().mul_add(0.37, y[i].to_f32()));
                assert!((a[i].to_f32() - r.to_f32()).abs() <= r.to_f32().abs() * 1e-3 + 1e-6);
            }
        }
    }
}
