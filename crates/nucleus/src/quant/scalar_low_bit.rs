//! Portable scalar dot products of Q2_K, Q3_K, IQ4_NL and IQ4_XS (see `scalar.rs` for the
//! conventions): each computes the f32 bits of the x86 kernel in the same table slot
//! (`x86/low_bit.rs`), in the order of the llama.cpp kernel named in its comment, as its
//! AVX-512 build (GCC, `-march=native`) runs it. For the one-row kernels that is the `__AVX2__`
//! branch of `ggml/src/ggml-cpu/arch/x86/quants.c` (AVX-512 builds compile the same branch);
//! for the rest, the repacked kernels of `arch/x86/repack.cpp` and the tiled kernel of
//! `ggml-cpu/tiled/`, whose integer sums are exact and whose float steps are written out here.

#![allow(clippy::needless_range_loop)]

use std::array::from_fn;

use super::blocks::{f16_to_f32, rd_f32, rd_u16, QK, QK_K};
use super::blocks_low_bit::{e8m0_to_f32_half, mxfp4_values, MXFP4_BYTES};
use super::blocks_low_bit::{
    iq4_values, iq4_xs_scales, iq4_xs_values, q2_k_scales_mins, q2_k_values, q3_k_scales,
    q3_k_values, IQ4_NL_BYTES,
};
use super::dispatch::DotFn;
use super::scalar::{fma_lanes, hsum_float_8, lanes_32, wrap};
use super::scalar_k::bsum;
use super::types::GgmlType;

wrap!(k_q2_k, dot_q2_k, GgmlType::Q2_K);
wrap!(k_q3_k, dot_q3_k, GgmlType::Q3_K);
wrap!(k_iq4_nl, dot_iq4_nl, GgmlType::IQ4_NL);
wrap!(k_iq4_xs, dot_iq4_xs, GgmlType::IQ4_XS);
wrap!(k_q2_k_block_sums, dot_q2_k_block_sums, GgmlType::Q2_K);
wrap!(k_q2_k_gemm, dot_q2_k_gemm, GgmlType::Q2_K);
wrap!(k_q2_k_tiled, dot_q2_k_tiled, GgmlType::Q2_K);
wrap!(k_q3_k_tiled, dot_q3_k_tiled, GgmlType::Q3_K);
wrap!(k_iq4_xs_tiled, dot_iq4_xs_tiled, GgmlType::IQ4_XS);
wrap!(k_iq4_nl_block_sums, dot_iq4_nl_block_sums, GgmlType::IQ4_NL);
wrap!(k_mxfp4, dot_mxfp4, GgmlType::MXFP4);
wrap!(k_mxfp4_block_sums, dot_mxfp4_block_sums, GgmlType::MXFP4);

pub(crate) const Q2_K: DotFn = k_q2_k;
pub(crate) const Q3_K: DotFn = k_q3_k;
pub(crate) const IQ4_NL: DotFn = k_iq4_nl;
pub(crate) const IQ4_XS: DotFn = k_iq4_xs;
pub(crate) const Q2_K_BLOCK_SUMS: DotFn = k_q2_k_block_sums;
pub(crate) const Q2_K_GEMM: DotFn = k_q2_k_gemm;
pub(crate) const Q2_K_TILED: DotFn = k_q2_k_tiled;
pub(crate) const Q3_K_TILED: DotFn = k_q3_k_tiled;
pub(crate) const IQ4_XS_TILED: DotFn = k_iq4_xs_tiled;
pub(crate) const IQ4_NL_BLOCK_SUMS: DotFn = k_iq4_nl_block_sums;
pub(crate) const MXFP4: DotFn = k_mxfp4;
pub(crate) const MXFP4_BLOCK_SUMS: DotFn = k_mxfp4_block_sums;

/// One super-block of a Q2_K/Q3_K/IQ4_XS row against a Q8_K block, in the integers the x86
/// kernels form.
struct SuperBlock {
    /// The weight's d (and dmin: Q2_K only) and the activation scale.
    wd: f32,
    wdmin: f32,
    dy: f32,
    /// 8 lanes: Σ over the block's 32-value groups g of (the scale of the 16 or 32 values lane
    /// l covers) times the group's [`lanes_32`] lane l.
    lanes: [i32; 8],
    /// The scaled integer sums of the two 128-value halves (their sum is Σ lanes).
    halves: [i32; 2],
    /// Q2_K: 8 lanes, lane l = min[2l]·bsums[2l] + min[2l+1]·bsums[2l+1] (`vpmaddwd`).
    min_lanes: [i32; 8],
}

impl SuperBlock {
    fn isum(&self) -> i32 {
        self.lanes.iter().sum()
    }
    fn imin(&self) -> i32 {
        self.min_lanes.iter().sum()
    }
    /// The min sums of the two halves (sub-blocks 0..8 and 8..16).
    fn half_mins(&self) -> [i32; 2] {
        [0, 1].map(|h| self.min_lanes[4 * h..4 * h + 4].iter().sum())
    }
}

