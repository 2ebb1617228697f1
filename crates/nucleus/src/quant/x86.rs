//! x86-64 SIMD dot kernels (AVX2 and AVX-512).
//!
//! Each kernel body is an `#[inline(always)]` generic function that is instantiated inside
//! `#[target_feature]` entry points, once per level (AVX2; AVX-512 F/BW/VL; AVX-512 + VNNI). The
//! 8-bit products use `vpmaddubsw` + `vpmaddwd` (AVX2) or `vpdpbusd` (VNNI). Each kernel takes up
//! to four activation rows (`NX`) and unpacks the weight block once for all of them.
//!
//! Safety: every function here is `unsafe` and relies on the [`DotFn`] contract: the pointers
//! cover whole rows, and the CPU has the features of the entry point (the dispatch table for a
//! level is only used after `is_x86_feature_detected!` confirmed them).

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::dispatch::{DotFn, Kernels, SimdLevel};

// ---------------------------------------------------------------------------------------------
// Small helpers. All are `#[inline(always)]` so that they are compiled inside the
// target-feature entry points that call them.

#[inline(always)]
unsafe fn rd16(p: *const u8) -> u16 {
    // SAFETY: caller guarantees 2 readable bytes at `p`; unaligned read.
    unsafe { (p as *const u16).read_unaligned() }
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> u32 {
    // SAFETY: caller guarantees 4 readable bytes at `p`; unaligned read.
    unsafe { (p as *const u32).read_unaligned() }
}

#[inline(always)]
unsafe fn f16(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes at `p` (caller); F16C present (entry-point features).
    // A broadcast (not `movd`/`pinsrw` into a live register) avoids a false dependency on
    // whatever register the compiler would merge into, which serialized the block loops.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(rd16(p) as i16))) }
}

#[inline(always)]
unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: 32 readable bytes at `p` (caller); unaligned load.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

#[inline(always)]
unsafe fn load128(p: *const u8) -> __m128i {
    // SAFETY: 16 readable bytes at `p` (caller); unaligned load.
    unsafe { _mm_loadu_si128(p as *const __m128i) }
}

#[inline(always)]
unsafe fn hsum_ps(v: __m256) -> f32 {
    unsafe {
        let mut r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
        r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }
}

/// Σ pairs of u8 × i8 products → 8 × i32 (u ≤ 127 or the pair sums stay below 2^15).
#[inline(always)]
unsafe fn mul_sum_us8<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
    unsafe {
        if VNNI {
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
        } else {
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
        }
    }
}

/// 32 nibbles → 32 bytes: low nibbles of the 16 bytes first, then the high nibbles.
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    unsafe {
        // Both lanes load the 16 bytes (a broadcast load); the upper lane shifts by 4.
        let t = _mm256_broadcastsi128_si256(load128(p));
        let b = _mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0));
        _mm256_and_si256(b, _mm256_set1_epi8(0xF))
    }
}

/// 32 bits → 32 bytes of 0xFF (bit set) or 0x00; byte `j` is bit `j`.
#[inline(always)]
unsafe fn bits32(x: u32) -> __m256i {
    unsafe {
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0x0000000000000000,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }
}

// ---------------------------------------------------------------------------------------------
// 32-element block formats against Q8_0 / Q8_1.

/// How far ahead of the current block the weight stream is prefetched, in bytes.
const PREFETCH: usize = 2048;

