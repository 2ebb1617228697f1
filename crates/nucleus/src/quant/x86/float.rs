//! Float types (F32, F16, BF16).

use std::arch::x86_64::*;

use super::helpers::*;

/// F32 as ggml's AVX-512 `ggml_vec_dot_f32`: four 16-lane FMA accumulators over steps of 64
/// (each two 8-lane registers here), reduced (0+2) + (1+3) and then as `_mm512_reduce_add_ps`,
/// the last `n mod 64` products folded in with FMAs (GCC contracts `sumf += x[i]*y[i]`).
#[inline(always)]
pub(super) unsafe fn f32_<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        let (w, steps) = (w as *const f32, n / 64 * 64);
        for k in 0..NX {
            let xr = x.add(k * s) as *const f32;
            let mut acc = [[_mm256_setzero_ps(); 2]; 4];
            for i in (0..steps).step_by(64) {
                for (j, a) in acc.iter_mut().enumerate() {
                    for (h, r) in a.iter_mut().enumerate() {
                        let at = i + 16 * j + 8 * h;
                        let (wv, xv) = (_mm256_loadu_ps(w.add(at)), _mm256_loadu_ps(xr.add(at)));
                        *r = _mm256_fmadd_ps(wv, xv, *r);
                    }
                }
            }
            let pair = |a: [__m256; 2], b: [__m256; 2]| {
                [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])]
            };
            let total = pair(pair(acc[0], acc[2]), pair(acc[1], acc[3]));
            let mut sum = reduce_add_16(&total);
            for e in steps..n {
                sum = w
                    .add(e)
                    .read_unaligned()
                    .mul_add(xr.add(e).read_unaligned(), sum);
            }
            *out.add(k) = sum;
        }
    }
}

/// F32 as llama.cpp's sgemm computes batches of two or more rows on AVX-512: one 16-lane FMA
/// accumulator over steps of 16, then `_mm512_reduce_add_ps`. `n` is a multiple of 16.
#[inline(always)]
pub(super) unsafe fn f32_sgemm<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    // SAFETY: forwarded; eight f32 (32 bytes) at element `at`.
    unsafe {
        sgemm::<NX>(n, w, x, s, out, |p, at| {
            _mm256_loadu_ps((p as *const f32).add(at))
        })
    }
}

/// F16 as llama.cpp's sgemm computes batches of two or more rows: [`f32_sgemm`] on the widened
/// values. `n` is a multiple of 16.
#[inline(always)]
pub(super) unsafe fn f16_sgemm<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    // SAFETY: forwarded; eight f16 (16 bytes) at element `at`.
    unsafe {
        sgemm::<NX>(n, w, x, s, out, |p, at| {
            _mm256_cvtph_ps(_mm_loadu_si128(
                (p as *const half::f16).add(at) as *const __m128i
            ))
        })
    }
}

/// The body of [`f32_sgemm`] and [`f16_sgemm`]: `load8(row, at)` gives elements `at..at + 8` of
/// a row as f32.
#[inline(always)]
unsafe fn sgemm<const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
    load8: impl Fn(*const u8, usize) -> __m256,
) {
    unsafe {
        for k in 0..NX {
            let xr = x.add(k * s);
            let mut acc = [_mm256_setzero_ps(); 2];
            for i in (0..n / 16 * 16).step_by(16) {
                for (h, r) in acc.iter_mut().enumerate() {
                    let at = i + 8 * h;
                    *r = _mm256_fmadd_ps(load8(w, at), load8(xr, at), *r);
                }
            }
            *out.add(k) = reduce_add_16(&acc);
        }
    }
}

#[inline(always)]
pub(super) unsafe fn f16_<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    // ggml's `ggml_vec_dot_f16`, in the summation order of its AVX-512 build.
    unsafe {
        let wr = std::slice::from_raw_parts(w as *const half::f16, n);
        for k in 0..NX {
            let xr = std::slice::from_raw_parts(x.add(k * s) as *const half::f16, n);
            *out.add(k) = crate::kernels::f16::dot_f16(wr, xr);
        }
    }
}

