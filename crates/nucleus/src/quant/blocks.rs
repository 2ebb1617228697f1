//! Block layouts (ggml's `block_*` structs, packed, little-endian), dequantization and the
//! reference quantizers.
//!
//! Layouts (bytes):
//! - Q4_0 (18): d f16, qs[16]            x = d * (nibble - 8)
//! - Q4_1 (20): d f16, m f16, qs[16]     x = d * nibble + m
//! - Q5_0 (22): d f16, qh u32, qs[16]    x = d * ((nibble | hbit << 4) - 16)
//! - Q5_1 (24): d f16, m f16, qh u32, qs[16]
//! - Q8_0 (34): d f16, qs[32] i8
//! - Q8_1 (36): d f16, s f16 (= d * sum qs), qs[32] i8
//! - Q4_K (144): d f16, dmin f16, scales[12] (8 × 6-bit scale + 8 × 6-bit min), qs[128]
//! - Q5_K (176): d f16, dmin f16, scales[12], qh[32], qs[128]
//! - Q6_K (210): ql[128], qh[64], scales[16] i8, d f16
//! - Q8_K (292): d f32, qs[256] i8, bsums[16] i16
//! - Q2_K, Q3_K, IQ4_NL, IQ4_XS: see `blocks_low_bit.rs`
//!
//! In the 32-element formats, byte `j` of `qs` holds element `j` (low nibble) and `j + 16`
//! (high nibble); bit `j` of `qh` is the fifth bit of element `j`.

#![allow(clippy::needless_range_loop)]

use super::types::GgmlType;

pub(crate) const QK: usize = 32;
pub(crate) const QK_K: usize = 256;

#[inline(always)]
pub(crate) fn rd_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
pub(crate) fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
pub(crate) fn rd_f32(b: &[u8], at: usize) -> f32 {
    f32::from_bits(rd_u32(b, at))
}

#[inline(always)]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 → f16 bits, round to nearest even (F16C's `vcvtps2ph` with mode 0, as ggml on x86).
#[inline(always)]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

#[inline(always)]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 → bf16 bits exactly as ggml's `ggml_compute_fp32_to_bf16`.
#[inline(always)]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        // NaN: force quiet.
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// ggml's `nearest_int`: round half to even through the 1.5·2^23 trick (|x| < 2^22).
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0f32;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Scale and min `j` (0..8) of a Q4_K/Q5_K block from its 12 packed bytes
/// (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn check_lengths(ty: GgmlType, bytes: usize, n: usize, what: &str) {
    let need = ty
        .row_bytes(n)
        .unwrap_or_else(|| panic!("{what}: {n} elements is not a whole number of {ty} blocks"));
    assert_eq!(
        bytes, need,
        "{what}: {ty} row of {n} elements needs {need} bytes, got {bytes}"
    );
}

/// Dequantizes one row: `dst.len()` elements from `src` (exactly `ty.row_bytes(dst.len())`
/// bytes). Supports every computable type plus Q8_1 and Q8_K.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    check_lengths(ty, src.len(), dst.len(), "dequantize_row");
    use GgmlType::*;
    match ty {
        F32 => dequantize_f32(src, dst),
        F16 => dequantize_f16(src, dst),
        BF16 => dequantize_bf16(src, dst),
        Q4_0 => dequantize_q4_0(src, dst),
        Q4_1 => dequantize_q4_1(src, dst),
        Q5_0 => dequantize_q5_0(src, dst),
        Q5_1 => dequantize_q5_1(src, dst),
        Q8_0 => dequantize_q8_0(src, dst),
        Q8_1 => dequantize_q8_1(src, dst),
        Q8_K => dequantize_q8_k(src, dst),
        Q4_K => dequantize_q4_k(src, dst),
        Q5_K => dequantize_q5_k(src, dst),
        Q6_K => dequantize_q6_k(src, dst),
        Q2_K => super::blocks_low_bit::dequantize_q2_k(src, dst),
        Q3_K => super::blocks_low_bit::dequantize_q3_k(src, dst),
        IQ4_NL => super::blocks_low_bit::dequantize_iq4_nl(src, dst),
        IQ4_XS => super::blocks_low_bit::dequantize_iq4_xs(src, dst),
        MXFP4 => super::blocks_low_bit::dequantize_mxfp4(src, dst),
        _ => panic!("dequantize_row: {ty} is not supported"),
    }
}