/// Four f16 values `stride` bytes apart, as four f32 (composed in a general register, one
/// conversion for all four).
#[inline(always)]
unsafe fn f16x4(p: *const u8, stride: usize) -> __m128 {
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
unsafe fn dot_signed_q8_0<
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
unsafe fn dot_unsigned_q8_1<const VNNI: bool, const NX: usize, const WB: usize>(
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
unsafe fn q4_0<const VNNI: bool, const NX: usize>(
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
unsafe fn q4_0_block_sums<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe { q4_0_impl::<VNNI, NX, true>(n, w, x, s, out) }
}

#[inline(always)]
unsafe fn q4_0_impl<const VNNI: bool, const NX: usize, const BLOCK_SUMS: bool>(
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
unsafe fn q5_0<const VNNI: bool, const NX: usize>(
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
unsafe fn q8_0<const VNNI: bool, const NX: usize>(
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
unsafe fn q4_1<const VNNI: bool, const NX: usize>(
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
unsafe fn q5_1<const VNNI: bool, const NX: usize>(
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
unsafe fn q8_0_xs<const NX: usize>(
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
    ty: super::GgmlType,
    nb: usize,
    src: *const u8,
    dst: *mut u8,
) -> bool {
    unsafe {
        let (wb, f): (usize, fn(*const u8) -> __m256i) = match ty {
            super::GgmlType::Q4_0 => (18, |b| {
                _mm256_sub_epi8(nibbles32(b.add(2)), _mm256_set1_epi8(8))
            }),
            super::GgmlType::Q5_0 => (22, |b| {
                let hi =
                    _mm256_andnot_si256(bits32(rd32(b.add(2))), _mm256_set1_epi8(0xF0u8 as i8));
                _mm256_or_si256(nibbles32(b.add(6)), hi)
            }),
            _ => return false,
        };
        for i in 0..nb {
            let b = src.add(i * wb);
            let y = dst.add(i * 34);
            (y as *mut u16).write_unaligned(rd16(b));
            _mm256_storeu_si256(y.add(2) as *mut __m256i, f(b));
        }
        true
    }
}

// ---------------------------------------------------------------------------------------------
// K-quants against Q8_K (d f32 at 0, qs at 4, bsums at 260).

/// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block as two u32x2 (ggml's `utmp` trick):
/// returns [scales0..3, scales4..7, mins0..3, mins4..7] as little-endian u32 words.
#[inline(always)]
unsafe fn k4_scales(sc: *const u8) -> [u32; 4] {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    unsafe {
        let mut u = [rd32(sc), rd32(sc.add(4)), rd32(sc.add(8)), 0];
        u[3] = ((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4);
        let uaux = u[1] & KMASK1;
        u[1] = (u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4);
        u[2] = uaux;
        u[0] &= KMASK1;
        u
    }
}

/// Shuffle picking i16 word `i` of each 128-bit lane into all 8 words of that lane (loaded
/// from a table: building it with byte inserts cost more than the dot products it serves).
#[inline(always)]
unsafe fn word_bcast_mask(i: usize) -> __m256i {
    const MASKS: [[u8; 32]; 8] = {
        let mut m = [[0u8; 32]; 8];
        let mut i = 0;
        while i < 8 {
            let mut b = 0;
            while b < 32 {
                m[i][b] = (2 * i + b % 2) as u8;
                b += 1;
            }
            i += 1;
        }
        m
    };
    unsafe { _mm256_loadu_si256(MASKS[i].as_ptr() as *const __m256i) }
}

/// ggml's reduction of a 4-lane accumulator: (0+2) + (1+3).
#[inline(always)]
unsafe fn hsum_ps128(r: __m128) -> f32 {
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// Sum of the four i32 lanes (exact).
#[inline(always)]
unsafe fn hsum_epi32_128(v: __m128i) -> i32 {
    let v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b01_00_11_10));
    let v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b10_11_00_01));
    _mm_cvtsi128_si32(v)
}

/// How a K-quant dot folds its integer sums into floats (see [`dot_k4_like`]).
const LANES: u8 = 0;
const BLOCK_SUMS: u8 = 1;
const PAIR_SUMS: u8 = 2;
const LANES_MIN_LANES: u8 = 3;
const TILED: u8 = 4;

/// Shared by Q4_K and Q5_K: `qbits(j)` gives the unsigned low/high 32-element vectors of
/// sub-block pair `j` (0..4). `MODE` picks the float arithmetic:
/// - `LANES` (Q5_K): ggml's `vec_dot_q5_K_q8_K` order, 8 integer lanes per block each scaled into
///   an 8-lane accumulator, each block's min sum into a scalar one (`summs`).
/// - `BLOCK_SUMS` (Q4_K, one row): llama.cpp's repacked Q4_K gemv, which it uses for every Q4_K
///   matrix with a multiple of 8 rows on AVX2 machines: each block's integer sums reduced to one
///   integer, then `acc += isum·(d·dy)` and `acc_min += imin·(dmin·dy)` with one FMA each, and
///   the result is `acc − acc_min`.
/// - `PAIR_SUMS` (Q4_K, a prompt's rows in groups of four): the repacked gemm, the same but with
///   one FMA per sub-block pair.
/// - `LANES_MIN_LANES` (Q4_K not repacked, one row): ggml's `vec_dot_q4_K_q8_K`, as `LANES` but
///   the min sums' 4 lanes into a 4-lane accumulator (−dmin·dy), reduced (0+2) + (1+3).
/// - `TILED` (Q5_K, and Q4_K not repacked, in a prompt of 8+ rows): llama.cpp's tiled kernel,
///   per block r = isum·d − dmin·imin (one FMA) and acc += r·dy (one FMA).
#[inline(always)]
unsafe fn dot_k4_like<const NX: usize, const WB: usize, const MODE: u8>(
    nb: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    out: *mut f32,
    qbits: impl Fn(*const u8, usize) -> (__m256i, __m256i),
) {
    unsafe {
        let mut acc = [_mm256_setzero_ps(); NX];
        let mut acc_s = [0f32; NX];
        let mut acc_ms = [0f32; NX];
        let mut acc_m4 = [_mm_setzero_ps(); NX];
        // PAIR_SUMS keeps row k's two accumulators in lane k of these (the same FMAs per row,
        // four rows per instruction).
        let (mut acc4, mut acc_min4) = (_mm_setzero_ps(), _mm_setzero_ps());
        for i in 0..nb {
            let wb = w.add(i * WB);
            for l in (0..WB).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + l) as *const i8);
            }
            let d = f16(wb);
            let dmin = f16(wb.add(2));
            let u = k4_scales(wb.add(4));
            let ms = _mm256_cvtepu8_epi16(_mm_set_epi32(
                u[3] as i32,
                u[2] as i32,
                u[1] as i32,
                u[0] as i32,
            ));
            let mins = _mm256_extracti128_si256(ms, 1);
            let scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(ms));
            let mut sumi = [_mm256_setzero_si256(); NX];
            // PAIR_SUMS and TILED: row k's min sums of the sub-block pairs (lane j).
            let mut pair_mins = [_mm_setzero_si128(); 4];
            for k in 0..NX {
                let xb = x.add(k * stride + i * 292);
                let bs = load256(xb.add(260));
                let q8s =
                    _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
                let prod = _mm_madd_epi16(mins, q8s);
                let dy = (xb as *const f32).read_unaligned();
                match MODE {
                    LANES => {
                        // ggml: summs += (−dmin·dy)·Σmins, contracted into an FMA by GCC.
                        let imin = hsum_epi32_128(prod) as f32;
                        acc_ms[k] = (-(dmin * dy)).mul_add(imin, acc_ms[k])
                    }
                    BLOCK_SUMS => {
                        acc_ms[k] = (hsum_epi32_128(prod) as f32).mul_add(dmin * dy, acc_ms[k])
                    }
                    LANES_MIN_LANES => {
                        acc_m4[k] = _mm_fmadd_ps(
                            _mm_set1_ps(-(dmin * dy)),
                            _mm_cvtepi32_ps(prod),
                            acc_m4[k],
                        )
                    }
                    // PAIR_SUMS: per pair (lane j), TILED: the block's; folded in below.
                    _ => pair_mins[k] = prod,
                }
            }
            let (mut d4, mut dmin4) = ([0f32; 4], [0f32; 4]);
            if MODE == PAIR_SUMS {
                for k in 0..NX {
                    let dy = (x.add(k * stride + i * 292) as *const f32).read_unaligned();
                    (d4[k], dmin4[k]) = (d * dy, dmin * dy);
                }
            }
            let (d4, dmin4) = (_mm_loadu_ps(d4.as_ptr()), _mm_loadu_ps(dmin4.as_ptr()));
            if MODE == PAIR_SUMS {
                // The min sums transposed to lane k = row k, one vector per pair j, folded in
                // pair by pair (their own accumulator, so ahead of the integer sums).
                let [p0, p1, p2, p3] = pair_mins;
                let (t0, t1) = (_mm_unpacklo_epi32(p0, p1), _mm_unpacklo_epi32(p2, p3));
                let (t2, t3) = (_mm_unpackhi_epi32(p0, p1), _mm_unpackhi_epi32(p2, p3));
                for imin in [
                    _mm_unpacklo_epi64(t0, t1),
                    _mm_unpackhi_epi64(t0, t1),
                    _mm_unpacklo_epi64(t2, t3),
                    _mm_unpackhi_epi64(t2, t3),
                ] {
                    acc_min4 = _mm_fmadd_ps(_mm_cvtepi32_ps(imin), dmin4, acc_min4);
                }
            }
            for j in 0..4 {
                let sl = _mm256_shuffle_epi8(scales, word_bcast_mask(2 * j));
                let sh = _mm256_shuffle_epi8(scales, word_bcast_mask(2 * j + 1));
                let (ql, qh) = qbits(wb, j);
                let mut p = [_mm256_setzero_si256(); 4];
                for k in 0..NX {
                    let xq = x.add(k * stride + i * 292 + 4 + 64 * j);
                    let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(ql, load256(xq)));
                    let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(qh, load256(xq.add(32))));
                    p[k] = _mm256_add_epi32(pl, ph);
                    if MODE != PAIR_SUMS {
                        sumi[k] = _mm256_add_epi32(sumi[k], p[k]);
                    }
                }
                if MODE == PAIR_SUMS {
                    // Lane k: row k's integer sum over the pair, and its min sum.
                    let t = _mm256_hadd_epi32(
                        _mm256_hadd_epi32(p[0], p[1]),
                        _mm256_hadd_epi32(p[2], p[3]),
                    );
                    let isum =
                        _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
                    acc4 = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), d4, acc4);
                }
            }
            for k in 0..NX {
                let dy = (x.add(k * stride + i * 292) as *const f32).read_unaligned();
                match MODE {
                    LANES | LANES_MIN_LANES => {
                        acc[k] = _mm256_fmadd_ps(
                            _mm256_set1_ps(d * dy),
                            _mm256_cvtepi32_ps(sumi[k]),
                            acc[k],
                        )
                    }
                    TILED => {
                        let lanes = _mm_add_epi32(
                            _mm256_castsi256_si128(sumi[k]),
                            _mm256_extracti128_si256(sumi[k], 1),
                        );
                        let isum = hsum_epi32_128(lanes) as f32;
                        let imin = hsum_epi32_128(pair_mins[k]) as f32;
                        let r = (-dmin).mul_add(imin, isum * d);
                        acc_s[k] = r.mul_add(dy, acc_s[k]);
                    }
                    BLOCK_SUMS => {
                        let lanes = _mm_add_epi32(
                            _mm256_castsi256_si128(sumi[k]),
                            _mm256_extracti128_si256(sumi[k], 1),
                        );
                        acc_s[k] = (hsum_epi32_128(lanes) as f32).mul_add(d * dy, acc_s[k]);
                    }
                    _ => {}
                }
            }
        }
        if MODE == PAIR_SUMS {
            let (mut a, mut m) = ([0f32; 4], [0f32; 4]);
            _mm_storeu_ps(a.as_mut_ptr(), acc4);
            _mm_storeu_ps(m.as_mut_ptr(), acc_min4);
            acc_s.copy_from_slice(&a[..NX]);
            acc_ms.copy_from_slice(&m[..NX]);
        }
        for k in 0..NX {
            *out.add(k) = match MODE {
                LANES => hsum_ps(acc[k]) + acc_ms[k],
                LANES_MIN_LANES => hsum_ps(acc[k]) + hsum_ps128(acc_m4[k]),
                TILED => acc_s[k],
                _ => acc_s[k] - acc_ms[k],
            };
        }
    }
}

