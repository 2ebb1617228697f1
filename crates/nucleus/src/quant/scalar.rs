//! Portable scalar dot products (ggml's `ggml_vec_dot_*_generic`): integer sums per block,
//! scaled in f32. These are the reference the SIMD kernels are tested against.

#![allow(clippy::needless_range_loop)]

use super::blocks::{bf16_to_f32, f16_to_f32, rd_f32, rd_u16, rd_u32, scale_min_k4, QK, QK_K};
use super::dispatch::DotFn;
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
pub(crate) const DOTS: [DotFn; 11] = [
    k_f32, k_f16, k_bf16, k_q4_0, k_q4_1, k_q5_0, k_q5_1, k_q8_0, k_q4_k, k_q5_k, k_q6_k,
];

pub(crate) fn dot_f32(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut s = 0f64;
    for (a, b) in w.chunks_exact(4).zip(x.chunks_exact(4)) {
        let a = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
        let b = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        s += (a * b) as f64;
    }
    s as f32
}

pub(crate) fn dot_f16(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    crate::kernels::f16::dot_f16_scalar(&f16_row(w), &f16_row(x))
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

/// One `vdpbf16ps` over 32 bf16 pairs: lane j adds the product of elements 2j+1, then that of
/// elements 2j, rounding each sum to f32 (the products of two bf16 values are exact), with
/// denormal inputs and results flushed to zero as the instruction does.
fn dpbf16(acc: &mut [f32; 16], w: &[u16], x: &[u16]) {
    let daz = |b: u16| if b & 0x7f80 == 0 { 0.0 } else { bf16_to_f32(b) };
    let ftz = |v: f32| if v.is_subnormal() { 0.0f32.copysign(v) } else { v };
    for (j, lane) in acc.iter_mut().enumerate() {
        let odd = daz(w[2 * j + 1]) * daz(x[2 * j + 1]);
        *lane = ftz(*lane + ftz(odd));
        let even = daz(w[2 * j]) * daz(x[2 * j]);
        *lane = ftz(*lane + ftz(even));
    }
}

/// `_mm512_reduce_add_ps` as GCC defines it: upper 8 lanes + lower 8, upper 4 + lower 4,
/// then (0+2) + (1+3).
fn reduce_add_16(a: &[f32; 16]) -> f32 {
    let t8: [f32; 8] = std::array::from_fn(|l| a[8 + l] + a[l]);
    let t4: [f32; 4] = std::array::from_fn(|l| t8[4 + l] + t8[l]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// A row of little-endian bf16 values, as bits.
fn bf16_row(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

#[inline(always)]
fn q8(b: &[u8], at: usize) -> i32 {
    b[at] as i8 as i32
}

pub(crate) fn dot_q4_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for_q4_0_blocks(n, w, x, |d, sumi| sumf += sumi as f32 * d);
    sumf
}

/// Q4_0 with the arithmetic of ggml's repacked Q4_0 kernels: acc = fma(sumi, dw·dx, acc).
pub(crate) fn dot_q4_0_block_sums(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for_q4_0_blocks(n, w, x, |d, sumi| acc = (sumi as f32).mul_add(d, acc));
    acc
}

/// Calls `f(dw·dx, sumi)` for each block: the product of the scales and the exact integer dot
/// product Σ (q − 8)·q8.
fn for_q4_0_blocks(n: usize, w: &[u8], x: &[u8], mut f: impl FnMut(f32, i32)) {
    for i in 0..n / QK {
        let (wb, xb) = (&w[18 * i..18 * i + 18], &x[34 * i..34 * i + 34]);
        let mut sumi = 0i32;
        for j in 0..16 {
            let q = wb[2 + j];
            sumi += ((q & 0xF) as i32 - 8) * q8(xb, 2 + j);
            sumi += ((q >> 4) as i32 - 8) * q8(xb, 18 + j);
        }
        f(f16_to_f32(rd_u16(wb, 0)) * f16_to_f32(rd_u16(xb, 0)), sumi);
    }
}

wrap!(k_q4_0_block_sums, dot_q4_0_block_sums, GgmlType::Q4_0);
pub(crate) const Q4_0_BLOCK_SUMS: DotFn = k_q4_0_block_sums;

pub(crate) fn dot_q4_1(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK {
        let (wb, xb) = (&w[20 * i..20 * i + 20], &x[36 * i..36 * i + 36]);
        let mut sumi = 0i32;
        for j in 0..16 {
            let q = wb[4 + j];
            sumi += (q & 0xF) as i32 * q8(xb, 4 + j);
            sumi += (q >> 4) as i32 * q8(xb, 20 + j);
        }
        let (dw, mw) = (f16_to_f32(rd_u16(wb, 0)), f16_to_f32(rd_u16(wb, 2)));
        let (dx, sx) = (f16_to_f32(rd_u16(xb, 0)), f16_to_f32(rd_u16(xb, 2)));
        sumf += sumi as f32 * (dw * dx) + mw * sx;
    }
    sumf
}

pub(crate) fn dot_q5_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK {
        let (wb, xb) = (&w[22 * i..22 * i + 22], &x[34 * i..34 * i + 34]);
        let qh = rd_u32(wb, 2);
        let mut sumi = 0i32;
        for j in 0..16 {
            let q = wb[6 + j] as u32;
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            sumi += (((q & 0xF) | h0) as i32 - 16) * q8(xb, 2 + j);
            sumi += (((q >> 4) | h1) as i32 - 16) * q8(xb, 18 + j);
        }
        sumf += sumi as f32 * (f16_to_f32(rd_u16(wb, 0)) * f16_to_f32(rd_u16(xb, 0)));
    }
    sumf
}

pub(crate) fn dot_q5_1(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK {
        let (wb, xb) = (&w[24 * i..24 * i + 24], &x[36 * i..36 * i + 36]);
        let qh = rd_u32(wb, 4);
        let mut sumi = 0i32;
        for j in 0..16 {
            let q = wb[8 + j] as u32;
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            sumi += ((q & 0xF) | h0) as i32 * q8(xb, 4 + j);
            sumi += ((q >> 4) | h1) as i32 * q8(xb, 20 + j);
        }
        let (dw, mw) = (f16_to_f32(rd_u16(wb, 0)), f16_to_f32(rd_u16(wb, 2)));
        let (dx, sx) = (f16_to_f32(rd_u16(xb, 0)), f16_to_f32(rd_u16(xb, 2)));
        sumf += sumi as f32 * (dw * dx) + mw * sx;
    }
    sumf
}

pub(crate) fn dot_q8_0(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK {
        let (wb, xb) = (&w[34 * i..34 * i + 34], &x[34 * i..34 * i + 34]);
        let mut sumi = 0i32;
        for j in 0..QK {
            sumi += q8(wb, 2 + j) * q8(xb, 2 + j);
        }
        sumf += sumi as f32 * (f16_to_f32(rd_u16(wb, 0)) * f16_to_f32(rd_u16(xb, 0)));
    }
    sumf
}

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

/// Σ over the 8 sub-blocks of `min_j * (bsums[2j] + bsums[2j+1])` of a Q8_K block.
#[inline(always)]
fn k_mins_dot(mins: &[i32; 8], xb: &[u8]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += mins[j / 2] * rd_u16(xb, 260 + 2 * j) as i16 as i32;
    }
    s
}

/// Q4_K with the float arithmetic of llama.cpp's repacked Q4_K kernels (see `x86::dot_k4_like`):
/// per block one integer sum and one integer min-sum, each folded in with one FMA, and the
/// two accumulators subtracted at the end.
pub(crate) fn dot_q4_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for i in 0..n / QK_K {
        let (wb, xb) = (&w[144 * i..144 * i + 144], &x[292 * i..292 * i + 292]);
        let sc = &wb[4..16];
        let qs = &wb[16..144];
        let (scales, mins) = k4_scales_mins(sc);
        let mut sumi = 0i32;
        for j in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                lo += (q & 0xF) as i32 * q8(xb, 4 + 64 * j + l);
                hi += (q >> 4) as i32 * q8(xb, 4 + 64 * j + 32 + l);
            }
            sumi += scales[2 * j] * lo + scales[2 * j + 1] * hi;
        }
        let dy = rd_f32(xb, 0);
        let d = f16_to_f32(rd_u16(wb, 0)) * dy;
        let dmin = f16_to_f32(rd_u16(wb, 2)) * dy;
        acc = (sumi as f32).mul_add(d, acc);
        acc_min = (k_mins_dot(&mins, xb) as f32).mul_add(dmin, acc_min);
    }
    acc - acc_min
}

