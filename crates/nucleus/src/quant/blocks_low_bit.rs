//! The 2-, 3- and non-linear 4-bit block formats (ggml's `block_q2_K`, `block_q3_K`,
//! `block_iq4_nl`, `block_iq4_xs`): their values and dequantization.
//!
//! Layouts (bytes, packed, little-endian):
//! - Q2_K (84): scales[16] (low nibble: scale, high nibble: min, one pair per 16 values),
//!   qs[64] (2 bits a value), d f16, dmin f16; x = d·scale·q − dmin·min
//! - Q3_K (110): hmask[32] (the third bit), qs[64] (the low 2 bits), scales[12] (16 × 6 bits),
//!   d f16; x = d·(scale − 32)·(q − 4)
//! - IQ4_NL (18): d f16, qs[16]; x = d·KVALUES_IQ4NL[nibble]
//! - IQ4_XS (136): d f16, scales_h u16, scales_l[4] (8 × 6 bits), qs[128];
//!   x = d·(scale − 32)·KVALUES_IQ4NL[nibble]
//!
//! In Q2_K and Q3_K, value `e = 128h + 32s + l` (h < 2, s < 4, l < 32) is bits `2s, 2s+1` of
//! `qs[32h + l]`; Q3_K's third bit is bit `4h + s` of `hmask[l]`; values `16i..16i+16` share
//! scale `i`. In the IQ4 formats each 32-value sub-block is 16 bytes: byte `j` holds value `j`
//! (low nibble) and `j + 16` (high nibble).

#![allow(clippy::needless_range_loop)]

use super::blocks::{f16_to_f32, rd_u16, QK, QK_K};

/// The 16 values a 4-bit IQ4_NL/IQ4_XS code stands for (ggml's `kvalues_iq4nl`).
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The 16 values of an MXFP4 code (ggml's `kvalues_mxfp4`): the E2M1 floats 0, ±0.5, ±1,
/// ±1.5, ±2, ±3, ±4, ±6, doubled to integers (the block's scale is halved to match).
pub(crate) const KVALUES_MXFP4: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

pub(crate) const Q2_K_BYTES: usize = 84;
/// MXFP4 (OCP microscaling, gpt-oss's experts): e (E8M0 exponent) and qs[16], 32 values.
pub(crate) const MXFP4_BYTES: usize = 17;
pub(crate) const Q3_K_BYTES: usize = 110;
pub(crate) const IQ4_NL_BYTES: usize = 18;
pub(crate) const IQ4_XS_BYTES: usize = 136;

/// The 256 two-bit values (0..=3) of a Q2_K block (qs at 16).
pub(crate) fn q2_k_values(b: &[u8]) -> [i32; QK_K] {
    let mut q = [0i32; QK_K];
    for e in 0..QK_K {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        q[e] = ((b[16 + 32 * h + l] >> (2 * s)) & 3) as i32;
    }
    q
}

/// The 16 scales (0..=15) and 16 mins (0..=15) of a Q2_K block.
pub(crate) fn q2_k_scales_mins(b: &[u8]) -> ([i32; 16], [i32; 16]) {
    let scales = std::array::from_fn(|i| (b[i] & 0xF) as i32);
    let mins = std::array::from_fn(|i| (b[i] >> 4) as i32);
    (scales, mins)
}

/// The 256 signed values (−4..=3) of a Q3_K block: the low two bits from qs (at 32), minus 4
/// where the hmask bit (at 0) is clear.
pub(crate) fn q3_k_values(b: &[u8]) -> [i32; QK_K] {
    let mut q = [0i32; QK_K];
    for e in 0..QK_K {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = ((b[32 + 32 * h + l] >> (2 * s)) & 3) as i32;
        let high = (b[l] >> (4 * h + s)) & 1;
        q[e] = low - if high == 0 { 4 } else { 0 };
    }
    q
}

/// The 16 signed scales (−32..=31) of a Q3_K block from its 12 scale bytes (at 96): scale `k`
/// is nibble `k / 8` of byte `k % 8`, with bits `2(k / 4)`, `2(k / 4) + 1` of byte `8 + k % 4`
/// above it (ggml's `kmask` unpacking).
pub(crate) fn q3_k_scales(b: &[u8]) -> [i32; 16] {
    let sc = &b[96..108];
    std::array::from_fn(|k| {
        let low = (sc[k % 8] >> (4 * (k / 8))) & 0xF;
        let high = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
        (low | (high << 4)) as i32 - 32
    })
}

/// The 32 values of one IQ4 sub-block of 16 bytes, in element order.
pub(crate) fn iq4_values(qs: &[u8]) -> [i32; QK] {
    std::array::from_fn(|e| {
        let nib = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
        KVALUES_IQ4NL[nib as usize] as i32
    })
}

/// The 8 signed sub-block scales (−32..=31) of an IQ4_XS block.
pub(crate) fn iq4_xs_scales(b: &[u8]) -> [i32; 8] {
    let sh = rd_u16(b, 2);
    std::array::from_fn(|ib| {
        let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
        let high = ((sh >> (2 * ib)) & 3) as u8;
        (low | (high << 4)) as i32 - 32
    })
}

/// The 256 values of an IQ4_XS block, in element order (before their sub-block scales).
pub(crate) fn iq4_xs_values(b: &[u8]) -> [i32; QK_K] {
    let mut q = [0i32; QK_K];
    for (ib, chunk) in q.chunks_exact_mut(QK).enumerate() {
        chunk.copy_from_slice(&iq4_values(&b[8 + 16 * ib..8 + 16 * ib + 16]));
    }
    q
}

/// Dequantizes Q2_K blocks as ggml's `dequantize_row_q2_K`: per 16 values dl = d·scale and
/// ml = dmin·min, then dl·q − ml (two roundings, as the `gguf` package computes it).
pub(crate) fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(Q2_K_BYTES)) {
        let d = f16_to_f32(rd_u16(b, 80));
        let dmin = f16_to_f32(rd_u16(b, 82));
        let (scales, mins) = q2_k_scales_mins(b);
        let q = q2_k_values(b);
        for e in 0..QK_K {
            let dl = d * scales[e / 16] as f32;
            let ml = dmin * mins[e / 16] as f32;
            y[e] = dl * q[e] as f32 - ml;
        }
    }
}

