//! The K-quant reference quantizers (`quantize_row_q{2,3,4,5,6}_K_ref` in ggml-quants.c, what
//! llama-quantize runs without an importance matrix), one 256-element super-block at a time.
//! Block layouts are in `quant/blocks.rs`; Q2_K is scales[16], qs[64], d, dmin (84 bytes) and
//! Q3_K hmask[32], qs[64], scales[12], d (110 bytes).

use super::search::{make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int, GROUP_MAX_EPS};
use crate::quant::blocks::{f16_to_f32, f32_to_f16, scale_min_k4, QK_K};

fn put_f16(b: &mut [u8], at: usize, x: f32) -> f32 {
    let h = f32_to_f16(x);
    b[at..at + 2].copy_from_slice(&h.to_le_bytes());
    f16_to_f32(h)
}

/// Packs 2-bit levels as ggml does: byte `l` of each 32-byte group holds elements
/// `l`, `l + 32`, `l + 64`, `l + 96` of its 128.
fn pack_2bit(levels: &[u8; QK_K], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for l in 0..32 {
            qs[j / 4 + l] = levels[j + l]
                | (levels[j + l + 32] << 2)
                | (levels[j + l + 64] << 4)
                | (levels[j + l + 96] << 6);
        }
    }
}

pub(super) fn quantize_block_q2_k(x: &[f32], b: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let (mut aux, mut weights) = ([0u8; 16], [0f32; 16]);
    let (mut mins, mut scales) = ([0f32; 16], [0f32; 16]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        for l in 0..16 {
            weights[l] = xs[l].abs();
        }
        let (scale, min) = make_qkx2_quants(
            3,
            xs,
            &weights,
            &mut levels[16 * j..16 * j + 16],
            &mut aux,
            -0.5,
            0.1,
            15,
            true,
        );
        scales[j] = scale;
        mins[j] = min;
        max_scale = max_scale.max_c(scale);
        max_min = max_min.max_c(min);
    }
    let (sc, rest) = b.split_at_mut(16);
    let q4scale = 15f32;
    let d = if max_scale > 0.0 {
        let iscale = q4scale / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_f16(rest, 64, max_scale / q4scale)
    } else {
        sc.fill(0);
        put_f16(rest, 64, 0.0)
    };
    let dmin = if max_min > 0.0 {
        let iscale = q4scale / max_min;
        for j in 0..16 {
            sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        put_f16(rest, 66, max_min / q4scale)
    } else {
        put_f16(rest, 66, 0.0)
    };
    for j in 0..16 {
        let d = d * (sc[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * (sc[j] >> 4) as f32;
        for ii in 0..16 {
            let l = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3);
            levels[16 * j + ii] = l as u8;
        }
    }
    pack_2bit(&levels, &mut rest[..64]);
}

pub(super) fn quantize_block_q3_k(x: &[f32], b: &mut [u8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut levels[16 * j..16 * j + 16]);
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }
    let (hmask, rest) = b.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    let (sc, dbytes) = rest.split_at_mut(12);
    sc.fill(0);
    let d = if max_scale != 0.0 {
        let iscale = -32f32 / max_scale;
        for j in 0..16 {
            // The C stores nearest_int's result in an int8_t before clamping.
            let l = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
            if j < 8 {
                sc[j] = (l & 0xF) as u8;
            } else {
                sc[j - 8] |= ((l & 0xF) << 4) as u8;
            }
            sc[j % 4 + 8] |= ((l as u8) >> 4) << (2 * (j / 4));
        }
        put_f16(dbytes, 0, 1.0 / iscale)
    } else {
        put_f16(dbytes, 0, 0.0)
    };
    for j in 0..16 {
        let low = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
        let s = (low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8 - 32;
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / dl).clamp(-4, 3);
            levels[16 * j + ii] = (l + 4) as i8;
        }
    }
    hmask.fill(0);
    // The high bit of element j goes to bit j / 32 of hmask[j % 32].
    for j in 0..QK_K {
        if levels[j] > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            levels[j] -= 4;
        }
    }
    let low: [u8; QK_K] = std::array::from_fn(|i| levels[i] as u8);
    pack_2bit(&low, qs);
}