/// The kernel functions of the K-quants, one per arithmetic `MODE` of a shared body (the
/// `entry!` table takes one function per kernel).
macro_rules! mode_kernels {
    ($($(#[$doc:meta])* $name:ident = $body:ident::<$mode:tt>;)*) => {$(
        $(#[$doc])*
        #[inline(always)]
        unsafe fn $name<const VNNI: bool, const NX: usize>(
            n: usize,
            w: *const u8,
            x: *const u8,
            s: usize,
            out: *mut f32,
        ) {
            unsafe { $body::<NX, $mode>(n, w, x, s, out) }
        }
    )*};
}

mode_kernels! {
    /// Q4_K as llama.cpp's repacked gemv computes one row (its default Q4_K kernel on x86).
    q4_k = q4_k_impl::<BLOCK_SUMS>;
    /// Q4_K as ggml's `vec_dot_q4_K_q8_K` (a matrix llama.cpp does not repack, one row).
    q4_k_vec_dot = q4_k_impl::<LANES_MIN_LANES>;
    /// Q4_K as llama.cpp's tiled kernel computes a prompt's rows of a matrix it does not repack.
    q4_k_tiled = q4_k_impl::<TILED>;
    /// Q4_K as llama.cpp's repacked gemm computes a prompt's rows (see [`dot_k4_like`]).
    q4_k_gemm = q4_k_impl::<PAIR_SUMS>;
    /// Q5_K as ggml's `vec_dot_q5_K_q8_K`.
    q5_k = q5_k_impl::<LANES>;
    /// Q5_K as llama.cpp's tiled kernel computes a prompt's rows.
    q5_k_tiled = q5_k_impl::<TILED>;
    /// Q6_K as ggml's `vec_dot_q6_K_q8_K`.
    q6_k = q6_k_impl::<false>;
    /// Q6_K with the arithmetic of ggml's tiled kernel (see [`super::dispatch::Kernels::q6_k_batched`]).
    q6_k_batched = q6_k_impl::<true>;
}

#[inline(always)]
unsafe fn q4_k_impl<const NX: usize, const MODE: u8>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_k4_like::<NX, 144, MODE>(
            n / 256,
            w,
            x,
            s,
            out,
            #[inline(always)]
            |wb, j| {
                let m4 = _mm256_set1_epi8(0xF);
                let bits = load256(wb.add(16 + 32 * j));
                (
                    _mm256_and_si256(bits, m4),
                    _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                )
            },
        )
    }
}

