//! The scale searches that ggml's K-quant reference quantizers share (`make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants` in `ggml-quants.c`), ported operation for operation:
//! every product and sum is evaluated in the C's order, in f32, without fused multiply-adds
//! (ggml-base, which holds these functions, is compiled for baseline x86-64 and never
//! contracts), so the chosen integers and scales are the same bits as llama-quantize's.

/// Groups whose largest magnitude is below this are all zero (ggml's `GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even through the 1.5·2^23 trick. The C asserts
/// |x| <= 4194303 only in debug builds; past that both give the same wrapped bits.
#[inline(always)]
pub(super) fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0f32;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Signed value of the first element of largest magnitude, and that magnitude.
#[inline]
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// Symmetric quantization to `-nmax..nmax-1` (stored as `l + nmax` in `levels`), searching 18
/// scales around `nmax / max` for the least weighted error; weights `x²` (`rmse_type` 1, the
/// only kind the reference quantizers use). Returns the scale.
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        levels[..x.len()].fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = -nmaxf / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (i, &xi) in x.iter().enumerate() {
        let l = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
        levels[i] = (l + nmax) as i8;
        let w = xi * xi;
        sumlx += w * xi * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &xi in x {
            let l = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
            let w = xi * xi;
            sumlx += w * xi * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &xi) in x.iter().enumerate() {
                let l = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
                levels[i] = (nmax + l) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's group search (`make_q3_quants` with `do_rmse`): levels `-nmax..nmax-1` stored as
/// `l + nmax`, refined one element at a time for up to five rounds. Returns the scale.
pub(super) fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        levels[..x.len()].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (i, &xi) in x.iter().enumerate() {
        let l = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
        levels[i] = l as i8;
        let w = xi * xi;
        sumlx += w * xi * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (i, &xi) in x.iter().enumerate() {
            let w = xi * xi;
            let li = levels[i] as f32;
            let mut slx = sumlx - w * xi * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(xi * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != levels[i] as i32 {
                    slx += w * xi * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        levels[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in levels[..x.len()].iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Asymmetric quantization to `0..=nmax` with a minimum (`make_qkx2_quants`): tries
/// `nstep + 1` scales from `(rmin + nmax) / (max - min)` in steps of `rdelta`, fitting scale
/// and minimum by weighted least squares and keeping the least error (absolute when
/// `use_mad`). Returns `(scale, -min)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels[..n].fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        levels[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                levels[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-0.4), 0);
        assert_eq!(nearest_int(7.6), 8);
    }

    #[test]
    fn zero_groups_give_zero_scale_and_levels() {
        let x = [0f32; 16];
        let mut l = [5i8; 16];
        assert_eq!(make_qx_quants(32, &x, &mut l), 0.0);
        assert!(l.iter().all(|&v| v == 0));
        let mut l = [5i8; 16];
        assert_eq!(make_q3_quants(4, &x, &mut l), 0.0);
        assert!(l.iter().all(|&v| v == 0));
    }

    #[test]
    fn qkx2_reconstructs_an_exact_grid() {
        // Values on the grid 0.5 * l - 1 are representable exactly: the search must find them.
        let x: Vec<f32> = (0..32).map(|i| 0.5 * (i % 16) as f32 - 1.0).collect();
        let w = vec![1f32; 32];
        let (mut l, mut aux) = ([0u8; 32], [0u8; 32]);
        let (scale, neg_min) = make_qkx2_quants(15, &x, &w, &mut l, &mut aux, -1.0, 0.1, 20, false);
        for i in 0..32 {
            let back = scale * l[i] as f32 - neg_min;
            assert!((back - x[i]).abs() < 1e-5, "{i}: {back} vs {}", x[i]);
        }
    }
}