/// Q4_K with the float arithmetic of llama.cpp's repacked Q4_K gemm, which takes a prompt's
/// activation rows four at a time: the same integer sums as [`dot_q4_k`], but folded in with one
/// FMA per pair of sub-blocks (64 values) instead of one per block.
pub(crate) fn dot_q4_k_gemm(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for i in 0..n / QK_K {
        let (wb, xb) = (&w[144 * i..144 * i + 144], &x[292 * i..292 * i + 292]);
        let (scales, mins) = k4_scales_mins(&wb[4..16]);
        let qs = &wb[16..144];
        let dy = rd_f32(xb, 0);
        let d = f16_to_f32(rd_u16(wb, 0)) * dy;
        let dmin = f16_to_f32(rd_u16(wb, 2)) * dy;
        let bsum = |j: usize| rd_u16(xb, 260 + 2 * j) as i16 as i32;
        for j in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                lo += (q & 0xF) as i32 * q8(xb, 4 + 64 * j + l);
                hi += (q >> 4) as i32 * q8(xb, 4 + 64 * j + 32 + l);
            }
            let sumi = scales[2 * j] * lo + scales[2 * j + 1] * hi;
            let min_sum = mins[2 * j] * (bsum(4 * j) + bsum(4 * j + 1))
                + mins[2 * j + 1] * (bsum(4 * j + 2) + bsum(4 * j + 3));
            acc = (sumi as f32).mul_add(d, acc);
            acc_min = (min_sum as f32).mul_add(dmin, acc_min);
        }
    }
    acc - acc_min
}

