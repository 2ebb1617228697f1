//! 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against Q8_0 / Q8_1 activations.

use std::arch::x86_64::*;

use super::helpers::*;

/// Four f16 values `stride` bytes apart, as four f32 (composed in a general register, one
/// conversion for all four).
#[inline(always)]
pub(super) unsafe fn f16x4(p: *const u8, stride: usize) -> __m128 {
    unsafe {
        let bits = rd16(p) as u64
            | (rd16(p.add(stride)) as u64) << 16
            | (rd16(p.add(2 * stride)) as u64) << 32
            | (rd16(p.add(3 * stride)) as u64) << 48;
        _mm_cvtph_ps(_mm_cvtsi64_si128(bits as i64))
    }
}

/// Signed 8-bit weights (Q4_0, Q5_0, Q8_0 after unpacking) against Q8_0 activations.
///
/// Blocks go four at a time: the four weight scales and, per activation row, the four
/// activation scales are converted with one instruction each and multiplied as vectors; each
/// block then broadcasts its lane. The arithmetic per block is unchanged (`dw · dx` rounded to
/// f32, then one FMA into the row's accumulator), so results are bit-identical
/// to converting the scales one block at a time.
#[inline(always)]
pub(super) unsafe fn dot_signed_q8_0<
    const VNNI: bool,
    const NX: usize,
    const WB: usize,
    const BLOCK_SUMS: bool,
>(
    nb: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    out: *mut f32,
    unpack: impl Fn(*const u8) -> __m256i,
) {
    unsafe {
        // One accumulator per activation row, blocks added in order: ggml's
        // `ggml_vec_dot_q8_0_q8_0` order, so sums are the same bits as the reference's.
        let mut acc = [_mm256_setzero_ps(); NX];
        if BLOCK_SUMS {
            // ggml's repacked Q4_0 kernels: each block's integer sum, then one FMA.
            let mut acc = [0f32; NX];
            for i in 0..nb {
                let wb = w.add(i * WB);
                let dw = f16(wb);
                let qw = unpack(wb);
                let ax = _mm256_sign_epi8(qw, qw);
                for (k, a) in acc.iter_mut().enumerate() {
                    let xb = x.add(k * stride + i * 34);
                    let p = mul_sum_us8::<VNNI>(ax, _mm256_sign_epi8(load256(xb.add(2)), qw));
                    let s = hsum_epi32_128(_mm_add_epi32(
                        _mm256_castsi256_si128(p),
                        _mm256_extracti128_si256::<1>(p),
                    ));
                    *a = (s as f32).mul_add(dw * f16(xb), *a);
                }
            }
            for (k, a) in acc.iter().enumerate() {
                *out.add(k) = *a;
            }
            return;
        }
        macro_rules! block {
            ($i:expr, $acc:expr) => {{
                let i = $i;
                let wb = w.add(i * WB);
                let dw = f16(wb);
                let qw = unpack(wb);
                let ax = _mm256_sign_epi8(qw, qw);
                for k in 0..NX {
                    let xb = x.add(k * stride + i * 34);
                    let qx = load256(xb.add(2));
                    let p = mul_sum_us8::<VNNI>(ax, _mm256_sign_epi8(qx, qw));
                    let d = _mm256_set1_ps(dw * f16(xb));
                    $acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), $acc[k]);
                }
            }};
        }
        macro_rules! block_of4 {
            ($i:expr, $b:literal, $d:expr, $acc:expr) => {{
                let i = $i + $b;
                let qw = unpack(w.add(i * WB));
                let ax = _mm256_sign_epi8(qw, qw);
                for k in 0..NX {
                    let qx = load256(x.add(k * stride + i * 34 + 2));
                    let p = mul_sum_us8::<VNNI>(ax, _mm256_sign_epi8(qx, qw));
                    let d = _mm256_permute_ps::<{ $b * 0x55 }>($d[k]);
                    $acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), $acc[k]);
                }
            }};
        }
        let mut i = 0;
        while i + 4 <= nb {
            _mm_prefetch::<_MM_HINT_T0>(w.add(i * WB + PREFETCH) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(w.add(i * WB + PREFETCH + 64) as *const i8);
            let dw = f16x4(w.add(i * WB), WB);
            let mut d = [_mm256_setzero_ps(); NX];
            for k in 0..NX {
                let d4 = _mm_mul_ps(dw, f16x4(x.add(k * stride + i * 34), 34));
                d[k] = _mm256_set_m128(d4, d4);
            }
            block_of4!(i, 0, d, acc);
            block_of4!(i, 1, d, acc);
            block_of4!(i, 2, d, acc);
            block_of4!(i, 3, d, acc);
            i += 4;
        }
        while i < nb {
            block!(i, acc);
            i += 1;
        }
        for k in 0..NX {
            *out.add(k) = hsum_ps(acc[k]);
        }
    }
}