/// F32 blocks: little-endian f32.
fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// F16 blocks: IEEE half.
fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// BF16 blocks: bfloat16.
fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// Q4_0 blocks: d·(nibble − 8).
fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(18)) {
        let d = f16_to_f32(rd_u16(b, 0));
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
            y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// Q4_1 blocks: d·nibble + m.
fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(20)) {
        let d = f16_to_f32(rd_u16(b, 0));
        let m = f16_to_f32(rd_u16(b, 2));
        for j in 0..16 {
            let q = b[4 + j];
            y[j] = (q & 0xF) as f32 * d + m;
            y[j + 16] = (q >> 4) as f32 * d + m;
        }
    }
}

/// Q5_0 blocks: d·(five bits − 16).
fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(22)) {
        let d = f16_to_f32(rd_u16(b, 0));
        let qh = rd_u32(b, 2);
        for j in 0..16 {
            let q = b[6 + j];
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            y[j] = (((q & 0xF) as u32 | h0) as i32 - 16) as f32 * d;
            y[j + 16] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
        }
    }
}

/// Q5_1 blocks: d·five bits + m.
fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(24)) {
        let d = f16_to_f32(rd_u16(b, 0));
        let m = f16_to_f32(rd_u16(b, 2));
        let qh = rd_u32(b, 4);
        for j in 0..16 {
            let q = b[8 + j];
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            y[j] = ((q & 0xF) as u32 | h0) as f32 * d + m;
            y[j + 16] = ((q >> 4) as u32 | h1) as f32 * d + m;
        }
    }
}

/// Q8_0 blocks: d·q.
fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(34)) {
        let d = f16_to_f32(rd_u16(b, 0));
        for j in 0..QK {
            y[j] = b[2 + j] as i8 as f32 * d;
        }
    }
}

/// Q8_1 blocks: d·q (the block sum unused).
fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(36)) {
        let d = f16_to_f32(rd_u16(b, 0));
        for j in 0..QK {
            y[j] = b[4 + j] as i8 as f32 * d;
        }
    }
}

/// Q8_K blocks: d·q (f32 d, blocks of 256).
fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(292)) {
        let d = rd_f32(b, 0);
        for j in 0..QK_K {
            y[j] = d * b[4 + j] as i8 as f32;
        }
    }
}

/// Q4_K blocks: per 32 values d·scale·nibble − dmin·min (six-bit scales and mins).
fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(144)) {
        let d = f16_to_f32(rd_u16(b, 0));
        let dmin = f16_to_f32(rd_u16(b, 2));
        let sc = &b[4..16];
        let qs = &b[16..144];
        for j in 0..4 {
            let (s1, m1) = scale_min_k4(2 * j, sc);
            let (s2, m2) = scale_min_k4(2 * j + 1, sc);
            let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
            let q = &qs[32 * j..32 * j + 32];
            let y = &mut y[64 * j..64 * j + 64];
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xF) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// Q5_K blocks: Q4_K with a fifth bit per value.
fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(176)) {
        let d = f16_to_f32(rd_u16(b, 0));
        let dmin = f16_to_f32(rd_u16(b, 2));
        let sc = &b[4..16];
        let qh = &b[16..48];
        let qs = &b[48..176];
        for j in 0..4 {
            let (s1, m1) = scale_min_k4(2 * j, sc);
            let (s2, m2) = scale_min_k4(2 * j + 1, sc);
            let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
            let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
            let q = &qs[32 * j..32 * j + 32];
            let y = &mut y[64 * j..64 * j + 64];
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((q[l] & 0xF) + h1) as f32 - m1;
                y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

/// Q6_K blocks: d·(int8 scale)·(six bits − 32), per 16 values.
fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(210)) {
        let d = f16_to_f32(rd_u16(b, 208));
        for half_ in 0..2 {
            let ql = &b[64 * half_..64 * half_ + 64];
            let qh = &b[128 + 32 * half_..128 + 32 * half_ + 32];
            let sc = &b[192 + 8 * half_..192 + 8 * half_ + 8];
            let y = &mut y[128 * half_..128 * half_ + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * (sc[is] as i8 as f32) * q1 as f32;
                y[l + 32] = d * (sc[is + 2] as i8 as f32) * q2 as f32;
                y[l + 64] = d * (sc[is + 4] as i8 as f32) * q3 as f32;
                y[l + 96] = d * (sc[is + 6] as i8 as f32) * q4 as f32;
            }
        }
    }
}

/// The largest magnitude and the signed value of the first element that has it (ggml's loop:
/// `if (|x| > amax) { amax = |x|; max = x; }` from 0, which skips NaNs): the magnitude first,
/// eight lanes at a time, then the first element that reaches it.
#[inline]
pub(super) fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let amax = absmax(x);
    if amax == 0.0 {
        // +0, as ggml's loop leaves it (not the −0 an element may hold).
        return (0.0, 0.0);
    }
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
    (amax, max)
}