wrap!(k_q4_k_gemm, dot_q4_k_gemm, GgmlType::Q4_K);
pub(crate) const Q4_K_GEMM: DotFn = k_q4_k_gemm;

pub(crate) fn dot_q5_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for i in 0..n / QK_K {
        let (wb, xb) = (&w[176 * i..176 * i + 176], &x[292 * i..292 * i + 292]);
        let sc = &wb[4..16];
        let qh = &wb[16..48];
        let qs = &wb[48..176];
        let (scales, mins) = k4_scales_mins(sc);
        let mut sumi = 0i32;
        for j in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                let h0 = ((qh[l] >> (2 * j)) & 1) << 4;
                let h1 = ((qh[l] >> (2 * j + 1)) & 1) << 4;
                lo += ((q & 0xF) | h0) as i32 * q8(xb, 4 + 64 * j + l);
                hi += ((q >> 4) | h1) as i32 * q8(xb, 4 + 64 * j + 32 + l);
            }
            sumi += scales[2 * j] * lo + scales[2 * j + 1] * hi;
        }
        let dy = rd_f32(xb, 0);
        let d = f16_to_f32(rd_u16(wb, 0)) * dy;
        let dmin = f16_to_f32(rd_u16(wb, 2)) * dy;
        sumf += d * sumi as f32 - dmin * k_mins_dot(&mins, xb) as f32;
    }
    sumf
}

pub(crate) fn dot_q6_k(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for_q6_k_blocks(n, w, x, |d, dy, sumi| sumf += d * dy * sumi as f32);
    sumf
}

/// Q6_K with the arithmetic of ggml's tiled kernel: acc = acc + (sumi·d)·dy per super-block.
pub(crate) fn dot_q6_k_batched(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for_q6_k_blocks(n, w, x, |d, dy, sumi| acc = (sumi as f32 * d).mul_add(dy, acc));
    acc
}

wrap!(k_q6_k_batched, dot_q6_k_batched, GgmlType::Q6_K);

/// F16 as llama.cpp's sgemm computes it for two or more rows (see `kernels::f16`).
pub(crate) fn dot_f16_sgemm(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    crate::kernels::f16::dot_f16_sgemm(&f16_row(w), &f16_row(x))
}

wrap!(k_f16_sgemm, dot_f16_sgemm, GgmlType::F16);
pub(crate) const F16_SGEMM: DotFn = k_f16_sgemm;
wrap!(k_bf16_sgemm, dot_bf16_sgemm, GgmlType::BF16);
pub(crate) const BF16_SGEMM: DotFn = k_bf16_sgemm;
pub(crate) const Q6_K_BATCHED: DotFn = k_q6_k_batched;

/// Calls `f(d, dy, sumi)` for each super-block: the weight and activation scales and the
/// exact integer dot product Σ scale·(q − 32)·q8.
fn for_q6_k_blocks(n: usize, w: &[u8], x: &[u8], mut f: impl FnMut(f32, f32, i32)) {
    for i in 0..n / QK_K {
        let (wb, xb) = (&w[210 * i..210 * i + 210], &x[292 * i..292 * i + 292]);
        let mut sumi = 0i32;
        for h in 0..2 {
            let ql = &wb[64 * h..64 * h + 64];
            let qh = &wb[128 + 32 * h..128 + 32 * h + 32];
            let sc = &wb[192 + 8 * h..192 + 8 * h + 8];
            let xq = 4 + 128 * h;
            // Four groups of 32 elements; each group has two 16-element scales.
            let mut g = [[0i32; 2]; 4];
            for l in 0..32 {
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                g[0][l / 16] += q1 * q8(xb, xq + l);
                g[1][l / 16] += q2 * q8(xb, xq + 32 + l);
                g[2][l / 16] += q3 * q8(xb, xq + 64 + l);
                g[3][l / 16] += q4 * q8(xb, xq + 96 + l);
            }
            for (m, gm) in g.iter().enumerate() {
                sumi += sc[2 * m] as i8 as i32 * gm[0] + sc[2 * m + 1] as i8 as i32 * gm[1];
            }
        }
        f(f16_to_f32(rd_u16(wb, 208)), rd_f32(xb, 0), sumi);
    }
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
        _ => panic!("no dot for {ty}"),
    }
}