/// BF16 as ggml computes it on a CPU with AVX512-BF16 (see `scalar::dot_bf16`): two 16-lane
/// `vdpbf16ps` accumulators over steps of 64, each reduced as `_mm512_reduce_add_ps`, summed in
/// f64 with the tail. Each 16-lane accumulator is two 8-lane registers here.
#[inline(always)]
pub(super) unsafe fn bf16_<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        let steps = n / 64 * 64;
        for k in 0..NX {
            let xr = x.add(k * s);
            let mut acc = [[_mm256_setzero_ps(); 2]; 2];
            for i in (0..steps).step_by(64) {
                for (j, a) in acc.iter_mut().enumerate() {
                    let at = 2 * (i + 32 * j);
                    dpbf16_32(a, w.add(at), xr.add(at));
                }
            }
            let mut sum = 0f64;
            for a in &acc {
                sum += reduce_add_16(a) as f64;
            }
            for e in steps..n {
                let wv = f32::from_bits((rd16(w.add(2 * e)) as u32) << 16);
                let xv = f32::from_bits((rd16(xr.add(2 * e)) as u32) << 16);
                sum += (wv * xv) as f64;
            }
            *out.add(k) = sum as f32;
        }
    }
}

/// BF16 as llama.cpp's sgemm computes batches of two or more rows on a CPU with AVX512-BF16:
/// one 16-lane `vdpbf16ps` accumulator over steps of 32, then `_mm512_reduce_add_ps`.
/// `n` is a multiple of 32.
#[inline(always)]
pub(super) unsafe fn bf16_sgemm<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        for k in 0..NX {
            let xr = x.add(k * s);
            let mut acc = [_mm256_setzero_ps(); 2];
            for i in (0..n / 32 * 32).step_by(32) {
                dpbf16_32(&mut acc, w.add(2 * i), xr.add(2 * i));
            }
            *out.add(k) = reduce_add_16(&acc);
        }
    }
}

/// One `vdpbf16ps` on 16 lanes (two registers) over 32 bf16 values at `w` and `x`: lane j gets
/// fma(w[2j+1], x[2j+1]) and then fma(w[2j], x[2j]) added, denormal inputs and results flushed
/// to zero.
#[inline(always)]
pub(super) unsafe fn dpbf16_32(acc: &mut [__m256; 2], w: *const u8, x: *const u8) {
    unsafe {
        let hi = _mm256_set1_epi32(0xffff_0000u32 as i32);
        for (h, a) in acc.iter_mut().enumerate() {
            let wd = load256(w.add(32 * h));
            let xd = load256(x.add(32 * h));
            let odd = |d| _mm256_castsi256_ps(_mm256_and_si256(d, hi));
            let even = |d| _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
            *a = flush_denormals(_mm256_fmadd_ps(
                flush_denormals(odd(wd)),
                flush_denormals(odd(xd)),
                *a,
            ));
            *a = flush_denormals(_mm256_fmadd_ps(
                flush_denormals(even(wd)),
                flush_denormals(even(xd)),
                *a,
            ));
        }
    }
}

/// Denormals to zero of the same sign.
#[inline(always)]
pub(super) unsafe fn flush_denormals(v: __m256) -> __m256 {
    unsafe {
        let exp = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7f80_0000)));
        let denormal = _mm256_cmp_ps::<_CMP_EQ_OQ>(exp, _mm256_setzero_ps());
        _mm256_blendv_ps(v, _mm256_and_ps(v, _mm256_set1_ps(-0.0)), denormal)
    }
}

/// `_mm512_reduce_add_ps` as GCC defines it, for 16 lanes held as two registers: upper 8 lanes
/// + lower 8, upper 4 + lower 4, then (0+2) + (1+3).
#[inline(always)]
pub(super) unsafe fn reduce_add_16(acc: &[__m256; 2]) -> f32 {
    unsafe {
        let t8 = _mm256_add_ps(acc[1], acc[0]);
        let t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
        let mut l = [0f32; 4];
        _mm_storeu_ps(l.as_mut_ptr(), t4);
        (l[0] + l[2]) + (l[1] + l[3])
    }
}
