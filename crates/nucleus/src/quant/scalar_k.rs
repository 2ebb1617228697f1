//! Portable scalar dot products of Q4_K, Q5_K and Q6_K against Q8_K rows (see `scalar.rs` for
//! the conventions): the f32 bits of the x86 kernels in the same slots, in the chains of
//! llama.cpp's one-row kernels (`ggml_vec_dot_q4_K_q8_K` and its siblings), its repacked gemm
//! and its tiled kernel, as their comments say.

#![allow(clippy::needless_range_loop)]

use std::array::from_fn;

use super::blocks::{f16_to_f32, rd_f32, rd_u16, scale_min_k4, QK_K};
use super::scalar::{add_lanes, fma_lanes, hsum_float_4, hsum_float_8, lanes_32};

// Q8_K rows: d f32 at 0, qs at 4, bsums at 260.

/// The eight 6-bit scales and mins of a Q4_K/Q5_K block's 12 scale bytes.
#[inline(always)]
fn k4_scales_mins(sc: &[u8]) -> ([i32; 8], [i32; 8]) {
    let (mut scales, mut mins) = ([0i32; 8], [0i32; 8]);
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, sc);
        scales[j] = s as i32;
        mins[j] = m as i32;
    }
    (scales, mins)
}

/// Sum `g` (0..16) of a Q8_K block's 16-element sums.
#[inline(always)]
pub(super) fn bsum(xb: &[u8], g: usize) -> i32 {
    rd_u16(xb, 260 + 2 * g) as i16 as i32
}

/// The 256 unsigned values of a Q4_K block: sub-block pair j (64 values) is the low nibbles of
/// `qs[32j..32j+32]`, then their high nibbles.
fn q4_k_values(b: &[u8]) -> [i32; QK_K] {
    let mut q = [0i32; QK_K];
    for (j, qs) in b[16..144].chunks_exact(32).enumerate() {
        for l in 0..32 {
            q[64 * j + l] = (qs[l] & 0xF) as i32;
            q[64 * j + 32 + l] = (qs[l] >> 4) as i32;
        }
    }
    q
}

/// The 256 unsigned values of a Q5_K block: the nibbles as Q4_K's (`qs` 32 bytes later, after
/// `qh`), with bit `e / 32` of `qh[e % 32]` as the fifth bit of element e.
fn q5_k_values(b: &[u8]) -> [i32; QK_K] {
    let qh = &b[16..48];
    let mut q = q4_k_values(&b[32..]);
    for e in 0..QK_K {
        q[e] |= (((qh[e % 32] >> (e / 32)) & 1) << 4) as i32;
    }
    q
}

/// One Q4_K/Q5_K super-block against a Q8_K block, in the integers the x86 kernels form.
struct K4Block {
    /// The weight's d and dmin, each times the activation scale dy.
    d: f32,
    dmin: f32,
    /// The weight's d and dmin, and the activation scale.
    wd: f32,
    wdmin: f32,
    dy: f32,
    /// Per sub-block pair j (64 values), 8 lanes: scale[2j] times the [`lanes_32`] of its first
    /// 32 values plus scale[2j+1] times those of the second 32.
    pairs: [[i32; 8]; 4],
    /// Per pair j: min[2j]·(bsums[4j] + bsums[4j+1]) + min[2j+1]·(bsums[4j+2] + bsums[4j+3])
    /// (the lanes of `_mm_madd_epi16(mins, _mm_hadd_epi16(bsums))`).
    mins: [i32; 4],
}

