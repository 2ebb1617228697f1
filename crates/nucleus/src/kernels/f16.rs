//! f16 vector helpers for attention over the f16 KV cache: dot products, multiply-add into an
//! f16 accumulator, and scaling, with an F16C/AVX2/FMA path chosen at run time and a scalar
//! path that computes the same thing.
//!
//! The reduction order of [`dot_f16`] is that of ggml's `ggml_vec_dot_f16` as built for AVX-512
//! (four 16-lane accumulators over steps of 64, reduced pairwise, the tail summed in f64), on
//! every CPU: the reference outputs we test against were made by such a build, and one fixed
//! order makes attention scores the same bits on every machine. On AVX2 each 16-lane
//! accumulator is two 8-lane registers; the cost is the same.

use half::f16;

/// Whether the F16C/AVX2/FMA paths run: at every SIMD level above scalar (each has those
/// features), so `NUCLEUS_SIMD=scalar` selects the scalar paths here as for the dot kernels.
fn has_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::quant::simd_level() >= crate::quant::SimdLevel::Avx2
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
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

/// [`dot_f16`] of `x` against `y`, both given widened to f32 (every value an f16's): the same
/// bits, for a key widened once and dotted with several queries.
pub fn dot_f16_widened(x: &[f32], y: &[f32]) -> f32 {
    assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: as in `dot_f16`.
        return unsafe { x86::dot_f16_widened(x, y) };
    }
    dot_widened_scalar(x, y)
}

/// `out[i] = f32(x[i])`.
pub fn widen(out: &mut [f32], x: &[f16]) {
    assert_eq!(out.len(), x.len());
    for (o, v) in out.iter_mut().zip(x) {
        *o = v.to_f32();
    }
}

/// y[i] = f16(y[i] + x[i]·v): ggml's `ggml_vec_mad_f16`, the accumulator kept in f16.
pub fn mad_f16(y: &mut [f16], x: &[f16], v: f32) {
    assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: as in `dot_f16`.
        return unsafe { x86::mad_f16(y, x, v) };
    }
    mad_f16_scalar(y, x, v)
}

/// Scalar [`mad_f16`]: per element the one rounding of the FMA, then the one to f16 (GCC
/// contracts ggml's leftover loop `y + x*v` into an FMA too).
fn mad_f16_scalar(y: &mut [f16], x: &[f16], v: f32) {
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
    if has_f16c() && !acc.is_empty() {
        // The one-accumulator case of `acc_steps_f16_many`, up to four rows at a time: the
        // accumulator goes through f16 after every step anyway, so storing it between groups
        // changes nothing.
        for (vs, sts) in values.chunks(MANY_ROWS).zip(steps.chunks(MANY_ROWS)) {
            let mut group = [AccStep {
                rescale: None,
                weight: 0.0,
            }; MANY_ROWS];
            group[..sts.len()].copy_from_slice(sts);
            acc_steps_f16_many(acc, acc.len(), vs, &[group]);
        }
        return;
    }
    acc_steps_f16_scalar(acc, values, steps)
}

/// Value rows per [`acc_steps_f16_many`] call, at most.
pub const MANY_ROWS: usize = 4;

/// [`acc_steps_f16`] for several accumulators (the heads that share a KV head, `accs` cut in
/// rows of `n`) over the same value rows, each with its own steps (`steps[h][..values.len()]`):
/// the same bits, each value row widened once for all.
pub fn acc_steps_f16_many(
    accs: &mut [f16],
    n: usize,
    values: &[&[f16]],
    steps: &[[AccStep; MANY_ROWS]],
) {
    assert!(n > 0 && accs.len() == n * steps.len());
    assert!(values.len() <= MANY_ROWS && values.iter().all(|v| v.len() == n));
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: as in `dot_f16`; the lengths are checked above.
        return unsafe { x86::acc_steps_f16_many(accs, n, values, steps) };
    }
    for (acc, st) in accs.chunks_exact_mut(n).zip(steps) {
        acc_steps_f16_scalar(acc, values, &st[..values.len()]);
    }
}

