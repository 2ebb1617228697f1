//! Q2_K, Q3_K and IQ4_XS against Q8_K, IQ4_NL against Q8_0 (AVX2 instructions; the AVX-512
//! levels compile the same bodies). `scalar_low_bit.rs` writes out the same arithmetic lane by
//! lane and names the llama.cpp kernel each `MODE` follows.

use std::arch::x86_64::*;

use super::helpers::*;
use super::k_quants::{BLOCK_SUMS, LANES, PAIR_SUMS, TILED};
use crate::quant::blocks_low_bit::{
    e8m0_to_f32_half, iq4_xs_scales, q3_k_scales, KVALUES_IQ4NL, KVALUES_MXFP4, MXFP4_BYTES,
};

/// Σ of the 8 i32 lanes (exact).
#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    unsafe {
        hsum_epi32_128(_mm_add_epi32(
            _mm256_castsi256_si128(v),
            _mm256_extracti128_si256(v, 1),
        ))
    }
}

/// i16 scales: `lo` in the lower 128-bit lane, `hi` in the upper one.
#[inline(always)]
unsafe fn scale_pair(lo: i32, hi: i32) -> __m256i {
    unsafe { _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16)) }
}

/// Signed bytes `w` times signed bytes `x`, adjacent pairs summed to i16 (ggml's
/// `mul_add_epi8`: the sign moved onto `x`, since `vpmaddubsw` takes one unsigned operand).
#[inline(always)]
unsafe fn mul_add_i8(w: __m256i, x: __m256i) -> __m256i {
    unsafe { _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)) }
}

/// The 32 IQ4 values of one 16-byte sub-block at `p`, in element order (low nibbles first).
#[inline(always)]
unsafe fn iq4_bytes(p: *const u8) -> __m256i {
    unsafe { nl_bytes(p, &KVALUES_IQ4NL) }
}

/// [`iq4_bytes`] with another table of 16 values (MXFP4's).
#[inline(always)]
unsafe fn nl_bytes(p: *const u8, table: &[i8; 16]) -> __m256i {
    unsafe {
        let table = _mm_loadu_si128(table.as_ptr() as *const __m128i);
        let m4 = _mm_set1_epi8(0xF);
        let bits = load128(p);
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(bits, m4));
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));
        _mm256_set_m128i(hi, lo)
    }
}

/// Shared by Q2_K, Q3_K and IQ4_XS (super-blocks of `WB` bytes against Q8_K). Per block,
/// `prep` gives the weight scales and d (and dmin), `group(wb, &prep, g, xq)` the 8 i32 lanes of
/// 32-value group g against the 32 activation bytes at `xq` (each lane times its scale), and
/// with `MINS` (Q2_K), `mins(wb)` the 16 i16 mins. `MODE` (see `k_quants.rs`) picks the float
/// arithmetic: `LANES` the one-row `vec_dot` (8 float lanes), `BLOCK_SUMS` the repacked gemv,
/// `PAIR_SUMS` the repacked gemm (per 128-value half), `TILED` the tiled kernel.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_super<P, const NX: usize, const WB: usize, const MODE: u8, const MINS: bool>(
    n: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    out: *mut f32,
    prep: impl Fn(*const u8) -> (P, f32, f32),
    group: impl Fn(*const u8, &P, usize, *const u8) -> __m256i,
    mins: impl Fn(*const u8) -> __m256i,
) {
    unsafe {
        let mut acc = [_mm256_setzero_ps(); NX];
        let (mut acc_s, mut acc_m) = ([0f32; NX], [0f32; NX]);
        for i in 0..n / 256 {
            let wb = w.add(i * WB);
            for l in (0..WB).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + l) as *const i8);
            }
            let (p, d, dmin) = prep(wb);
            for k in 0..NX {
                let xb = x.add(k * stride + i * 292);
                let dy = (xb as *const f32).read_unaligned();
                let mut half = [_mm256_setzero_si256(); 2];
                for g in 0..8 {
                    half[g / 4] =
                        _mm256_add_epi32(half[g / 4], group(wb, &p, g, xb.add(4 + 32 * g)));
                }
                let lanes = _mm256_add_epi32(half[0], half[1]);
                let min_lanes = if MINS {
                    _mm256_madd_epi16(mins(wb), load256(xb.add(260)))
                } else {
                    _mm256_setzero_si256()
                };
                match MODE {
                    LANES => {
                        if MINS {
                            let dm = _mm256_set1_ps(-dy * dmin);
                            acc[k] = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(min_lanes), acc[k]);
                        }
                        let dd = _mm256_set1_ps(dy * d);
                        acc[k] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes), acc[k]);
                    }
                    BLOCK_SUMS => {
                        acc_s[k] = (hsum_epi32(lanes) as f32).mul_add(d * dy, acc_s[k]);
                        acc_m[k] = (hsum_epi32(min_lanes) as f32).mul_add(dmin * dy, acc_m[k]);
                    }
                    PAIR_SUMS => {
                        let half_mins = [
                            _mm256_castsi256_si128(min_lanes),
                            _mm256_extracti128_si256(min_lanes, 1),
                        ];
                        for h in 0..2 {
                            let isum = hsum_epi32(half[h]) as f32;
                            acc_s[k] = isum.mul_add(d * dy, acc_s[k]);
                            let imin = hsum_epi32_128(half_mins[h]) as f32;
                            acc_m[k] = imin.mul_add(dmin * dy, acc_m[k]);
                        }
                    }
                    _ => {
                        let mut r = hsum_epi32(lanes) as f32 * d;
                        if MINS {
                            r = (-dmin).mul_add(hsum_epi32(min_lanes) as f32, r);
                        }
                        acc_s[k] = r.mul_add(dy, acc_s[k]);
                    }
                }
            }
        }
        for k in 0..NX {
            *out.add(k) = match MODE {
                LANES => hsum_ps(acc[k]),
                TILED => acc_s[k],
                _ => acc_s[k] - acc_m[k],
            };
        }
    }
}

