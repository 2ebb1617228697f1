//! Rotary position embeddings (RoPE), as llama.cpp computes them: the angles of a position once,
//! then the rotation of the query's and the key's heads by them.

use crate::model::RopeStyle;

/// The cosines and sines of the rotary angles of one position, `rope_dim / 2` of them: what the
/// query's and the key's rotations share (and every cached key moved by the same distance, see
/// `Model::shift_keys`, where `pos` is the distance, negative to rotate back).
///
/// The angles follow llama.cpp: theta_i = pos · base^(-2i/rope_dim), computed by repeated f32
/// multiplication so that rounding matches the reference. `freq_factors` (Llama 3.1's
/// `rope_freqs`) divide the angles when present.
pub fn rope_angles(
    rope_dim: usize,
    pos: i64,
    base: f32,
    freq_scale: f32,
    freq_factors: Option<&[f32]>,
    cos_sin: &mut Vec<(f32, f32)>,
) {
    let half = rope_dim / 2;
    cos_sin.clear();
    let theta_scale = base.powf(-2.0 / rope_dim as f32);
    let mut theta = pos as f32 * freq_scale;
    for i in 0..half {
        let t = match freq_factors {
            Some(f) => theta / f[i],
            None => theta,
        };
        cos_sin.push((t.cos(), t.sin()));
        theta *= theta_scale;
    }
}

/// YaRN (arXiv:2309.00071), as llama.cpp's `ggml_rope_ext` computes it with `ext_factor` ≠ 0:
/// each dimension pair's angle a mix of the interpolated (`freq_scale`·θ) and the extrapolated
/// (θ) angle by a ramp between the two correction dimensions, and every cosine and sine times
/// `attn_factor · (1 + 0.1·ln(1/freq_scale))`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub ext_factor: f32,
    /// llama.cpp's `yarn_attn_factor` as its context sets it.
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// The training context the scaling stretches (`rope.scaling.original_context_length`).
    pub n_ctx_orig: usize,
}

