//! Portable scalar dot products: the reference the SIMD kernels are tested against, and what
//! runs under `NUCLEUS_SIMD=scalar`.
//!
//! They are not ggml's generic C kernels (`ggml_vec_dot_*_generic`): each one computes, for
//! every input, the same f32 bits as the x86 kernel in the same dispatch slot (`x86/`), and
//! so follows ggml's order as llama.cpp builds it for AVX-512 with GCC (`-O3 -march=native`: the
//! AVX2 paths of `arch/x86/quants.c`, the AVX-512 ones of `vec.cpp`, and scalar `a*b + c`
//! contracted into one FMA). The vector arithmetic is written out lane by lane:
//! - Integer products are exact, so they may be summed in any order; what matters is which
//!   integer sums reach the float arithmetic. For a 32-byte block, `vpmaddubsw` + `vpmaddwd`
//!   (or `vpdpbusd`) give 8 i32 lanes, lane `l` summing the products of bytes `4l..4l+4`
//!   ([`lanes_32`]).
//! - `_mm256_fmadd_ps` and `mul_add` are [`f32::mul_add`]; a product and a sum written apart
//!   stay two roundings.
//! - Horizontal sums use the trees of ggml's `hsum_float_8` ([`hsum_float_8`]) and GCC's
//!   `_mm512_reduce_add_ps` ([`reduce_add_16`]).
//!
//! Where `x86/` departs from ggml's AVX-512 build (F32, the Q4_1/Q5_1 min term, the Q5_K mins),
//! these follow `x86/`; the kernels' comments say how. `quant::tests::simd_matches_scalar`
//! checks bit equality with every SIMD level the CPU has.

#![allow(clippy::needless_range_loop)]

use std::array::from_fn;

use super::blocks::{bf16_to_f32, f16_to_f32, rd_f32, rd_u16, rd_u32, QK};
use super::dispatch::DotFn;
use super::scalar_k::{
    dot_q4_k, dot_q4_k_gemm, dot_q4_k_tiled, dot_q4_k_vec_dot, dot_q5_k, dot_q5_k_tiled, dot_q6_k,
    dot_q6_k_batched,
};
use super::types::GgmlType;

/// Dot product of one weight row with one activation row (slices of exact length).
pub(crate) type RowDot = fn(n: usize, w: &[u8], x: &[u8]) -> f32;

macro_rules! wrap {
    ($name:ident, $row:ident, $wty:expr) => {
        /// # Safety
        /// See [`DotFn`].
        unsafe fn $name(
            n: usize,
            w: *const u8,
            x: *const u8,
            stride: usize,
            nx: usize,
            out: *mut f32,
        ) {
            let wb = $wty.row_bytes(n).unwrap();
            let xb = super::vec_dot_type($wty).row_bytes(n).unwrap();
            // SAFETY: the DotFn contract says `w` has `wb` readable bytes, each activation row
            // `xb` bytes, and `out` `nx` writable floats.
            unsafe {
                let w = std::slice::from_raw_parts(w, wb);
                for k in 0..nx {
                    let x = std::slice::from_raw_parts(x.add(k * stride), xb);
                    *out.add(k) = $row(n, w, x);
                }
            }
        }
    };
}
pub(super) use wrap;

wrap!(k_f32, dot_f32, GgmlType::F32);
wrap!(k_f16, dot_f16, GgmlType::F16);
wrap!(k_bf16, dot_bf16, GgmlType::BF16);
wrap!(k_q4_0, dot_q4_0, GgmlType::Q4_0);
wrap!(k_q4_1, dot_q4_1, GgmlType::Q4_1);
wrap!(k_q5_0, dot_q5_0, GgmlType::Q5_0);
wrap!(k_q5_1, dot_q5_1, GgmlType::Q5_1);
wrap!(k_q8_0, dot_q8_0, GgmlType::Q8_0);
wrap!(k_q4_k, dot_q4_k, GgmlType::Q4_K);
wrap!(k_q5_k, dot_q5_k, GgmlType::Q5_K);
wrap!(k_q6_k, dot_q6_k, GgmlType::Q6_K);

/// In [`super::dispatch::slot`] order.
pub(crate) const DOTS: [DotFn; 16] = [
    k_f32,
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
    super::scalar_low_bit::Q2_K,
    super::scalar_low_bit::Q3_K,
    super::scalar_low_bit::IQ4_NL,
    super::scalar_low_bit::IQ4_XS,
    super::scalar_low_bit::MXFP4,
];

