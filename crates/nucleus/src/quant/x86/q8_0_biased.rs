//! Q8_0 weight rows × many Q8_0 activation rows with AVX-512 VNNI, in ggml's arithmetic for
//! `ggml_vec_dot_q8_0_q8_0` (and so for Q4_0/Q5_0, whose rows unpack to Q8_0 with the same
//! scales and integers): per block, the integer dot product as eight lane sums of four
//! products, converted to f32, times `d_w · d_x`, fused-added into the row's accumulator in
//! block order; then the eight lanes summed as `hsum_float_8` does.
//!
//! What differs from [`super::block32::dot_q8_0_xs`] is only how each lane's integer is found.
//! `vpdpbusd` multiplies unsigned bytes by signed ones, so ggml (and the AVX2 kernels) make the
//! weights unsigned with `vpsignb`, once per weight block and once per pair. Here the weights
//! are stored biased instead (`q + 128`, as a byte: `q ^ 0x80`), and each activation block's
//! lanes start from `-128 · Σ` of their four bytes, computed once per token: the lane then ends
//! at `Σ (q_w + 128) · q_x - 128 · Σ q_x = Σ q_w · q_x`, the same integer, with no overflow
//! (`|lane| ≤ 4 · 255 · 128 + 4 · 128 · 128`). One `vpdpbusd`, one conversion and one FMA per
//! block and pair of rows, on tiles of four weight rows by four tokens.
//!
//! Safety: every function here is `unsafe`; callers check the CPU's features first
//! ([`crate::quant::biased_q8_0`]) and pass pointers that cover what each function names.

use std::arch::x86_64::*;

use super::block32::{f16x4, unpack_q8_0_blocks};
use super::helpers::*;
use crate::quant::GgmlType;

/// Bytes per Q8_0 block: an f16 scale and 32 integers.
const BLOCK: usize = 34;

/// Q4_0 / Q5_0 / Q8_0 row → biased Q8_0 row (same f16 scales; each integer as `q ^ 0x80`),
/// `nb` blocks. False for another type.
///
/// # Safety
/// `src` readable for `nb` blocks of `ty`, `dst` writable for `nb * 34` bytes; AVX2 present.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn unpack_biased(ty: GgmlType, nb: usize, src: *const u8, dst: *mut u8) -> bool {
    // SAFETY: forwarded.
    unsafe { unpack_q8_0_blocks::<true>(ty, nb, src, dst) }
}

/// For each of the `nb` blocks of one Q8_0 activation row, the starting value of its eight
/// lanes: `-128 ·` the sum of the lane's four integers.
///
/// # Safety
/// `x` readable for `nb` Q8_0 blocks, `out` writable for `nb * 8` i32; AVX-512 VNNI/VL present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn act_bias(nb: usize, x: *const u8, out: *mut i32) {
    unsafe {
        let bias = _mm256_set1_epi8(0x80u8 as i8);
        for i in 0..nb {
            let sums =
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, load256(x.add(i * BLOCK + 2)));
            let neg = _mm256_sub_epi32(_mm256_setzero_si256(), sums);
            _mm256_storeu_si256(out.add(i * 8) as *mut __m256i, neg);
        }
    }
}

/// `y[t * y_stride + r] = W[r] · x[t]` for `r < n_rows` biased weight rows (`w`, rows of
/// `nb * 34` bytes) and `t < n_tok` activation rows (`x` at stride `xrb`), whose block scales
/// are in `xs` (f32, `nb` per token) and lane starts in `bias` (`nb * 8` per token, from
/// [`act_bias`]).
///
/// # Safety
/// The pointers cover what is named above; `y` writable at every `t * y_stride + r`;
/// AVX-512 VNNI/VL present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_biased(
    nb: usize,
    w: *const u8,
    n_rows: usize,
    x: *const u8,
    xrb: usize,
    n_tok: usize,
    xs: *const f32,
    bias: *const i32,
    y: *mut f32,
    y_stride: usize,
) {
    unsafe {
        let wrb = nb * BLOCK;
        let a = Acts {
            nb,
            x,
            xrb,
            xs,
            bias,
        };
        let mut t = 0;
        while t < n_tok {
            let nt = (n_tok - t).min(4);
            let at = a.from(t);
            let mut r = 0;
            while r < n_rows {
                let (wr, yr) = (w.add(r * wrb), y.add(t * y_stride + r));
                // Four rows a tile while four are left, then one.
                if n_rows - r >= 4 {
                    tiles::<4>(nt, &at, wr, wrb, yr, y_stride);
                    r += 4;
                } else {
                    tiles::<1>(nt, &at, wr, wrb, yr, y_stride);
                    r += 1;
                }
            }
            t += nt;
        }
    }
}