#[inline(always)]
unsafe fn q2_k_impl<const NX: usize, const MODE: u8>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_super::<(), NX, 84, MODE, true>(
            n,
            w,
            x,
            s,
            out,
            |wb| ((), f16(wb.add(80)), f16(wb.add(82))),
            #[inline(always)]
            |wb, _, g, xq| {
                let (h, sh) = (g / 4, 2 * (g % 4) as i32);
                let bits = load256(wb.add(16 + 32 * h));
                let q = _mm256_and_si256(
                    _mm256_srl_epi16(bits, _mm_cvtsi32_si128(sh)),
                    _mm256_set1_epi8(3),
                );
                let sc = |j: usize| (*wb.add(j) & 0xF) as i32;
                let scales = scale_pair(sc(2 * g), sc(2 * g + 1));
                _mm256_madd_epi16(scales, _mm256_maddubs_epi16(q, load256(xq)))
            },
            #[inline(always)]
            |wb| {
                let m = _mm_and_si128(_mm_srli_epi16(load128(wb), 4), _mm_set1_epi8(0xF));
                _mm256_cvtepu8_epi16(m)
            },
        )
    }
}

#[inline(always)]
unsafe fn q3_k_impl<const NX: usize, const MODE: u8>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_super::<[i32; 16], NX, 110, MODE, false>(
            n,
            w,
            x,
            s,
            out,
            |wb| {
                let block = std::slice::from_raw_parts(wb, 110);
                (q3_k_scales(block), f16(wb.add(108)), 0.0)
            },
            #[inline(always)]
            |wb, scales, g, xq| {
                let (h, sh) = (g / 4, 2 * (g % 4) as i32);
                let bits = load256(wb.add(32 + 32 * h));
                let low = _mm256_and_si256(
                    _mm256_srl_epi16(bits, _mm_cvtsi32_si128(sh)),
                    _mm256_set1_epi8(3),
                );
                // 4 where the third bit (bit 4h + s of hmask) is clear: value = low − that.
                let m = _mm256_set1_epi8((1u8 << (4 * h + g % 4)) as i8);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(load256(wb), m), m);
                let high = _mm256_andnot_si256(set, _mm256_set1_epi8(4));
                let xv = load256(xq);
                let p16 = _mm256_sub_epi16(
                    _mm256_maddubs_epi16(low, xv),
                    _mm256_maddubs_epi16(high, xv),
                );
                _mm256_madd_epi16(scale_pair(scales[2 * g], scales[2 * g + 1]), p16)
            },
            |_| _mm256_setzero_si256(),
        )
    }
}

#[inline(always)]
unsafe fn iq4_xs_impl<const NX: usize, const MODE: u8>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_super::<[i32; 8], NX, 136, MODE, false>(
            n,
            w,
            x,
            s,
            out,
            |wb| {
                let block = std::slice::from_raw_parts(wb, 136);
                (iq4_xs_scales(block), f16(wb), 0.0)
            },
            #[inline(always)]
            |wb, scales, g, xq| {
                let p16 = mul_add_i8(iq4_bytes(wb.add(8 + 16 * g)), load256(xq));
                _mm256_madd_epi16(p16, _mm256_set1_epi16(scales[g] as i16))
            },
            |_| _mm256_setzero_si256(),
        )
    }
}

/// IQ4_NL against Q8_0. `BLOCK_SUMS = false`: `ggml_vec_dot_iq4_nl_q8_0` (blocks in pairs into
/// two 8-lane accumulators, an odd last block by the C tail loop); `true`: the repacked kernels
/// (each block's integer sum, one FMA with dw·dx).
#[inline(always)]
unsafe fn iq4_nl_impl<const NX: usize, const BLOCK_SUMS_: bool>(
    n: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    out: *mut f32,
) {
    unsafe { nl_impl::<NX, BLOCK_SUMS_, false>(n, w, x, stride, out) }
}