wrap!(k_q6_k_batched, dot_q6_k_batched, GgmlType::Q6_K);
wrap!(k_q4_0_block_sums, dot_q4_0_block_sums, GgmlType::Q4_0);
wrap!(k_q4_k_gemm, dot_q4_k_gemm, GgmlType::Q4_K);
wrap!(k_f16_sgemm, dot_f16_sgemm, GgmlType::F16);
wrap!(k_bf16_sgemm, dot_bf16_sgemm, GgmlType::BF16);
wrap!(k_f32_sgemm, dot_f32_sgemm, GgmlType::F32);
wrap!(k_q4_k_vec_dot, dot_q4_k_vec_dot, GgmlType::Q4_K);
wrap!(k_q4_k_tiled, dot_q4_k_tiled, GgmlType::Q4_K);
wrap!(k_q5_k_tiled, dot_q5_k_tiled, GgmlType::Q5_K);

pub(crate) const Q6_K_BATCHED: DotFn = k_q6_k_batched;
pub(crate) const Q4_0_BLOCK_SUMS: DotFn = k_q4_0_block_sums;
pub(crate) const Q4_K_GEMM: DotFn = k_q4_k_gemm;
pub(crate) const F16_SGEMM: DotFn = k_f16_sgemm;
pub(crate) const BF16_SGEMM: DotFn = k_bf16_sgemm;
pub(crate) const F32_SGEMM: DotFn = k_f32_sgemm;
pub(crate) const Q4_K_VEC_DOT: DotFn = k_q4_k_vec_dot;
pub(crate) const Q4_K_TILED: DotFn = k_q4_k_tiled;
pub(crate) const Q5_K_TILED: DotFn = k_q5_k_tiled;

// ---------------------------------------------------------------------------------------------
// The vector arithmetic, per lane.

/// ggml's `hsum_float_8` (`hsum_ps` in `x86/helpers.rs`): the upper four lanes added to the
/// lower four, then [`hsum_float_4`].
pub(super) fn hsum_float_8(v: &[f32; 8]) -> f32 {
    hsum_float_4(&from_fn(|l| v[4 + l] + v[l]))
}

/// The last steps of `hsum_float_8` (`hsum_ps128` in `x86/helpers.rs`): (0+2) + (1+3).
pub(super) fn hsum_float_4(v: &[f32; 4]) -> f32 {
    (v[0] + v[2]) + (v[1] + v[3])
}

/// `_mm512_reduce_add_ps` as GCC defines it: upper 8 lanes + lower 8, then as
/// [`hsum_float_8`].
fn reduce_add_16(a: &[f32; 16]) -> f32 {
    hsum_float_8(&from_fn(|l| a[8 + l] + a[l]))
}

/// `acc = _mm256_fmadd_ps(set1(d), cvtepi32_ps(lanes), acc)`, for any number of lanes.
#[inline(always)]
pub(super) fn fma_lanes<const L: usize>(acc: &mut [f32; L], d: f32, lanes: &[i32; L]) {
    for (a, &s) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(s as f32, *a);
    }
}

/// The 8 i32 lanes of `vpmaddubsw` + `vpmaddwd` (or `vpdpbusd`) over 32 values against 32
/// int8 activations: lane `l` is Σ of the products of elements `4l..4l+4`. (The byte pair sums
/// never saturate for the value ranges of the formats here.)
#[inline(always)]
pub(super) fn lanes_32(q: &[i32], xq: &[u8]) -> [i32; 8] {
    let (q, xq) = (&q[..32], &xq[..32]);
    let mut lanes = [0i32; 8];
    for e in 0..32 {
        lanes[e / 4] += q[e] * xq[e] as i8 as i32;
    }
    lanes
}

/// Lane-wise sum of several groups of lanes.
#[inline(always)]
pub(super) fn add_lanes(groups: &[[i32; 8]]) -> [i32; 8] {
    from_fn(|l| groups.iter().map(|g| g[l]).sum())
}

// ---------------------------------------------------------------------------------------------
// Float types.

/// F32 as ggml's AVX-512 `ggml_vec_dot_f32`: four 16-lane FMA accumulators over steps of 64,
/// reduced (0+2) + (1+3) and then by `_mm512_reduce_add_ps`, the last `n mod 64` products
/// folded in with FMAs (GCC contracts `sumf += x[i]*y[i]`).
pub(crate) fn dot_f32(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let v = |b: &[u8], k: usize| rd_f32(b, 4 * k);
    let steps = n / 64 * 64;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..steps).step_by(64) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                let k = i + 16 * j + l;
                *a = v(w, k).mul_add(v(x, k), *a);
            }
        }
    }
    let total: [f32; 16] = from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let mut sum = reduce_add_16(&total);
    for k in steps..n {
        sum = v(w, k).mul_add(v(x, k), sum);
    }
    sum
}

/// F32 as llama.cpp's sgemm computes batches of two or more rows on AVX-512: one 16-lane FMA
/// accumulator over steps of 16, then `_mm512_reduce_add_ps`. `n` is a multiple of 16.
pub(crate) fn dot_f32_sgemm(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = [0f32; 16];
    for i in (0..n / 16 * 16).step_by(16) {
        for (l, a) in acc.iter_mut().enumerate() {
            *a = rd_f32(w, 4 * (i + l)).mul_add(rd_f32(x, 4 * (i + l)), *a);
        }
    }
    reduce_add_16(&acc)
}