#[inline(always)]
unsafe fn q5_k_impl<const NX: usize, const MODE: u8>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_k4_like::<NX, 176, MODE>(
            n / 256,
            w,
            x,
            s,
            out,
            #[inline(always)]
            |wb, j| {
                let m4 = _mm256_set1_epi8(0xF);
                let bits = load256(wb.add(48 + 32 * j));
                let hb = load256(wb.add(16));
                let sixteen = _mm256_set1_epi8(16);
                let m1 = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
                let m2 = _mm256_set1_epi8((2u8 << (2 * j)) as i8);
                let h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, m1), m1), sixteen);
                let h2 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, m2), m2), sixteen);
                (
                    _mm256_or_si256(_mm256_and_si256(bits, m4), h1),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h2),
                )
            },
        )
    }
}

/// Shuffle for Q6_K scales: bytes [2i ×8, 2i+1 ×8].
#[inline(always)]
unsafe fn q6_scale_mask(i: usize) -> __m128i {
    unsafe {
        let a = (2 * i) as i8;
        let b = (2 * i + 1) as i8;
        _mm_setr_epi8(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b)
    }
}

/// `BATCHED = false`: `ggml_vec_dot_q6_K_q8_K` (8 integer lanes per super-block, each scaled
/// by d·dy into an 8-lane float accumulator). `BATCHED = true`: the super-block's whole
/// integer sum s, then acc = acc + (s·d)·dy, one rounding per operation.
#[inline(always)]
unsafe fn q6_k_impl<const NX: usize, const BATCHED: bool>(
    n: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    out: *mut f32,
) {
    unsafe {
        let nb = n / 256;
        let m4 = _mm256_set1_epi8(0xF);
        let m3 = _mm256_set1_epi8(3);
        let mut acc = [_mm256_setzero_ps(); NX];
        let mut acc_batched = [0f32; NX];
        for i in 0..nb {
            let wb = w.add(i * 210);
            for l in (0..210).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + l) as *const i8);
            }
            let d = f16(wb.add(208));
            let sc8 = load128(wb.add(192));
            // Σ (q - 32) q8 sc = Σ q q8 sc - 32 Σ sc bsum: start every sum at -32 Σ sc·bsum.
            let sc16 = _mm256_cvtepi8_epi16(sc8);
            let mut sumi = [_mm256_setzero_si256(); NX];
            for k in 0..NX {
                let bs = load256(x.add(k * stride + i * 292 + 260));
                let corr = _mm256_madd_epi16(sc16, bs);
                sumi[k] = _mm256_sub_epi32(sumi[k], _mm256_slli_epi32(corr, 5));
            }
            for h in 0..2 {
                let b1 = load256(wb.add(64 * h));
                let b2 = load256(wb.add(64 * h + 32));
                let bh = load256(wb.add(128 + 32 * h));
                let q0 = _mm256_or_si256(
                    _mm256_and_si256(b1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4),
                );
                let q1 = _mm256_or_si256(
                    _mm256_and_si256(b2, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m3), 4),
                );
                let q2 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m3), 4),
                );
                let q3 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m3), 4),
                );
                let s0 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, q6_scale_mask(4 * h)));
                let s1 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, q6_scale_mask(4 * h + 1)));
                let s2 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, q6_scale_mask(4 * h + 2)));
                let s3 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, q6_scale_mask(4 * h + 3)));
                for k in 0..NX {
                    let xq = x.add(k * stride + i * 292 + 4 + 128 * h);
                    let p0 = _mm256_madd_epi16(s0, _mm256_maddubs_epi16(q0, load256(xq)));
                    let p1 = _mm256_madd_epi16(s1, _mm256_maddubs_epi16(q1, load256(xq.add(32))));
                    let p2 = _mm256_madd_epi16(s2, _mm256_maddubs_epi16(q2, load256(xq.add(64))));
                    let p3 = _mm256_madd_epi16(s3, _mm256_maddubs_epi16(q3, load256(xq.add(96))));
                    let p = _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3));
                    sumi[k] = _mm256_add_epi32(sumi[k], p);
                }
            }
            for k in 0..NX {
                let dy = (x.add(k * stride + i * 292) as *const f32).read_unaligned();
                if BATCHED {
                    let s = hsum_epi32_128(_mm_add_epi32(
                        _mm256_castsi256_si128(sumi[k]),
                        _mm256_extracti128_si256::<1>(sumi[k]),
                    ));
                    acc_batched[k] = (s as f32 * d).mul_add(dy, acc_batched[k]);
                } else {
                    acc[k] = _mm256_fmadd_ps(
                        _mm256_set1_ps(d * dy),
                        _mm256_cvtepi32_ps(sumi[k]),
                        acc[k],
                    );
                }
            }
        }
        for k in 0..NX {
            *out.add(k) = if BATCHED {
                acc_batched[k]
            } else {
                hsum_ps(acc[k])
            };
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Float types.

/// F32 as ggml's AVX-512 `ggml_vec_dot_f32`: four 16-lane FMA accumulators over steps of 64
/// (each two 8-lane registers here), reduced (0+2) + (1+3) and then as `_mm512_reduce_add_ps`,
/// the last `n mod 64` products folded in with FMAs (GCC contracts `sumf += x[i]*y[i]`).
#[inline(always)]
unsafe fn f32_<const VNNI: bool, const NX: usize>(
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
unsafe fn f32_sgemm<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        let w = w as *const f32;
        for k in 0..NX {
            let xr = x.add(k * s) as *const f32;
            let mut acc = [_mm256_setzero_ps(); 2];
            for i in (0..n / 16 * 16).step_by(16) {
                for (h, r) in acc.iter_mut().enumerate() {
                    let at = i + 8 * h;
                    let (wv, xv) = (_mm256_loadu_ps(w.add(at)), _mm256_loadu_ps(xr.add(at)));
                    *r = _mm256_fmadd_ps(wv, xv, *r);
                }
            }
            *out.add(k) = reduce_add_16(&acc);
        }
    }
}