/// Unsigned weights with a min (Q4_1, Q5_1) against Q8_1 activations.
#[inline(always)]
pub(super) unsafe fn dot_unsigned_q8_1<const VNNI: bool, const NX: usize, const WB: usize>(
    nb: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    out: *mut f32,
    unpack: impl Fn(*const u8) -> __m256i,
) {
    unsafe {
        let mut acc = [_mm256_setzero_ps(); NX];
        let mut summs = [0f32; NX];
        for i in 0..nb {
            let wb = w.add(i * WB);
            let dw = f16(wb);
            let mw = f16(wb.add(2));
            let qw = unpack(wb);
            for k in 0..NX {
                let xb = x.add(k * stride + i * 36);
                let qx = load256(xb.add(4));
                let p = mul_sum_us8::<VNNI>(qw, qx);
                let d = _mm256_set1_ps(dw * f16(xb));
                acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[k]);
                // GCC contracts ggml's `summs += m * s` into an FMA.
                summs[k] = mw.mul_add(f16(xb.add(2)), summs[k]);
            }
        }
        for k in 0..NX {
            *out.add(k) = hsum_ps(acc[k]) + summs[k];
        }
    }
}

#[inline(always)]
pub(super) unsafe fn q4_0<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe { q4_0_impl::<VNNI, NX, false>(n, w, x, s, out) }
}

/// Q4_0 with the arithmetic of ggml's repacked (8×8 interleaved) Q4_0 kernels.
#[inline(always)]
pub(super) unsafe fn q4_0_block_sums<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe { q4_0_impl::<VNNI, NX, true>(n, w, x, s, out) }
}

#[inline(always)]
pub(super) unsafe fn q4_0_impl<const VNNI: bool, const NX: usize, const BLOCK_SUMS: bool>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_signed_q8_0::<VNNI, NX, 18, BLOCK_SUMS>(
            n / 32,
            w,
            x,
            s,
            out,
            #[inline(always)]
            |b| _mm256_sub_epi8(nibbles32(b.add(2)), _mm256_set1_epi8(8)),
        )
    }
}

#[inline(always)]
pub(super) unsafe fn q5_0<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_signed_q8_0::<VNNI, NX, 22, false>(
            n / 32,
            w,
            x,
            s,
            out,
            #[inline(always)]
            |b| {
                // nibble | (hbit ? 0 : 0xF0) is (q5 - 16) as i8.
                let hi =
                    _mm256_andnot_si256(bits32(rd32(b.add(2))), _mm256_set1_epi8(0xF0u8 as i8));
                _mm256_or_si256(nibbles32(b.add(6)), hi)
            },
        )
    }
}

#[inline(always)]
pub(super) unsafe fn q8_0<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_signed_q8_0::<VNNI, NX, 34, false>(
            n / 32,
            w,
            x,
            s,
            out,
            #[inline(always)]
            |b| load256(b.add(2)),
        )
    }
}

#[inline(always)]
pub(super) unsafe fn q4_1<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_unsigned_q8_1::<VNNI, NX, 20>(
            n / 32,
            w,
            x,
            s,
            out,
            #[inline(always)]
            |b| nibbles32(b.add(4)),
        )
    }
}

#[inline(always)]
pub(super) unsafe fn q5_1<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_unsigned_q8_1::<VNNI, NX, 24>(
            n / 32,
            w,
            x,
            s,
            out,
            #[inline(always)]
            |b| {
                let hi = _mm256_and_si256(bits32(rd32(b.add(4))), _mm256_set1_epi8(0x10));
                _mm256_or_si256(nibbles32(b.add(8)), hi)
            },
        )
    }
}

/// Q8_0 weights × Q8_0 activation rows whose block scales are already f32: block `i` of row
/// `k` has scale `xs[k * xs_stride + i]` (the f16 scale of the block, converted; its `d` bytes
/// are not read). Same arithmetic as [`dot_signed_q8_0`], so bit-identical results, without
/// converting the activation scales again for every weight row (the prefill path).
///
/// # Safety
/// [`DotFn`] contract for Q8_0, plus `xs` readable for `(nx - 1) * xs_stride + n / 32` floats;
/// AVX2/FMA/F16C present.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_q8_0_xs(
    n: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    xs: *const f32,
    xs_stride: usize,
    nx: usize,
    out: *mut f32,
) {
    unsafe {
        match nx {
            1 => q8_0_xs::<1>(n / 32, w, x, stride, xs, xs_stride, out),
            2 => q8_0_xs::<2>(n / 32, w, x, stride, xs, xs_stride, out),
            3 => q8_0_xs::<3>(n / 32, w, x, stride, xs, xs_stride, out),
            _ => q8_0_xs::<4>(n / 32, w, x, stride, xs, xs_stride, out),
        }
    }
}