/// F16 as ggml's AVX-512 `ggml_vec_dot_f16` (see `kernels::f16`, which the x86 kernel calls).
pub(crate) fn dot_f16(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    crate::kernels::f16::dot_f16_scalar(&f16_row(w), &f16_row(x))
}

/// F16 as llama.cpp's sgemm computes it for two or more rows (see `kernels::f16`).
pub(crate) fn dot_f16_sgemm(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    crate::kernels::f16::dot_f16_sgemm(&f16_row(w), &f16_row(x))
}

/// A row of little-endian f16 values.
fn f16_row(b: &[u8]) -> Vec<half::f16> {
    b.chunks_exact(2)
        .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

/// BF16 as ggml's `ggml_vec_dot_bf16` computes it on a CPU with AVX512-BF16: two 16-lane
/// `vdpbf16ps` accumulators over steps of 64 elements, each reduced by `_mm512_reduce_add_ps`
/// and summed in f64 with the tail.
pub(crate) fn dot_bf16(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (bf16_row(w), bf16_row(x));
    let n_steps = w.len() / 64 * 64;
    let mut sum = 0f64;
    let mut acc = [[0f32; 16]; 2];
    for i in (0..n_steps).step_by(64) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            let at = i + 32 * j;
            dpbf16(lanes, &w[at..at + 32], &x[at..at + 32]);
        }
    }
    for lanes in &acc {
        sum += reduce_add_16(lanes) as f64;
    }
    for k in n_steps..w.len() {
        sum += (bf16_to_f32(w[k]) * bf16_to_f32(x[k])) as f64;
    }
    sum as f32
}

/// BF16 as llama.cpp's sgemm (tinyBLAS) computes batches of two or more rows on a CPU with
/// AVX512-BF16: one `vdpbf16ps` accumulator over steps of 32, then `_mm512_reduce_add_ps`.
/// `n` must be a multiple of 32.
pub(crate) fn dot_bf16_sgemm(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (bf16_row(w), bf16_row(x));
    let mut acc = [0f32; 16];
    for (wc, xc) in w.chunks_exact(32).zip(x.chunks_exact(32)) {
        dpbf16(&mut acc, wc, xc);
    }
    reduce_add_16(&acc)
}

/// One `vdpbf16ps` over 32 bf16 pairs, as `x86/` emulates it: lane j adds the product of
/// elements 2j+1, then that of elements 2j, each with one FMA, with denormal inputs and
/// results flushed to zero (keeping the sign) as the instruction does.
fn dpbf16(acc: &mut [f32; 16], w: &[u16], x: &[u16]) {
    let ftz = |v: f32| {
        if v.is_subnormal() {
            0.0f32.copysign(v)
        } else {
            v
        }
    };
    let daz = |b: u16| ftz(bf16_to_f32(b));
    for (j, lane) in acc.iter_mut().enumerate() {
        *lane = ftz(daz(w[2 * j + 1]).mul_add(daz(x[2 * j + 1]), *lane));
        *lane = ftz(daz(w[2 * j]).mul_add(daz(x[2 * j]), *lane));
    }
}

/// A row of little-endian bf16 values, as bits.
fn bf16_row(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 32-element formats against Q8_0 / Q8_1. Their values come in ggml's element order: byte j of
// `qs` holds element j (low nibble) and j + 16 (high nibble), bit j of `qh` element j's fifth.

/// The 32 nibbles of 16 bytes, low nibbles first.
#[inline(always)]
fn nibbles(qs: &[u8]) -> [i32; 32] {
    let mut q = [0i32; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0xF) as i32;
        q[j + 16] = (qs[j] >> 4) as i32;
    }
    q
}

/// The 32 five-bit values of 16 nibble bytes and their 32 high bits.
#[inline(always)]
fn nibbles_5(qs: &[u8], qh: u32) -> [i32; 32] {
    let mut q = nibbles(qs);
    for (e, v) in q.iter_mut().enumerate() {
        *v |= (((qh >> e) & 1) << 4) as i32;
    }
    q
}

fn q4_0_values(b: &[u8]) -> [i32; 32] {
    nibbles(&b[2..18]).map(|q| q - 8)
}

fn q5_0_values(b: &[u8]) -> [i32; 32] {
    nibbles_5(&b[6..22], rd_u32(b, 2)).map(|q| q - 16)
}

fn q8_0_values(b: &[u8]) -> [i32; 32] {
    from_fn(|e| b[2 + e] as i8 as i32)
}

fn q4_1_values(b: &[u8]) -> [i32; 32] {
    nibbles(&b[4..20])
}