/// Calls `f` with each super-block of a Q2_K, Q3_K or IQ4_XS row (`ty`). Each of the 16
/// sixteen-value groups takes its sub-block's scale (IQ4_XS: that of its 32-value sub-block).
fn for_super_blocks(n: usize, w: &[u8], x: &[u8], ty: GgmlType, mut f: impl FnMut(&SuperBlock)) {
    let bytes = ty.block_layout().1;
    for i in 0..n / QK_K {
        let (wb, xb) = (&w[bytes * i..bytes * (i + 1)], &x[292 * i..292 * i + 292]);
        let (q, scales16, mins16, wd, wdmin): ([i32; QK_K], [i32; 16], [i32; 16], f32, f32) =
            match ty {
                GgmlType::Q2_K => {
                    let (s, m) = q2_k_scales_mins(wb);
                    let d = f16_to_f32(rd_u16(wb, 80));
                    (q2_k_values(wb), s, m, d, f16_to_f32(rd_u16(wb, 82)))
                }
                GgmlType::Q3_K => {
                    let d = f16_to_f32(rd_u16(wb, 108));
                    (q3_k_values(wb), q3_k_scales(wb), [0; 16], d, 0.0)
                }
                _ => {
                    let s = iq4_xs_scales(wb);
                    let d = f16_to_f32(rd_u16(wb, 0));
                    (iq4_xs_values(wb), from_fn(|g| s[g / 2]), [0; 16], d, 0.0)
                }
            };
        let xq = &xb[4..260];
        let mut lanes = [0i32; 8];
        let mut halves = [0i32; 2];
        for g in 0..8 {
            let p = lanes_32(&q[32 * g..], &xq[32 * g..]);
            for l in 0..8 {
                let v = scales16[2 * g + l / 4] * p[l];
                lanes[l] += v;
                halves[g / 4] += v;
            }
        }
        let min_lanes =
            from_fn(|l| mins16[2 * l] * bsum(xb, 2 * l) + mins16[2 * l + 1] * bsum(xb, 2 * l + 1));
        f(&SuperBlock {
            wd,
            wdmin,
            dy: rd_f32(xb, 0),
            lanes,
            halves,
            min_lanes,
        });
    }
}

/// `ggml_vec_dot_q2_K_q8_K` (AVX2): per block, the min lanes FMA'd with −dy·dmin into the 8
/// float lanes, then the scaled lanes with dy·d; [`hsum_float_8`] at the end.
pub(crate) fn dot_q2_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for_super_blocks(n, w, x, GgmlType::Q2_K, |b| {
        fma_lanes(&mut acc, -b.dy * b.wdmin, &b.min_lanes);
        fma_lanes(&mut acc, b.dy * b.wd, &b.lanes);
    });
    hsum_float_8(&acc)
}

/// Q2_K as llama.cpp's repacked gemv (`ggml_gemv_q2_K_8x8_q8_K`, which an AVX-512 build uses
/// for Q2_K matrices with a multiple of 8 rows): per block acc = fma(isum, d·dy, acc) and
/// acc_min = fma(imin, dmin·dy, acc_min); acc − acc_min at the end.
pub(crate) fn dot_q2_k_block_sums(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for_super_blocks(n, w, x, GgmlType::Q2_K, |b| {
        acc = (b.isum() as f32).mul_add(b.wd * b.dy, acc);
        acc_min = (b.imin() as f32).mul_add(b.wdmin * b.dy, acc_min);
    });
    acc - acc_min
}

/// Q2_K as llama.cpp's repacked gemm (`ggml_gemm_q2_K_8x8_q8_K`, a prompt's rows in groups of
/// four): as [`dot_q2_k_block_sums`] with one FMA pair per 128-value half.
pub(crate) fn dot_q2_k_gemm(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for_super_blocks(n, w, x, GgmlType::Q2_K, |b| {
        for (isum, imin) in b.halves.iter().zip(b.half_mins()) {
            acc = (*isum as f32).mul_add(b.wd * b.dy, acc);
            acc_min = (imin as f32).mul_add(b.wdmin * b.dy, acc_min);
        }
    });
    acc - acc_min
}

/// The tiled kernel's per-block step (`ggml-cpu/tiled/`, VNNI epilogue): r = isum·d, less
/// dmin·imin with one FMA where the format has mins, then acc = fma(r, dy, acc).
fn dot_tiled(n: usize, w: &[u8], x: &[u8], ty: GgmlType) -> f32 {
    let mut acc = 0f32;
    for_super_blocks(n, w, x, ty, |b| {
        let mut r = b.isum() as f32 * b.wd;
        if ty == GgmlType::Q2_K {
            r = (-b.wdmin).mul_add(b.imin() as f32, r);
        }
        acc = r.mul_add(b.dy, acc);
    });
    acc
}

pub(crate) fn dot_q2_k_tiled(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_tiled(n, w, x, GgmlType::Q2_K)
}