impl Yarn {
    /// `ggml_rope_yarn_corr_dims`: the first and last dimension of the ramp.
    fn corr_dims(&self, rope_dim: usize, base: f32) -> [f32; 2] {
        let corr_dim = |n_rot: f32| {
            rope_dim as f32 * (self.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let start = corr_dim(self.beta_fast).floor();
        let end = corr_dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(rope_dim as f32 - 1.0)]
    }
}

/// [`rope_angles`] with YaRN, in the order of ggml's `rope_yarn`: θ_extrap = pos·base^(−2i/d)
/// (over the frequency factor), θ_interp = freq_scale·θ_extrap, their mix (one FMA, as GCC
/// contracts `interp·(1 − mix) + extrap·mix`), then cos and sin times the magnitude scale.
pub fn rope_angles_yarn(
    (rope_dim, pos, base, freq_scale): (usize, i64, f32, f32),
    freq_factors: Option<&[f32]>,
    yarn: &Yarn,
    cos_sin: &mut Vec<(f32, f32)>,
) {
    cos_sin.clear();
    let corr = yarn.corr_dims(rope_dim, base);
    let theta_scale = base.powf(-2.0 / rope_dim as f32);
    let mut mscale = yarn.attn_factor;
    if yarn.ext_factor != 0.0 {
        mscale *= 0.1f32.mul_add((1.0 / freq_scale).ln(), 1.0);
    }
    let mut theta = pos as f32;
    for i in 0..rope_dim / 2 {
        let extrap = match freq_factors {
            Some(f) => theta / f[i],
            None => theta,
        };
        let interp = freq_scale * extrap;
        let t = if yarn.ext_factor != 0.0 {
            let y = ((2 * i / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            let mix = ramp * yarn.ext_factor;
            interp.mul_add(1.0 - mix, extrap * mix)
        } else {
            interp
        };
        cos_sin.push((t.cos() * mscale, t.sin() * mscale));
        theta *= theta_scale;
    }
}

/// Rotary embeddings applied in place to `n_heads` heads of `head_dim`: their first `rope_dim`
/// values turned by the angles of [`rope_angles`].
pub fn rope_apply(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    style: RopeStyle,
    cos_sin: &[(f32, f32)],
) {
    assert_eq!(cos_sin.len(), rope_dim / 2);
    assert!(x.len() >= n_heads * head_dim && rope_dim <= head_dim);
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_level() != crate::quant::SimdLevel::Scalar {
        // SAFETY: every non-scalar dispatch level has FMA; the sizes are checked above.
        return unsafe { x86::rope_apply(x, n_heads, head_dim, rope_dim, style, cos_sin) };
    }
    rope_apply_scalar(x, n_heads, head_dim, rope_dim, style, cos_sin);
}

/// The rotation as written; `mul_add` is one fused multiply-add (correctly rounded) whether
/// the compiler emits the instruction or calls `fmaf`, so every path has these bits.
#[inline(always)]
fn rope_apply_scalar(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    style: RopeStyle,
    cos_sin: &[(f32, f32)],
) {
    let half = rope_dim / 2;
    for h in 0..n_heads {
        let head = &mut x[h * head_dim..h * head_dim + rope_dim];
        for (i, &(c, s)) in cos_sin.iter().enumerate() {
            let (a, b) = match style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0.mul_add(c, -(x1 * s));
            head[b] = x0.mul_add(s, x1 * c);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::RopeStyle;

    /// [`super::rope_apply_scalar`] compiled with FMA, so that `mul_add` is the instruction
    /// rather than a call to `fmaf` (the same bits).
    ///
    /// # Safety
    /// FMA.
    #[target_feature(enable = "fma")]
    pub unsafe fn rope_apply(
        x: &mut [f32],
        n_heads: usize,
        head_dim: usize,
        rope_dim: usize,
        style: RopeStyle,
        cos_sin: &[(f32, f32)],
    ) {
        super::rope_apply_scalar(x, n_heads, head_dim, rope_dim, style, cos_sin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One position's angles, then the rotation.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        x: &mut [f32],
        n_heads: usize,
        head_dim: usize,
        rope_dim: usize,
        pos: i64,
        base: f32,
        freq_scale: f32,
        style: RopeStyle,
        freq_factors: Option<&[f32]>,
        cos_sin: &mut Vec<(f32, f32)>,
    ) {
        rope_angles(rope_dim, pos, base, freq_scale, freq_factors, cos_sin);
        rope_apply(x, n_heads, head_dim, rope_dim, style, cos_sin);
    }

    #[test]
    fn rope_rotates_pairs_and_preserves_norm() {
        let mut cs = Vec::new();
        let orig: Vec<f32> = (0..8).map(|i| i as f32 * 0.3 - 1.0).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let mut x = orig.clone();
            rope(&mut x, 1, 8, 8, 0, 10000.0, 1.0, style, None, &mut cs);
            assert_eq!(x, orig, "position 0 is the identity");
            rope(&mut x, 1, 8, 8, 7, 10000.0, 1.0, style, None, &mut cs);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
        }
        // First pair at position p rotates by exactly p radians.
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope(
            &mut x,
            1,
            4,
            4,
            2,
            10000.0,
            1.0,
            RopeStyle::Interleaved,
            None,
            &mut cs,
        );
        assert!((x[0] - 2f32.cos()).abs() < 1e-6 && (x[1] - 2f32.sin()).abs() < 1e-6);
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope(
            &mut x,
            1,
            4,
            4,
            2,
            10000.0,
            1.0,
            RopeStyle::Neox,
            None,
            &mut cs,
        );
        assert!((x[0] - 2f32.cos()).abs() < 1e-6 && (x[2] - 2f32.sin()).abs() < 1e-6);
    }

    /// Rotating to position p and then by -d lands (to rounding) where rotating to p - d does:
    /// what re-rotating a cached key after the window slid relies on.
    #[test]
    fn rope_by_a_negative_position_moves_a_key_back() {
        let mut cs = Vec::new();
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let orig: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
            let at = |p: i64| {
                let mut x = orig.clone();
                rope(
                    &mut x,
                    2,
                    8,
                    8,
                    p,
                    10000.0,
                    1.0,
                    style,
                    None,
                    &mut Vec::new(),
                );
                x
            };
            let mut moved = at(1000);
            rope(
                &mut moved, 2, 8, 8, -960, 10000.0, 1.0, style, None, &mut cs,
            );
            for (a, b) in moved.iter().zip(at(40)) {
                assert!((a - b).abs() < 2e-4, "{style:?}: {a} vs {b}");
            }
        }
    }
}