/// The largest magnitude (NaNs skipped, 0 for none), in eight lanes so that it vectorizes: a
/// maximum does not depend on the order it is taken in.
#[inline]
fn absmax(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = l.max(v.abs());
        }
    }
    let head = lanes.iter().fold(0f32, |a, &l| a.max(l));
    tail.iter().fold(head, |a, v| a.max(v.abs()))
}

/// Writes one block's bytes from its values.
type BlockQuantizer = fn(&[f32], &mut [u8]);

/// Quantizes one row with ggml's reference quantizers (`quantize_row_*_ref`): `src.len()`
/// elements into `dst` (exactly `ty.row_bytes(src.len())` bytes). Supports F32, F16, BF16,
/// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and Q8_K.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    check_lengths(ty, dst.len(), src.len(), "quantize_row");
    use GgmlType::*;
    // (values, bytes) of a block, and how one is written.
    let (values, bytes, block): (usize, usize, BlockQuantizer) = match ty {
        F32 => (1, 4, |x, b| b.copy_from_slice(&x[0].to_le_bytes())),
        F16 => (1, 2, |x, b| {
            b.copy_from_slice(&f32_to_f16(x[0]).to_le_bytes())
        }),
        BF16 => (1, 2, |x, b| {
            b.copy_from_slice(&f32_to_bf16(x[0]).to_le_bytes())
        }),
        Q4_0 => (QK, 18, quantize_block_q4_0),
        Q4_1 => (QK, 20, quantize_block_q4_1),
        Q5_0 => (QK, 22, quantize_block_q5_0),
        Q5_1 => (QK, 24, quantize_block_q5_1),
        Q8_0 => (QK, 34, quantize_block_q8_0),
        Q8_1 => (QK, 36, quantize_block_q8_1),
        Q8_K => (QK_K, 292, q8_k_quantizer()),
        _ => panic!("quantize_row: {ty} is not supported"),
    };
    for (x, b) in src.chunks_exact(values).zip(dst.chunks_exact_mut(bytes)) {
        block(x, b);
    }
}

fn quantize_block_q4_0(x: &[f32], b: &mut [u8]) {
    let (_, max) = signed_absmax(x);
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    for j in 0..16 {
        let x0 = x[j] * id;
        let x1 = x[16 + j] * id;
        let q0 = ((x0 + 8.5) as i8).min(15) as u8;
        let q1 = ((x1 + 8.5) as i8).min(15) as u8;
        b[2 + j] = q0 | (q1 << 4);
    }
}