/// Calls `f` with each super-block of a Q4_K/Q5_K row (`bytes` per block, `values` unpacking
/// one).
fn for_k4_blocks(
    n: usize,
    w: &[u8],
    x: &[u8],
    bytes: usize,
    values: fn(&[u8]) -> [i32; QK_K],
    mut f: impl FnMut(&K4Block),
) {
    for i in 0..n / QK_K {
        let (wb, xb) = (&w[bytes * i..bytes * (i + 1)], &x[292 * i..292 * i + 292]);
        let (scales, mins) = k4_scales_mins(&wb[4..16]);
        let q = values(wb);
        let xq = &xb[4..260];
        let dy = rd_f32(xb, 0);
        let (wd, wdmin) = (f16_to_f32(rd_u16(wb, 0)), f16_to_f32(rd_u16(wb, 2)));
        f(&K4Block {
            d: wd * dy,
            dmin: wdmin * dy,
            wd,
            wdmin,
            dy,
            pairs: from_fn(|j| {
                let lo = lanes_32(&q[64 * j..], &xq[64 * j..]);
                let hi = lanes_32(&q[64 * j + 32..], &xq[64 * j + 32..]);
                from_fn(|l| scales[2 * j] * lo[l] + scales[2 * j + 1] * hi[l])
            }),
            mins: from_fn(|j| {
                mins[2 * j] * (bsum(xb, 4 * j) + bsum(xb, 4 * j + 1))
                    + mins[2 * j + 1] * (bsum(xb, 4 * j + 2) + bsum(xb, 4 * j + 3))
            }),
        });
    }
}

/// Q4_K with the float arithmetic of llama.cpp's repacked Q4_K gemv (`BLOCK_SUMS` in
/// `x86/k_quants.rs`, the default Q4_K kernel): per block one integer sum and one integer
/// min-sum, each folded in with one FMA, and the two accumulators subtracted at the end.
pub(crate) fn dot_q4_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for_k4_blocks(n, w, x, 144, q4_k_values, |b| {
        let sumi: i32 = b.pairs.iter().flatten().sum();
        acc = (sumi as f32).mul_add(b.d, acc);
        acc_min = (b.mins.iter().sum::<i32>() as f32).mul_add(b.dmin, acc_min);
    });
    acc - acc_min
}

/// Q4_K with the float arithmetic of llama.cpp's repacked Q4_K gemm, which takes a prompt's
/// activation rows four at a time: as [`dot_q4_k`], but one FMA per pair of sub-blocks
/// (64 values) instead of one per block.
pub(crate) fn dot_q4_k_gemm(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for_k4_blocks(n, w, x, 144, q4_k_values, |b| {
        for (pair, &min) in b.pairs.iter().zip(&b.mins) {
            acc = (pair.iter().sum::<i32>() as f32).mul_add(b.d, acc);
            acc_min = (min as f32).mul_add(b.dmin, acc_min);
        }
    });
    acc - acc_min
}

/// Q5_K as ggml's AVX2 `ggml_vec_dot_q5_K_q8_K` (`LANES` in `x86/k_quants.rs`): per block the
/// pairs' lanes summed lane-wise and FMA'd with d·dy into 8 float lanes, and the block's whole
/// min sum folded into a scalar, `summs += (−dmin·dy)·Σ` (one FMA, as GCC contracts it); at
/// the end [`hsum_float_8`] + `summs`.
pub(crate) fn dot_q5_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut summs) = ([0f32; 8], 0f32);
    for_k4_blocks(n, w, x, 176, q5_k_values, |b| {
        summs = (-b.dmin).mul_add(b.mins.iter().sum::<i32>() as f32, summs);
        fma_lanes(&mut acc, b.d, &add_lanes(&b.pairs));
    });
    hsum_float_8(&acc) + summs
}

/// Q4_K as ggml's AVX2 `ggml_vec_dot_q4_K_q8_K` (for a matrix llama.cpp does not repack): per
/// block the pairs' lanes summed lane-wise and FMA'd with d·dy into 8 float lanes, the four min
/// lanes FMA'd with −dmin·dy into 4 float lanes; at the end [`hsum_float_8`] + [`hsum_float_4`].
pub(crate) fn dot_q4_k_vec_dot(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_m) = ([0f32; 8], [0f32; 4]);
    for_k4_blocks(n, w, x, 144, q4_k_values, |b| {
        fma_lanes(&mut acc_m, -b.dmin, &b.mins);
        fma_lanes(&mut acc, b.d, &add_lanes(&b.pairs));
    });
    hsum_float_8(&acc) + hsum_float_4(&acc_m)
}

