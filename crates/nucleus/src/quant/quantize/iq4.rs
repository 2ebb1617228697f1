//! The non-linear 4-bit quantizers: IQ4_NL (blocks of 32: d f16, qs[16]) and IQ4_XS
//! (super-blocks of 256: d f16, scales_h u16, scales_l[4], qs[128]), as llama-quantize makes
//! them without an importance matrix (`quantize_iq4_nl` / `quantize_iq4_xs` over
//! `quantize_row_iq4_nl_impl` with 7 tries and weights x²), ported operation for operation.

use super::search::{nearest_int, GROUP_MAX_EPS};
use crate::quant::blocks::f32_to_f16;

/// The 16 levels of IQ4_NL and IQ4_XS (ggml's `kvalues_iq4nl`).
const LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
const NTRY: i32 = 7;

/// Index of the level nearest to `x` (ties to the lower one), by bisection as ggml does.
fn best_index(x: f32) -> u8 {
    let v = |i: usize| LEVELS[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// The best scale for one block of 32 (levels written to `levels`, which a zero block leaves
/// as they were: its scale is 0 and the caller recomputes them).
fn block_scale(xb: &[f32], levels: &mut [u8]) -> f32 {
    let mut weight = [0f32; 32];
    for j in 0..32 {
        weight[j] = xb[j] * xb[j];
    }
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = LEVELS[0] as f32;
    let mut d = -max / v0;
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for j in 0..32 {
        let l = best_index(id * xb[j]);
        levels[j] = l;
        let q = LEVELS[l as usize] as f32;
        sumqx += weight[j] * q * xb[j];
        sumq2 += weight[j] * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        id = (itry + LEVELS[0] as i32) as f32 / max;
        sumqx = 0.0;
        sumq2 = 0.0;
        for j in 0..32 {
            let q = LEVELS[best_index(id * xb[j]) as usize] as f32;
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

fn pack_nibbles(levels: &[u8], qs: &mut [u8]) {
    for (i, q) in qs.chunks_exact_mut(16).enumerate() {
        for j in 0..16 {
            q[j] = levels[32 * i + j] | (levels[32 * i + 16 + j] << 4);
        }
    }
}

pub(super) fn quantize_block_iq4_nl(x: &[f32], b: &mut [u8]) {
    let mut levels = [0u8; 32];
    let d = block_scale(x, &mut levels);
    b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for j in 0..32 {
        levels[j] = best_index(id * x[j]);
    }
    pack_nibbles(&levels, &mut b[2..18]);
}

pub(super) fn quantize_block_iq4_xs(x: &[f32], b: &mut [u8]) {
    let mut levels = [0u8; 256];
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for ib in 0..8 {
        let d = block_scale(
            &x[32 * ib..32 * ib + 32],
            &mut levels[32 * ib..32 * ib + 32],
        );
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let d = -max_scale / 32.0;
    b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
    for ib in 0..8 {
        let l = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for j in 0..32 {
            levels[32 * ib + j] = best_index(idl * x[32 * ib + j]);
        }
        let l = (l + 32) as u8;
        let (l_l, l_h) = (l & 0xF, l >> 4);
        if ib % 2 == 0 {
            scales_l[ib / 2] = l_l;
        } else {
            scales_l[ib / 2] |= l_l << 4;
        }
        scales_h |= (l_h as u16) << (2 * (ib % 8));
    }
    b[2..4].copy_from_slice(&scales_h.to_le_bytes());
    b[4..8].copy_from_slice(&scales_l);
    pack_nibbles(&levels, &mut b[8..136]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_picks_the_nearest_level() {
        assert_eq!(best_index(-200.0), 0);
        assert_eq!(best_index(200.0), 15);
        assert_eq!(best_index(1.0), 8);
        assert_eq!(best_index(7.0), 9); // 6 from 1 and from 13: a tie goes to the upper level
        assert_eq!(best_index(6.9), 8);
        assert_eq!(best_index(-10.0), 7);
    }
}