/// `ggml_vec_dot_q3_K_q8_K` (AVX2): per block the scaled lanes FMA'd with dy·d into 8 float
/// lanes, [`hsum_float_8`] at the end.
pub(crate) fn dot_q3_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for_super_blocks(n, w, x, GgmlType::Q3_K, |b| {
        fma_lanes(&mut acc, b.dy * b.wd, &b.lanes)
    });
    hsum_float_8(&acc)
}

pub(crate) fn dot_q3_k_tiled(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_tiled(n, w, x, GgmlType::Q3_K)
}

/// `ggml_vec_dot_iq4_xs_q8_K` (AVX2): per block the lanes of its 8 sub-blocks, each times
/// its scale, FMA'd with d·dy into 8 float lanes; [`hsum_float_8`] at the end.
pub(crate) fn dot_iq4_xs(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for_super_blocks(n, w, x, GgmlType::IQ4_XS, |b| {
        fma_lanes(&mut acc, b.wd * b.dy, &b.lanes)
    });
    hsum_float_8(&acc)
}

pub(crate) fn dot_iq4_xs_tiled(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_tiled(n, w, x, GgmlType::IQ4_XS)
}

/// Calls `f(dw·dx, lanes)` for each IQ4_NL block (MXFP4 with `MX`) against its Q8_0 block.
/// MXFP4's blocks are IQ4_NL's with another table and a power-of-two scale: ggml's kernels for
/// the two are one code (dx times the weight's scale, in that order).
fn for_nl_blocks<const MX: bool>(n: usize, w: &[u8], x: &[u8], mut f: impl FnMut(f32, [i32; 8])) {
    let bytes = if MX { MXFP4_BYTES } else { IQ4_NL_BYTES };
    for i in 0..n / QK {
        let wb = &w[bytes * i..bytes * (i + 1)];
        let xb = &x[34 * i..34 * i + 34];
        let dx = f16_to_f32(rd_u16(xb, 0));
        let (d, values) = if MX {
            (dx * e8m0_to_f32_half(wb[0]), mxfp4_values(&wb[1..]))
        } else {
            (dx * f16_to_f32(rd_u16(wb, 0)), iq4_values(&wb[2..]))
        };
        f(d, lanes_32(&values, &xb[2..]));
    }
}

fn for_iq4_nl_blocks(n: usize, w: &[u8], x: &[u8], f: impl FnMut(f32, [i32; 8])) {
    for_nl_blocks::<false>(n, w, x, f)
}

/// `ggml_vec_dot_iq4_nl_q8_0` (AVX2): blocks in pairs, the first of each pair into one 8-lane
/// accumulator and the second into another (FMA with dx·dw), [`hsum_float_8`] of their sum;
/// an odd last block is added by the C tail loop, `sumf += d·sumi` (one FMA, as GCC contracts
/// it).
pub(crate) fn dot_iq4_nl(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_nl::<false>(n, w, x)
}

/// `ggml_vec_dot_mxfp4_q8_0` (AVX2): [`dot_iq4_nl`]'s order.
pub(crate) fn dot_mxfp4(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_nl::<true>(n, w, x)
}

/// MXFP4 as llama.cpp's repacked kernels compute it (`gemv/gemm_q4_b32_8x8_q8_0_lut_avx` with
/// `block_mxfp4x8`): [`dot_iq4_nl_block_sums`]'s order.
pub(crate) fn dot_mxfp4_block_sums(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for_nl_blocks::<true>(n, w, x, |d, lanes| {
        acc = (lanes.iter().sum::<i32>() as f32).mul_add(d, acc)
    });
    acc
}

fn dot_nl<const MX: bool>(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let nb = n / QK;
    let mut acc = [[0f32; 8]; 2];
    let mut tail = None;
    let mut i = 0;
    for_nl_blocks::<MX>(n, w, x, |d, lanes| {
        if i + 1 == nb && nb % 2 == 1 {
            tail = Some((d, lanes.iter().sum::<i32>()));
        } else {
            fma_lanes(&mut acc[i % 2], d, &lanes);
        }
        i += 1;
    });
    let sum = hsum_float_8(&from_fn(|l| acc[0][l] + acc[1][l]));
    match tail {
        Some((d, sumi)) => d.mul_add(sumi as f32, sum),
        None => sum,
    }
}

/// IQ4_NL as llama.cpp's repacked kernels (`gemv/gemm_q4_b32_8x8_q8_0_lut_avx`, which it uses
/// for IQ4_NL matrices with a multiple of 8 rows on AVX2 and AVX-512): acc = fma(sumi, dw·dx,
/// acc) per block, sumi the block's whole integer sum.
pub(crate) fn dot_iq4_nl_block_sums(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for_iq4_nl_blocks(n, w, x, |d, lanes| {
        acc = (lanes.iter().sum::<i32>() as f32).mul_add(d, acc)
    });
    acc
}