/// Q4_K/Q5_K as llama.cpp's tiled kernel computes a prompt's rows: per block
/// r = fma(−dmin, imin, isum·d) and acc = fma(r, dy, acc) (GCC contracts its `acc + r·dy`).
fn dot_k4_tiled(
    n: usize,
    w: &[u8],
    x: &[u8],
    bytes: usize,
    values: fn(&[u8]) -> [i32; QK_K],
) -> f32 {
    let mut acc = 0f32;
    for_k4_blocks(n, w, x, bytes, values, |b| {
        let isum: i32 = b.pairs.iter().flatten().sum();
        let imin: i32 = b.mins.iter().sum();
        let r = (-b.wdmin).mul_add(imin as f32, isum as f32 * b.wd);
        acc = r.mul_add(b.dy, acc);
    });
    acc
}

pub(crate) fn dot_q4_k_tiled(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_k4_tiled(n, w, x, 144, q4_k_values)
}

pub(crate) fn dot_q5_k_tiled(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_k4_tiled(n, w, x, 176, q5_k_values)
}

/// The 256 unsigned 6-bit values of a Q6_K block (ql at 0, qh at 128). Half h (128 values) is
/// four groups of 32: group m takes the low (m < 2) or high (m ≥ 2) nibbles of
/// `ql[64h + 32(m % 2)..][..32]` and bits 2m, 2m+1 of `qh[32h..][..32]`.
fn q6_k_values(b: &[u8]) -> [i32; QK_K] {
    let mut q = [0i32; QK_K];
    for h in 0..2 {
        let (ql, qh) = (&b[64 * h..64 * h + 64], &b[128 + 32 * h..128 + 32 * h + 32]);
        for m in 0..4 {
            for l in 0..32 {
                let lo = (ql[32 * (m % 2) + l] >> (4 * (m / 2))) & 0xF;
                let hi = (qh[l] >> (2 * m)) & 3;
                q[128 * h + 32 * m + l] = (lo | (hi << 4)) as i32;
            }
        }
    }
    q
}

/// Calls `f(d, dy, lanes)` for each super-block: the weight and activation scales and the 8
/// i32 lanes of ggml's AVX2 `ggml_vec_dot_q6_K_q8_K`. For each 32-value group g, lane l adds
/// scale[2g + l/4] times the group's [`lanes_32`] (values 0..64, without the −32 offset); the
/// offset is taken out through the bsums, lane l subtracting
/// 32·(scale[2l]·bsums[2l] + scale[2l+1]·bsums[2l+1]). Σ lanes is Σ scale·(q − 32)·q8.
fn for_q6_k_blocks(n: usize, w: &[u8], x: &[u8], mut f: impl FnMut(f32, f32, [i32; 8])) {
    for i in 0..n / QK_K {
        let (wb, xb) = (&w[210 * i..210 * i + 210], &x[292 * i..292 * i + 292]);
        let q = q6_k_values(wb);
        let sc = |s: usize| wb[192 + s] as i8 as i32;
        let mut lanes: [i32; 8] =
            from_fn(|l| -32 * (sc(2 * l) * bsum(xb, 2 * l) + sc(2 * l + 1) * bsum(xb, 2 * l + 1)));
        for g in 0..8 {
            let p = lanes_32(&q[32 * g..], &xb[4 + 32 * g..]);
            for l in 0..8 {
                lanes[l] += sc(2 * g + l / 4) * p[l];
            }
        }
        f(f16_to_f32(rd_u16(wb, 208)), rd_f32(xb, 0), lanes);
    }
}

/// `ggml_vec_dot_q6_K_q8_K` (AVX2): each block's lanes FMA'd with d·dy into 8 float lanes,
/// [`hsum_float_8`] at the end.
pub(crate) fn dot_q6_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for_q6_k_blocks(n, w, x, |d, dy, lanes| fma_lanes(&mut acc, d * dy, &lanes));
    hsum_float_8(&acc)
}

/// Q6_K with the arithmetic of ggml's tiled kernel: acc = fma(sumi·d, dy, acc) per
/// super-block, sumi its whole integer sum.
pub(crate) fn dot_q6_k_batched(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for_q6_k_blocks(n, w, x, |d, dy, lanes| {
        acc = (lanes.iter().sum::<i32>() as f32 * d).mul_add(dy, acc)
    });
    acc
}