/// Scalar [`acc_steps_f16`].
fn acc_steps_f16_scalar(acc: &mut [f16], values: &[&[f16]], steps: &[AccStep]) {
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

/// Lanes per accumulator, accumulators, and elements per step of ggml's AVX-512 f16 dot.
const LANES: usize = 16;
const ACCS: usize = 4;
const STEP: usize = LANES * ACCS;

/// Scalar `dot_f16` with ggml's AVX-512 accumulation order.
pub fn dot_f16_scalar(x: &[f16], y: &[f16]) -> f32 {
    let x: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let y: Vec<f32> = y.iter().map(|v| v.to_f32()).collect();
    dot_widened_scalar(&x, &y)
}

/// [`dot_f16_scalar`] on widened values.
fn dot_widened_scalar(x: &[f32], y: &[f32]) -> f32 {
    let n_steps = x.len() / STEP * STEP;
    let mut acc = [[0f32; LANES]; ACCS];
    for i in (0..n_steps).step_by(STEP) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, lane) in lanes.iter_mut().enumerate() {
                let k = i + j * LANES + l;
                *lane = x[k].mul_add(y[k], *lane);
            }
        }
    }
    let mut sum = reduce(&acc) as f64;
    for k in n_steps..x.len() {
        sum += (x[k] * y[k]) as f64;
    }
    sum as f32
}

/// Σ x[i]·y[i] as llama.cpp's `tinyBLAS` (llamafile sgemm) computes it for f16 matrices in a
/// batch of two or more rows on AVX-512: one 16-lane accumulator, then `_mm512_reduce_add_ps`.
/// `x.len()` must be a multiple of 16.
pub fn dot_f16_sgemm(x: &[f16], y: &[f16]) -> f32 {
    assert_eq!(x.len(), y.len());
    assert_eq!(x.len() % LANES, 0);
    let mut acc = [0f32; LANES];
    for (xc, yc) in x.chunks_exact(LANES).zip(y.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = xc[l].to_f32().mul_add(yc[l].to_f32(), acc[l]);
        }
    }
    reduce8(&std::array::from_fn(|l| acc[8 + l] + acc[l]))
}

/// GGML_F32x16_REDUCE: the accumulators pairwise ((0+2) + (1+3)), then `_mm512_reduce_add_ps`
/// as GCC defines it: upper 8 lanes + lower 8, upper 4 + lower 4, then (0+2) + (1+3).
fn reduce(acc: &[[f32; LANES]; ACCS]) -> f32 {
    let a: [f32; LANES] =
        std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let t8: [f32; 8] = std::array::from_fn(|l| a[8 + l] + a[l]);
    reduce8(&t8)
}