/// MXFP4 against Q8_0: ggml's MXFP4 kernels are its IQ4_NL kernels with MXFP4's table and
/// block scale (`e8m0_to_fp32_half(e)`, 17-byte blocks).
#[inline(always)]
unsafe fn mxfp4_impl<const NX: usize, const BLOCK_SUMS_: bool>(
    n: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    out: *mut f32,
) {
    unsafe { nl_impl::<NX, BLOCK_SUMS_, true>(n, w, x, stride, out) }
}

/// A block's weight scale and its 32 values as signed bytes: IQ4_NL (`MX = false`) or MXFP4.
#[inline(always)]
unsafe fn nl_block<const MX: bool>(wb: *const u8) -> (f32, __m256i) {
    unsafe {
        if MX {
            (e8m0_to_f32_half(*wb), nl_bytes(wb.add(1), &KVALUES_MXFP4))
        } else {
            (f16(wb), iq4_bytes(wb.add(2)))
        }
    }
}

#[inline(always)]
unsafe fn nl_impl<const NX: usize, const BLOCK_SUMS_: bool, const MX: bool>(
    n: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    out: *mut f32,
) {
    unsafe {
        let bytes = if MX { MXFP4_BYTES } else { 18 };
        let nb = n / 32;
        let paired = if BLOCK_SUMS_ { nb } else { nb / 2 * 2 };
        let mut acc = [[_mm256_setzero_ps(); NX]; 2];
        let mut acc_s = [0f32; NX];
        let ones = _mm256_set1_epi16(1);
        for i in 0..paired {
            let wb = w.add(i * bytes);
            _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH) as *const i8);
            let (dw, v) = nl_block::<MX>(wb);
            for k in 0..NX {
                let xb = x.add(k * stride + i * 34);
                let d = f16(xb) * dw;
                let lanes = _mm256_madd_epi16(mul_add_i8(v, load256(xb.add(2))), ones);
                if BLOCK_SUMS_ {
                    acc_s[k] = (hsum_epi32(lanes) as f32).mul_add(d, acc_s[k]);
                } else {
                    let a = &mut acc[i % 2][k];
                    *a = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), *a);
                }
            }
        }
        for k in 0..NX {
            *out.add(k) = if BLOCK_SUMS_ {
                acc_s[k]
            } else {
                let sum = hsum_ps(_mm256_add_ps(acc[0][k], acc[1][k]));
                if paired < nb {
                    // The odd last block: sumf += d·sumi (one FMA, as GCC contracts it).
                    let xb = x.add(k * stride + (nb - 1) * 34);
                    let (dw, v) = nl_block::<MX>(w.add((nb - 1) * bytes));
                    let d = f16(xb) * dw;
                    let lanes = _mm256_madd_epi16(mul_add_i8(v, load256(xb.add(2))), ones);
                    d.mul_add(hsum_epi32(lanes) as f32, sum)
                } else {
                    sum
                }
            };
        }
    }
}

// The kernel functions, one per type and arithmetic.
mode_kernels! {
    /// `ggml_vec_dot_q2_K_q8_K`.
    q2_k = q2_k_impl::<LANES>;
    /// `ggml_gemv_q2_K_8x8_q8_K` (repacked, one row).
    q2_k_block_sums = q2_k_impl::<BLOCK_SUMS>;
    /// `ggml_gemm_q2_K_8x8_q8_K` (repacked, a prompt's rows in fours).
    q2_k_gemm = q2_k_impl::<PAIR_SUMS>;
    /// The tiled kernel (a prompt's rows, not repacked).
    q2_k_tiled = q2_k_impl::<TILED>;
    /// `ggml_vec_dot_q3_K_q8_K`.
    q3_k = q3_k_impl::<LANES>;
    /// The tiled kernel.
    q3_k_tiled = q3_k_impl::<TILED>;
    /// `ggml_vec_dot_iq4_xs_q8_K`.
    iq4_xs = iq4_xs_impl::<LANES>;
    /// The tiled kernel.
    iq4_xs_tiled = iq4_xs_impl::<TILED>;
    /// `ggml_vec_dot_iq4_nl_q8_0`.
    iq4_nl = iq4_nl_impl::<false>;
    /// The repacked IQ4_NL kernels.
    iq4_nl_block_sums = iq4_nl_impl::<true>;
    /// `ggml_vec_dot_mxfp4_q8_0`.
    mxfp4 = mxfp4_impl::<false>;
    /// The repacked MXFP4 kernels.
    mxfp4_block_sums = mxfp4_impl::<true>;
}