#[inline(always)]
pub(super) unsafe fn q8_0_xs<const NX: usize>(
    nb: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    xs: *const f32,
    xs_stride: usize,
    out: *mut f32,
) {
    unsafe {
        // One accumulator per activation row, blocks added in order: ggml's
        // `ggml_vec_dot_q8_0_q8_0` order, so sums are the same bits as the reference's.
        let mut acc = [_mm256_setzero_ps(); NX];
        macro_rules! block {
            ($i:expr, $acc:expr) => {{
                let i = $i;
                let wb = w.add(i * 34);
                let dw = f16(wb);
                let qw = load256(wb.add(2));
                let ax = _mm256_sign_epi8(qw, qw);
                for k in 0..NX {
                    let qx = load256(x.add(k * stride + i * 34 + 2));
                    let p = mul_sum_us8::<false>(ax, _mm256_sign_epi8(qx, qw));
                    let d = _mm256_set1_ps(dw * *xs.add(k * xs_stride + i));
                    $acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), $acc[k]);
                }
            }};
        }
        macro_rules! block_of4 {
            ($i:expr, $b:literal, $d:expr, $acc:expr) => {{
                let i = $i + $b;
                let qw = load256(w.add(i * 34 + 2));
                let ax = _mm256_sign_epi8(qw, qw);
                for k in 0..NX {
                    let qx = load256(x.add(k * stride + i * 34 + 2));
                    let p = mul_sum_us8::<false>(ax, _mm256_sign_epi8(qx, qw));
                    let d = _mm256_permute_ps::<{ $b * 0x55 }>($d[k]);
                    $acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), $acc[k]);
                }
            }};
        }
        let mut i = 0;
        while i + 4 <= nb {
            let dw = f16x4(w.add(i * 34), 34);
            let mut d = [_mm256_setzero_ps(); NX];
            for k in 0..NX {
                let d4 = _mm_mul_ps(dw, _mm_loadu_ps(xs.add(k * xs_stride + i)));
                d[k] = _mm256_set_m128(d4, d4);
            }
            block_of4!(i, 0, d, acc);
            block_of4!(i, 1, d, acc);
            block_of4!(i, 2, d, acc);
            block_of4!(i, 3, d, acc);
            i += 4;
        }
        while i < nb {
            block!(i, acc);
            i += 1;
        }
        for k in 0..NX {
            *out.add(k) = hsum_ps(acc[k]);
        }
    }
}

/// Q4_0 / Q5_0 row → Q8_0 row (same scales, same integers), `nb` blocks.
///
/// # Safety
/// `src` readable for `nb` blocks of `ty`, `dst` writable for `nb * 34` bytes; AVX2 present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn unpack_to_q8_0(
    ty: crate::quant::GgmlType,
    nb: usize,
    src: *const u8,
    dst: *mut u8,
) -> bool {
    // SAFETY: forwarded.
    unsafe { unpack_q8_0_blocks::<false>(ty, nb, src, dst) }
}

/// The rows of [`unpack_to_q8_0`], or with `BIASED` each integer stored as `q ^ 0x80` (and
/// Q8_0 rows taken too, copied so): the weights of `super::q8_0_biased`. False, writing
/// nothing, for another type.
///
/// # Safety
/// As [`unpack_to_q8_0`]; the caller has AVX2.
#[inline(always)]
pub(super) unsafe fn unpack_q8_0_blocks<const BIASED: bool>(
    ty: crate::quant::GgmlType,
    nb: usize,
    src: *const u8,
    dst: *mut u8,
) -> bool {
    // SAFETY: forwarded; the closures read one block of `ty` at `b`.
    unsafe {
        match ty {
            crate::quant::GgmlType::Q4_0 => copy_blocks::<BIASED>(nb, src, dst, 18, |b| {
                _mm256_sub_epi8(nibbles32(b.add(2)), _mm256_set1_epi8(8))
            }),
            crate::quant::GgmlType::Q5_0 => copy_blocks::<BIASED>(nb, src, dst, 22, |b| {
                let hi =
                    _mm256_andnot_si256(bits32(rd32(b.add(2))), _mm256_set1_epi8(0xF0u8 as i8));
                _mm256_or_si256(nibbles32(b.add(6)), hi)
            }),
            crate::quant::GgmlType::Q8_0 if BIASED => {
                copy_blocks::<BIASED>(nb, src, dst, 34, |b| load256(b.add(2)))
            }
            _ => return false,
        }
    }
    true
}

/// [`unpack_q8_0_blocks`]' loop for one type: `values` reads a block's 32 integers (a closure
/// inlined here, so that its intrinsics take the caller's features; a function pointer would
/// make each of them a call).
///
/// # Safety
/// As [`unpack_q8_0_blocks`], with `wb` the type's block bytes.
#[inline(always)]
unsafe fn copy_blocks<const BIASED: bool>(
    nb: usize,
    src: *const u8,
    dst: *mut u8,
    wb: usize,
    values: impl Fn(*const u8) -> __m256i,
) {
    // SAFETY: block i < nb: `wb` bytes at src + i·wb, 34 at dst + i·34 (the caller's contract).
    unsafe {
        let flip = _mm256_set1_epi8(0x80u8 as i8);
        for i in 0..nb {
            let b = src.add(i * wb);
            let y = dst.add(i * 34);
            (y as *mut u16).write_unaligned(rd16(b));
            let q = if BIASED {
                _mm256_xor_si256(values(b), flip)
            } else {
                values(b)
            };
            _mm256_storeu_si256(y.add(2) as *mut __m256i, q);
        }
    }
}