/// F16 as llama.cpp's sgemm computes batches of two or more rows: [`f32_sgemm`] on the widened
/// values (one 16-lane FMA accumulator, then `_mm512_reduce_add_ps`). `n` is a multiple of 16.
#[inline(always)]
unsafe fn f16_sgemm<const VNNI: bool, const NX: usize>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        let w = w as *const __m128i;
        for k in 0..NX {
            let xr = x.add(k * s) as *const __m128i;
            let mut acc = [_mm256_setzero_ps(); 2];
            for i in (0..n / 16 * 16).step_by(16) {
                for (h, r) in acc.iter_mut().enumerate() {
                    // Eight f16 values (16 bytes) at element i + 8h.
                    let at = (i + 8 * h) / 8;
                    let wv = _mm256_cvtph_ps(_mm_loadu_si128(w.add(at)));
                    let xv = _mm256_cvtph_ps(_mm_loadu_si128(xr.add(at)));
                    *r = _mm256_fmadd_ps(wv, xv, *r);
                }
            }
            *out.add(k) = reduce_add_16(&acc);
        }
    }
}

#[inline(always)]
unsafe fn f16_<const VNNI: bool, const NX: usize>(
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
unsafe fn bf16_<const VNNI: bool, const NX: usize>(
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
unsafe fn bf16_sgemm<const VNNI: bool, const NX: usize>(
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
unsafe fn dpbf16_32(acc: &mut [__m256; 2], w: *const u8, x: *const u8) {
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
unsafe fn flush_denormals(v: __m256) -> __m256 {
    unsafe {
        let exp = _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7f80_0000)));
        let denormal = _mm256_cmp_ps::<_CMP_EQ_OQ>(exp, _mm256_setzero_ps());
        _mm256_blendv_ps(v, _mm256_and_ps(v, _mm256_set1_ps(-0.0)), denormal)
    }
}

/// `_mm512_reduce_add_ps` as GCC defines it, for 16 lanes held as two registers: upper 8 lanes
/// + lower 8, upper 4 + lower 4, then (0+2) + (1+3).
#[inline(always)]
unsafe fn reduce_add_16(acc: &[__m256; 2]) -> f32 {
    unsafe {
        let t8 = _mm256_add_ps(acc[1], acc[0]);
        let t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
        let mut l = [0f32; 4];
        _mm_storeu_ps(l.as_mut_ptr(), t4);
        (l[0] + l[2]) + (l[1] + l[3])
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points per level.

macro_rules! level {
    ($modname:ident, $features:literal, $vnni:literal, $level:expr, $table:ident) => {
        mod $modname {
            use super::*;

            macro_rules! entry {
                ($name:ident, $body:ident) => {
                    /// # Safety
                    /// [`DotFn`] contract; the CPU has this module's features.
                    #[target_feature(enable = $features)]
                    pub(super) unsafe fn $name(
                        n: usize,
                        w: *const u8,
                        x: *const u8,
                        s: usize,
                        nx: usize,
                        out: *mut f32,
                    ) {
                        // SAFETY: forwarded DotFn contract; `nx` selects the instantiation.
                        unsafe {
                            match nx {
                                1 => $body::<$vnni, 1>(n, w, x, s, out),
                                2 => $body::<$vnni, 2>(n, w, x, s, out),
                                3 => $body::<$vnni, 3>(n, w, x, s, out),
                                _ => $body::<$vnni, 4>(n, w, x, s, out),
                            }
                        }
                    }
                };
            }

            entry!(k_f32, f32_);
            entry!(k_f16, f16_);
            entry!(k_bf16, bf16_);
            entry!(k_q4_0, q4_0);
            entry!(k_q4_1, q4_1);
            entry!(k_q5_0, q5_0);
            entry!(k_q5_1, q5_1);
            entry!(k_q8_0, q8_0);
            entry!(k_q4_k, q4_k);
            entry!(k_q5_k, q5_k);
            entry!(k_q6_k, q6_k);
            entry!(k_q6_k_batched, q6_k_batched);
            entry!(k_q4_0_block_sums, q4_0_block_sums);
            entry!(k_q4_k_gemm, q4_k_gemm);
            entry!(k_f16_sgemm, f16_sgemm);
            entry!(k_bf16_sgemm, bf16_sgemm);
            entry!(k_f32_sgemm, f32_sgemm);
            entry!(k_q4_k_vec_dot, q4_k_vec_dot);
            entry!(k_q4_k_tiled, q4_k_tiled);
            entry!(k_q5_k_tiled, q5_k_tiled);

            pub(super) const DOTS: [DotFn; 11] = [
                k_f32 as DotFn,
                k_f16,
                k_bf16,
                k_q4_0,
                k_q4_1,
                k_q5_0,
                k_q5_1,
                k_q8_0,
                k_q4_k,
                k_q5_k,
                k_q6_k,
            ];
        }

        pub(crate) static $table: Kernels = Kernels {
            level: $level,
            dots: $modname::DOTS,
            q6_k_batched: $modname::k_q6_k_batched,
            q4_0_block_sums: $modname::k_q4_0_block_sums,
            q4_k_gemm: $modname::k_q4_k_gemm,
            f16_sgemm: $modname::k_f16_sgemm,
            bf16_sgemm: $modname::k_bf16_sgemm,
            f32_sgemm: $modname::k_f32_sgemm,
            q4_k_vec_dot: $modname::k_q4_k_vec_dot,
            q4_k_tiled: $modname::k_q4_k_tiled,
            q5_k_tiled: $modname::k_q5_k_tiled,
        };
    };
}

level!(avx2, "avx2,fma,f16c", false, SimdLevel::Avx2, AVX2);
level!(
    avx512,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
    false,
    SimdLevel::Avx512,
    AVX512
);
level!(
    avx512vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    true,
    SimdLevel::Avx512Vnni,
    AVX512VNNI
);