/// The last steps of `_mm512_reduce_add_ps`, from 8 lanes.
fn reduce8(t8: &[f32; 8]) -> f32 {
    let t4: [f32; 4] = std::array::from_fn(|l| t8[4 + l] + t8[l]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// Values the dot products read eight at a time as f32 lanes: f16 (widened by F16C) or
    /// f32 already widened.
    trait Lanes: Copy {
        /// Eight values from `p` as f32.
        ///
        /// # Safety
        /// `p` is valid for eight values; the CPU has F16C and AVX2.
        unsafe fn load8(p: *const Self) -> __m256;
        fn widen(self) -> f32;
    }

    impl Lanes for f16 {
        #[inline(always)]
        unsafe fn load8(p: *const f16) -> __m256 {
            // SAFETY: the caller's contract.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        fn widen(self) -> f32 {
            self.to_f32()
        }
    }

    impl Lanes for f32 {
        #[inline(always)]
        unsafe fn load8(p: *const f32) -> __m256 {
            // SAFETY: the caller's contract.
            unsafe { _mm256_loadu_ps(p) }
        }
        fn widen(self) -> f32 {
            self
        }
    }

    /// # Safety
    /// Requires F16C, AVX2 and FMA; `x.len() == y.len()`.
    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn dot_f16(x: &[f16], y: &[f16]) -> f32 {
        // SAFETY: forwarded.
        unsafe { dot_ggml_order(x, y) }
    }

    /// [`dot_f16`]'s arithmetic on widened values.
    ///
    /// # Safety
    /// Requires F16C, AVX2 and FMA; `x.len() == y.len()`.
    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn dot_f16_widened(x: &[f32], y: &[f32]) -> f32 {
        // SAFETY: forwarded.
        unsafe { dot_ggml_order(x, y) }
    }

    /// Σ x[i]·y[i] in the order of ggml's AVX-512 f16 dot (see the module doc).
    ///
    /// # Safety
    /// Requires F16C, AVX2 and FMA; `x.len() == y.len()`.
    #[target_feature(enable = "f16c,avx2,fma")]
    unsafe fn dot_ggml_order<T: Lanes>(x: &[T], y: &[T]) -> f32 {
        use super::{ACCS, LANES, STEP};
        let n_steps = x.len() / STEP * STEP;
        let (px, py) = (x.as_ptr(), y.as_ptr());
        // acc[2j] and acc[2j + 1] are the lower and upper halves of ggml's 16-lane accumulator j.
        let mut acc = [_mm256_setzero_ps(); 2 * ACCS];
        let mut i = 0;
        while i < n_steps {
            for (h, a) in acc.iter_mut().enumerate() {
                // SAFETY: i + 8h + 8 <= n_steps <= len: both loads are in bounds.
                let (vx, vy) =
                    unsafe { (T::load8(px.add(i + h * 8)), T::load8(py.add(i + h * 8))) };
                *a = _mm256_fmadd_ps(vx, vy, *a);
            }
            i += STEP;
        }
        debug_assert_eq!(LANES, 16);
        let half = |h: usize| {
            _mm256_add_ps(
                _mm256_add_ps(acc[h], acc[4 + h]),
                _mm256_add_ps(acc[2 + h], acc[6 + h]),
            )
        };
        let t8 = _mm256_add_ps(half(1), half(0));
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), t8) };
        let mut sum = super::reduce8(&lanes) as f64;
        for k in n_steps..x.len() {
            sum += (x[k].widen() * y[k].widen()) as f64;
        }
        sum as f32
    }

    /// # Safety
    /// Requires F16C, AVX2 and FMA; accumulators and value rows of one length, at most four
    /// rows, one step per row for each accumulator (checked by the caller).
    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn acc_steps_f16_many(
        accs: &mut [f16],
        n: usize,
        values: &[&[f16]],
        steps: &[[super::AccStep; super::MANY_ROWS]],
    ) {
        let n8 = n / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= the length of every accumulator and value row.
            unsafe {
                let mut vx = [_mm256_setzero_ps(); 4];
                for (x, v) in vx.iter_mut().zip(values) {
                    *x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i) as *const __m128i));
                }
                for (acc, st) in accs.chunks_exact_mut(n).zip(steps) {
                    let pa = acc.as_mut_ptr().add(i) as *mut __m128i;
                    let mut a = _mm256_cvtph_ps(_mm_loadu_si128(pa));
                    for (x, st) in vx.iter().zip(st.iter()).take(values.len()) {
                        if let Some(ms) = st.rescale {
                            let r = _mm256_mul_ps(a, _mm256_set1_ps(ms));
                            a = _mm256_cvtph_ps(_mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
                        }
                        let r = _mm256_fmadd_ps(*x, _mm256_set1_ps(st.weight), a);
                        a = _mm256_cvtph_ps(_mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
                    }
                    _mm_storeu_si128(pa, _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
                }
            }
            i += 8;
        }
        if n8 < n {
            let tails: Vec<&[f16]> = values.iter().map(|v| &v[n8..]).collect();
            for (acc, st) in accs.chunks_exact_mut(n).zip(steps) {
                super::acc_steps_f16_scalar(&mut acc[n8..], &tails, &st[..values.len()]);
            }
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
        // Leftovers as the scalar path computes them (one FMA, as the vector lanes).
        super::mad_f16_scalar(&mut y[n8..], &x[n8..], v);
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

    /// The emulated reduction orders against an exact sum: both are the f64 sum to f32 rounding
    /// of a few partial sums, and differ from each other as ggml's kernels do.
    #[test]
    fn sgemm_order_is_a_close_sum() {
        for n in [16, 64, 256, 320] {
            let (x, y) = vecs(n, 3 + n as u32);
            let want: f64 = x.iter().zip(&y).map(|(a, b)| a.to_f64() * b.to_f64()).sum();
            let got = dot_f16_sgemm(&x, &y) as f64;
            assert!((got - want).abs() < 1e-3 * (1.0 + want.abs()), "n={n}");
        }
    }

    /// The dispatched (SIMD where the CPU has it) multiply-adds give the scalar paths' bits,
    /// tails included.
    #[test]
    fn mad_and_acc_steps_simd_equal_scalar() {
        let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let steps = [
            AccStep {
                rescale: Some(0.83),
                weight: 0.61,
            },
            AccStep {
                rescale: None,
                weight: -1.7,
            },
            AccStep {
                rescale: Some(0.37),
                weight: 0.0123,
            },
        ];
        for n in [1, 3, 7, 8, 9, 15, 16, 31, 64, 67, 128, 259] {
            let (x, y) = vecs(n, 11 + n as u32);
            for v in [0.37f32, -2.9, 1e-3, 123.4] {
                let (mut got, mut want) = (y.clone(), y.clone());
                mad_f16(&mut got, &x, v);
                mad_f16_scalar(&mut want, &x, v);
                assert_eq!(bits(&got), bits(&want), "mad_f16 n={n} v={v}");
            }
            let rows: Vec<Vec<f16>> = (0..3).map(|k| vecs(n, 40 + k).0).collect();
            let vals: Vec<&[f16]> = rows.iter().map(|r| r.as_slice()).collect();
            let (mut got, mut want) = (y.clone(), y.clone());
            acc_steps_f16(&mut got, &vals, &steps);
            acc_steps_f16_scalar(&mut want, &vals, &steps);
            assert_eq!(bits(&got), bits(&want), "acc_steps_f16 n={n}");
        }
    }

    /// The widened dot and the many-accumulator steps give the bits of the f16 ones.
    #[test]
    fn widened_dot_and_many_accumulators_have_the_f16_bits() {
        let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for n in [1, 7, 8, 40, 64, 67, 128, 256, 259] {
            let (x, y) = vecs(n, 5 + n as u32);
            let (mut xw, mut yw) = (vec![0f32; n], vec![0f32; n]);
            widen(&mut xw, &x);
            widen(&mut yw, &y);
            assert_eq!(
                dot_f16_widened(&xw, &yw).to_bits(),
                dot_f16(&x, &y).to_bits(),
                "n={n}"
            );
            assert_eq!(
                dot_widened_scalar(&xw, &yw).to_bits(),
                dot_f16(&x, &y).to_bits()
            );
            let rows: Vec<Vec<f16>> = (0..4).map(|k| vecs(n, 60 + k).0).collect();
            for g in 1..=4 {
                let vals: Vec<&[f16]> = rows[..g].iter().map(|r| r.as_slice()).collect();
                let steps: Vec<[AccStep; MANY_ROWS]> = (0..3)
                    .map(|h| {
                        std::array::from_fn(|k| AccStep {
                            rescale: ((h + k) % 3 == 1).then_some(0.3 + 0.1 * k as f32),
                            weight: 0.9 - 0.2 * (h * g + k) as f32,
                        })
                    })
                    .collect();
                let accs: Vec<Vec<f16>> = (0..3).map(|h| vecs(n, 90 + h).1).collect();
                let mut want = accs.clone();
                for (w, st) in want.iter_mut().zip(&steps) {
                    acc_steps_f16(w, &vals, &st[..g]);
                }
                let mut flat: Vec<f16> = accs.concat();
                acc_steps_f16_many(&mut flat, n, &vals, &steps);
                assert_eq!(bits(&flat), bits(&want.concat()), "n={n} g={g}");
            }
        }
    }

    #[test]
    fn simd_and_scalar_agree_exactly() {
        for n in [32, 64, 256, 40, 7, 0, 128, 100, 320] {
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