/// Q4_1's and Q5_1's header: the block's minimum and the step of `levels` steps up to its
/// maximum, as two f16 at `b[0..4]`; returns the minimum and 1/step (0 for a flat block).
fn write_min_step(x: &[f32], levels: f32, b: &mut [u8]) -> (f32, f32) {
    let min = x.iter().fold(f32::MAX, |a, &v| if v < a { v } else { a });
    let max = x.iter().fold(-f32::MAX, |a, &v| if v > a { v } else { a });
    let d = (max - min) / levels;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    b[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
    (min, id)
}

fn quantize_block_q4_1(x: &[f32], b: &mut [u8]) {
    let (min, id) = write_min_step(x, 15.0, b);
    for j in 0..16 {
        let x0 = (x[j] - min) * id;
        let x1 = (x[16 + j] - min) * id;
        let q0 = ((x0 + 0.5) as i8).min(15) as u8;
        let q1 = ((x1 + 0.5) as i8).min(15) as u8;
        b[4 + j] = q0 | (q1 << 4);
    }
}

fn quantize_block_q5_0(x: &[f32], b: &mut [u8]) {
    let (_, max) = signed_absmax(x);
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    let mut qh = 0u32;
    for j in 0..16 {
        let x0 = x[j] * id;
        let x1 = x[16 + j] * id;
        let q0 = ((x0 + 16.5) as i8).min(31) as u8;
        let q1 = ((x1 + 16.5) as i8).min(31) as u8;
        b[6 + j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + 16);
    }
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

fn quantize_block_q5_1(x: &[f32], b: &mut [u8]) {
    let (min, id) = write_min_step(x, 31.0, b);
    let mut qh = 0u32;
    for j in 0..16 {
        let x0 = (x[j] - min) * id;
        let x1 = (x[16 + j] - min) * id;
        let q0 = (x0 + 0.5) as u8;
        let q1 = (x1 + 0.5) as u8;
        b[8 + j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + 16);
    }
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

fn quantize_block_q8_0(x: &[f32], b: &mut [u8]) {
    let amax = absmax(x);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    for j in 0..QK {
        b[2 + j] = (x[j] * id).round() as i8 as u8;
    }
}

fn quantize_block_q8_1(x: &[f32], b: &mut [u8]) {
    let amax = absmax(x);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for j in 0..QK {
        let q = (x[j] * id).round() as i8;
        sum += q as i32;
        b[4 + j] = q as u8;
    }
    b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    b[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
}

/// [`quantize_block_q8_k`], with AVX-512 where the CPU has it (the same bits).
fn q8_k_quantizer() -> BlockQuantizer {
    #[cfg(target_arch = "x86_64")]
    if super::simd_level() >= super::SimdLevel::Avx512 {
        return quantize_block_q8_k_avx512;
    }
    quantize_block_q8_k
}

/// Only returned by [`q8_k_quantizer`] where the CPU has AVX-512.
#[cfg(target_arch = "x86_64")]
fn quantize_block_q8_k_avx512(x: &[f32], b: &mut [u8]) {
    // SAFETY: AVX-512 F/BW: `q8_k_quantizer` hands this out only where the level says so.
    unsafe { super::x86::quantize_block_q8_k(x, b) }
}

pub(super) fn quantize_block_q8_k(x: &[f32], b: &mut [u8]) {
    let (amax, max) = signed_absmax(x);
    if amax == 0.0 {
        b.fill(0);
        return;
    }
    let iscale = -127.0f32 / max;
    for j in 0..QK_K {
        b[4 + j] = nearest_int(iscale * x[j]).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let s: i32 = b[4 + 16 * j..4 + 16 * j + 16]
            .iter()
            .map(|&q| q as i8 as i32)
            .sum();
        b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
    }
    b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

/// Quantizes activations as ggml's x86 CPU backend does before a matrix product
/// (`quantize_row_q8_0`/`q8_1` AVX versions: scale `127 / amax`, round half to even; Q8_K and
/// the float types use the reference quantizers). This is what [`quantize_row`] does for every
/// other type.
pub fn quantize_row_act(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    use GgmlType::*;
    match ty {
        Q8_0 => {
            check_lengths(ty, dst.len(), src.len(), "quantize_row_act");
            for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(34)) {
                let amax = absmax(x);
                let d = amax / 127.0;
                let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                for j in 0..QK {
                    b[2 + j] = nearest_int(x[j] * id) as i8 as u8;
                }
            }
        }
        Q8_1 => {
            check_lengths(ty, dst.len(), src.len(), "quantize_row_act");
            for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(36)) {
                let amax = absmax(x);
                let d = amax / 127.0;
                let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                let mut sum = 0i32;
                for j in 0..QK {
                    let q = nearest_int(x[j] * id) as i8;
                    sum += q as i32;
                    b[4 + j] = q as u8;
                }
                b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                b[2..4].copy_from_slice(&f32_to_f16(d * sum as f32).to_le_bytes());
            }
        }
        _ => quantize_row(ty, src, dst),
    }
}

/// Rewrites a Q4_0 or Q5_0 row as Q8_0 with the same scales and the same integer values, so
/// that a Q8_0 dot product of it is bit-identical to the original type's (used to unpack
/// weight rows once for many activation rows). Returns false for other types.
pub(crate) fn unpack_row_to_q8_0_scalar(ty: GgmlType, src: &[u8], dst: &mut [u8]) -> bool {
    match ty {
        GgmlType::Q4_0 => {
            for (y, b) in dst.chunks_exact_mut(34).zip(src.chunks_exact(18)) {
                y[..2].copy_from_slice(&b[..2]);
                for j in 0..16 {
                    let q = b[2 + j];
                    y[2 + j] = ((q & 0xF) as i8 - 8) as u8;
                    y[18 + j] = ((q >> 4) as i8 - 8) as u8;
                }
            }
            true
        }
        GgmlType::Q5_0 => {
            for (y, b) in dst.chunks_exact_mut(34).zip(src.chunks_exact(22)) {
                y[..2].copy_from_slice(&b[..2]);
                let qh = rd_u32(b, 2);
                for j in 0..16 {
                    let q = b[6 + j];
                    let h0 = ((qh >> j) << 4) & 0x10;
                    let h1 = (qh >> (j + 12)) & 0x10;
                    y[2 + j] = (((q & 0xF) as u32 | h0) as i32 - 16) as i8 as u8;
                    y[18 + j] = (((q >> 4) as u32 | h1) as i32 - 16) as i8 as u8;
                }
            }
            true
        }
        _ => false,
    }
}