/// Q4_K's and Q5_K's common part: per 32-element group a scale and a minimum from
/// `make_qkx2_quants` (with weights `sqrt(mean x²) + |x|`), both quantized to 6 bits against
/// the super-block's largest, then the levels recomputed from the rounded scales.
/// Writes d, dmin and scales[12] into `head` (16 bytes) and returns the levels.
fn scales_mins_k4(x: &[f32], head: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; QK_K] {
    let mut levels = [0u8; QK_K];
    let (mut aux, mut weights) = ([0u8; 32], [0f32; 32]);
    let (mut mins, mut scales) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for l in 0..32 {
            weights[l] = av_x + xs[l].abs();
        }
        let (scale, min) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut levels[32 * j..32 * j + 32],
            &mut aux,
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = scale;
        mins[j] = min;
        max_scale = max_scale.max_c(scale);
        max_min = max_min.max_c(min);
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut head[4..16];
    for j in 0..8 {
        // uint8_t in the C: nearest_int's result is truncated to 8 bits before the MIN.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d = put_f16(head, 0, max_scale / 63.0);
    let dmin = put_f16(head, 2, max_min / 63.0);
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &head[4..16]);
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            let l = nearest_int((x[32 * j + ii] + dm) / dl).clamp(0, nmax);
            levels[32 * j + ii] = l as u8;
        }
    }
    levels
}

pub(super) fn quantize_block_q4_k(x: &[f32], b: &mut [u8]) {
    let levels = scales_mins_k4(x, &mut b[..16], 15, -1.0, 20);
    let qs = &mut b[16..144];
    for (g, j) in (0..QK_K).step_by(64).enumerate() {
        for l in 0..32 {
            qs[32 * g + l] = levels[j + l] | (levels[j + l + 32] << 4);
        }
    }
}

pub(super) fn quantize_block_q5_k(x: &[f32], b: &mut [u8]) {
    let levels = scales_mins_k4(x, &mut b[..16], 31, -0.5, 15);
    let (qh, qs) = b[16..176].split_at_mut(32);
    qh.fill(0);
    let (mut m1, mut m2) = (1u8, 2u8);
    for (g, n) in (0..QK_K).step_by(64).enumerate() {
        for j in 0..32 {
            let mut l1 = levels[n + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = levels[n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            qs[32 * g + j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

pub(super) fn quantize_block_q6_k(x: &[f32], b: &mut [u8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut levels[16 * ib..]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        b.fill(0);
        return;
    }
    let iscale = -128f32 / max_scale;
    let d = put_f16(b, 208, 1.0 / iscale);
    for ib in 0..16 {
        b[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let dl = d * (b[192 + j] as i8) as f32;
        if dl == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / dl).clamp(-32, 31);
            levels[16 * j + ii] = (l + 32) as i8;
        }
    }
    let (ql, rest) = b.split_at_mut(128);
    let qh = &mut rest[..64];
    for (h, j) in (0..QK_K).step_by(128).enumerate() {
        let (ql, qh) = (&mut ql[64 * h..64 * h + 64], &mut qh[32 * h..32 * h + 32]);
        for l in 0..32 {
            let q = |k: usize| levels[j + l + 32 * k] as u8;
            ql[l] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
            ql[l + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
            qh[l] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

/// `if (v > m) m = v`, which (unlike `f32::max`) keeps `m` when `v` is NaN.
trait MaxC {
    fn max_c(self, v: f32) -> f32;
}

impl MaxC for f32 {
    #[inline(always)]
    fn max_c(self, v: f32) -> f32 {
        if v > self {
            v
        } else {
            self
        }
    }
}