/// A tile of `R` rows by `nt` (1..=4) tokens.
#[inline(always)]
unsafe fn tiles<const R: usize>(
    nt: usize,
    a: &Acts,
    w: *const u8,
    wrb: usize,
    y: *mut f32,
    y_stride: usize,
) {
    unsafe {
        match nt {
            4 => tile::<R, 4>(a, w, wrb, y, y_stride),
            3 => tile::<R, 3>(a, w, wrb, y, y_stride),
            2 => tile::<R, 2>(a, w, wrb, y, y_stride),
            _ => tile::<R, 1>(a, w, wrb, y, y_stride),
        }
    }
}

/// Activation rows as the tiles read them.
struct Acts {
    nb: usize,
    x: *const u8,
    xrb: usize,
    xs: *const f32,
    bias: *const i32,
}

impl Acts {
    /// The rows from token `t` on.
    unsafe fn from(&self, t: usize) -> Acts {
        unsafe {
            Acts {
                nb: self.nb,
                x: self.x.add(t * self.xrb),
                xrb: self.xrb,
                xs: self.xs.add(t * self.nb),
                bias: self.bias.add(t * self.nb * 8),
            }
        }
    }
}

/// `R` weight rows × `T` tokens.
#[inline(always)]
unsafe fn tile<const R: usize, const T: usize>(
    a: &Acts,
    w: *const u8,
    wrb: usize,
    y: *mut f32,
    y_stride: usize,
) {
    unsafe {
        let nb = a.nb;
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        // One block `i` of every pair: d_w · d_x of the pair in `d[r][t]`.
        macro_rules! block {
            ($i:expr, $d:expr) => {{
                let i = $i;
                let mut u = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    u[r] = load256(w.add(r * wrb + i * BLOCK + 2));
                }
                for t in 0..T {
                    let qx = load256(a.x.add(t * a.xrb + i * BLOCK + 2));
                    let start = load256(a.bias.add((t * nb + i) * 8) as *const u8);
                    for r in 0..R {
                        let p = _mm256_dpbusd_epi32(start, u[r], qx);
                        let d = _mm256_set1_ps($d(r, t));
                        acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r][t]);
                    }
                }
            }};
        }
        let mut i = 0;
        // Four blocks at a time: the scale products of four blocks in one multiply per pair
        // (the same f32 products as one at a time).
        let mut dp = [[[0f32; 4]; T]; R];
        while i + 4 <= nb {
            for r in 0..R {
                let dw = f16x4(w.add(r * wrb + i * BLOCK), BLOCK);
                for t in 0..T {
                    let dx = _mm_loadu_ps(a.xs.add(t * nb + i));
                    _mm_storeu_ps(dp[r][t].as_mut_ptr(), _mm_mul_ps(dw, dx));
                }
            }
            for b in 0..4 {
                block!(i + b, |r: usize, t: usize| dp[r][t][b]);
            }
            i += 4;
        }
        while i < nb {
            block!(i, |r: usize, t: usize| f16(w.add(r * wrb + i * BLOCK))
                * *a.xs.add(t * nb + i));
            i += 1;
        }
        for r in 0..R {
            for t in 0..T {
                *y.add(t * y_stride + r) = hsum_ps(acc[r][t]);
            }
        }
    }
}