fn q5_1_values(b: &[u8]) -> [i32; 32] {
    nibbles_5(&b[8..24], rd_u32(b, 4))
}

/// Calls `f(dw·dx, lanes)` for each block of a signed format (`bytes` per block, `values`
/// unpacking one) against Q8_0: the product of the two f16 scales and the block's
/// [`lanes_32`].
fn for_q8_0_blocks(
    n: usize,
    w: &[u8],
    x: &[u8],
    bytes: usize,
    values: fn(&[u8]) -> [i32; 32],
    mut f: impl FnMut(f32, [i32; 8]),
) {
    for i in 0..n / QK {
        let (wb, xb) = (&w[bytes * i..bytes * (i + 1)], &x[34 * i..34 * i + 34]);
        let d = f16_to_f32(rd_u16(wb, 0)) * f16_to_f32(rd_u16(xb, 0));
        f(d, lanes_32(&values(wb), &xb[2..]));
    }
}

/// `ggml_vec_dot_q{4,5,8}_0_q8_0` (AVX2): each block's lanes FMA'd with dw·dx into 8 float
/// lanes, [`hsum_float_8`] at the end.
fn dot_signed_q8_0(
    n: usize,
    w: &[u8],
    x: &[u8],
    bytes: usize,
    values: fn(&[u8]) -> [i32; 32],
) -> f32 {
    let mut acc = [0f32; 8];
    for_q8_0_blocks(n, w, x, bytes, values, |d, lanes| {
        fma_lanes(&mut acc, d, &lanes)
    });
    hsum_float_8(&acc)
}

pub(crate) fn dot_q4_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_signed_q8_0(n, w, x, 18, q4_0_values)
}

pub(crate) fn dot_q5_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_signed_q8_0(n, w, x, 22, q5_0_values)
}

pub(crate) fn dot_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_signed_q8_0(n, w, x, 34, q8_0_values)
}

/// Q4_0 with the arithmetic of ggml's repacked Q4_0 kernels: acc = fma(sumi, dw·dx, acc), with
/// sumi the block's whole integer dot product.
pub(crate) fn dot_q4_0_block_sums(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for_q8_0_blocks(n, w, x, 18, q4_0_values, |d, lanes| {
        acc = (lanes.iter().sum::<i32>() as f32).mul_add(d, acc)
    });
    acc
}

/// `ggml_vec_dot_q{4,5}_1_q8_1` (AVX2) as `x86/` computes it: each block's lanes FMA'd with
/// dw·dx into 8 float lanes; the min terms summed apart as `summs += mw·sx`, one FMA (as GCC
/// contracts ggml's line), and added after [`hsum_float_8`].
fn dot_unsigned_q8_1(
    n: usize,
    w: &[u8],
    x: &[u8],
    bytes: usize,
    values: fn(&[u8]) -> [i32; 32],
) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for i in 0..n / QK {
        let (wb, xb) = (&w[bytes * i..bytes * (i + 1)], &x[36 * i..36 * i + 36]);
        let (dw, mw) = (f16_to_f32(rd_u16(wb, 0)), f16_to_f32(rd_u16(wb, 2)));
        let (dx, sx) = (f16_to_f32(rd_u16(xb, 0)), f16_to_f32(rd_u16(xb, 2)));
        fma_lanes(&mut acc, dw * dx, &lanes_32(&values(wb), &xb[4..]));
        summs = mw.mul_add(sx, summs);
    }
    hsum_float_8(&acc) + summs
}

pub(crate) fn dot_q4_1(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_unsigned_q8_1(n, w, x, 20, q4_1_values)
}

pub(crate) fn dot_q5_1(n: usize, w: &[u8], x: &[u8]) -> f32 {
    dot_unsigned_q8_1(n, w, x, 24, q5_1_values)
}

#[allow(dead_code)]
pub(crate) fn row_dot(ty: GgmlType) -> RowDot {
    use GgmlType::*;
    match ty {
        F32 => dot_f32,
        F16 => dot_f16,
        BF16 => dot_bf16,
        Q4_0 => dot_q4_0,
        Q4_1 => dot_q4_1,
        Q5_0 => dot_q5_0,
        Q5_1 => dot_q5_1,
        Q8_0 => dot_q8_0,
        Q4_K => dot_q4_k,
        Q5_K => dot_q5_k,
        Q6_K => dot_q6_k,
        Q2_K => super::scalar_low_bit::dot_q2_k,
        Q3_K => super::scalar_low_bit::dot_q3_k,
        IQ4_NL => super::scalar_low_bit::dot_iq4_nl,
        IQ4_XS => super::scalar_low_bit::dot_iq4_xs,
        MXFP4 => super::scalar_low_bit::dot_mxfp4,
        _ => panic!("no dot for {ty}"),
    }
}