/// Dequantizes Q3_K blocks as ggml's `dequantize_row_q3_K`: d·(scale − 32), times q − 4.
pub(crate) fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(Q3_K_BYTES)) {
        let d = f16_to_f32(rd_u16(b, 108));
        let scales = q3_k_scales(b);
        let q = q3_k_values(b);
        for e in 0..QK_K {
            y[e] = (d * scales[e / 16] as f32) * q[e] as f32;
        }
    }
}

/// An MXFP4 block's scale, halved (ggml's `ggml_e8m0_to_fp32_half`): 2^(e − 128), built from
/// its bits (subnormal for e < 2), so that scale times a [`KVALUES_MXFP4`] value is the E2M1
/// value times 2^(e − 127).
pub(crate) fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// The 32 values of an MXFP4 block's 16 bytes of nibbles, in element order.
pub(crate) fn mxfp4_values(qs: &[u8]) -> [i32; QK] {
    std::array::from_fn(|e| {
        let nib = if e < 16 { qs[e] & 0xF } else { qs[e - 16] >> 4 };
        KVALUES_MXFP4[nib as usize] as i32
    })
}

/// Dequantizes MXFP4 blocks: 2^(e − 128)·KVALUES_MXFP4[nibble].
pub(crate) fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(MXFP4_BYTES)) {
        let d = e8m0_to_f32_half(b[0]);
        for (o, v) in y.iter_mut().zip(mxfp4_values(&b[1..17])) {
            *o = d * v as f32;
        }
    }
}

/// Dequantizes IQ4_NL blocks: d·KVALUES_IQ4NL[nibble].
pub(crate) fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(IQ4_NL_BYTES)) {
        let d = f16_to_f32(rd_u16(b, 0));
        for (o, v) in y.iter_mut().zip(iq4_values(&b[2..18])) {
            *o = d * v as f32;
        }
    }
}

/// Dequantizes IQ4_XS blocks: per 32 values dl = d·(scale − 32), then dl·KVALUES_IQ4NL[nibble].
pub(crate) fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst
        .chunks_exact_mut(QK_K)
        .zip(src.chunks_exact(IQ4_XS_BYTES))
    {
        let d = f16_to_f32(rd_u16(b, 0));
        let scales = iq4_xs_scales(b);
        let q = iq4_xs_values(b);
        for e in 0..QK_K {
            y[e] = (d * scales[e / 32] as f32) * q[e] as f32;
        }
    }
}
