//! Element-wise and row-wise operations of the forward pass: normalisation, RoPE, activations,
//! softmax. They are small next to the matrix products; they are written to be obviously right
//! and to let the compiler vectorise them.

use crate::model::RopeStyle;

/// 1/sqrt(mean(x²) + eps), the sum of squares accumulated in f64 as ggml does: residual
/// streams (Gemma's especially) hold values in the hundreds, where an f32 sum loses the bits
/// that the following 8-bit activation quantization then magnifies.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// out = x / sqrt(mean(x²) + eps) * weight
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// `out` row t = rmsnorm(`x` row t) · weight, for rows of `dim`.
pub fn rmsnorm_rows(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32, dim: usize) {
    for (o, r) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
        rmsnorm(o, r, weight, eps);
    }
}

/// In-place RMS norm of each `dim`-sized chunk (per-head q/k norms, Gemma's post-norms).
pub fn rmsnorm_chunks(x: &mut [f32], weight: &[f32], eps: f32, dim: usize) {
    for chunk in x.chunks_exact_mut(dim) {
        let scale = rms_scale(chunk, eps);
        for (v, &w) in chunk.iter_mut().zip(weight) {
            *v = *v * scale * w;
        }
    }
}

/// Rotary embeddings applied in place to `n_heads` heads of `head_dim` for one position.
///
/// The angles follow llama.cpp: theta_i = pos · base^(-2i/rope_dim), computed by repeated f32
/// multiplication so that rounding matches the reference. `freq_factors` (Llama 3.1's
/// `rope_freqs`) divide the angles when present.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    pos: usize,
    base: f32,
    freq_scale: f32,
    style: RopeStyle,
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
    for h in 0..n_heads {
        let head = &mut x[h * head_dim..h * head_dim + rope_dim];
        for (i, &(c, s)) in cos_sin.iter().enumerate() {
            let (a, b) = match style {
                RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}

/// gate = silu(gate) * up
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// GELU with the tanh approximation, in f32.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)).tanh())
}

/// GELU as ggml computes it on the CPU: through a table indexed by the input rounded to f16,
/// holding f16 results (`GGML_GELU_FP16`); exact beyond ±10. Matching it keeps our FFN
/// activations identical to llama.cpp's.
fn gelu_table() -> &'static [half::f16] {
    static TABLE: std::sync::OnceLock<Vec<half::f16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| half::f16::from_f32(gelu(half::f16::from_bits(bits).to_f32())))
            .collect()
    })
}

/// gate = gelu(gate) * up
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[half::f16::from_f32(x).to_bits() as usize].to_f32() * u
        };
    }
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Numerically safe log(sum(exp(x))).
pub fn logsumexp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f64 = x.iter().map(|&v| ((v - max) as f64).exp()).sum();
    max + sum.ln() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_matches_formula() {
        let x = [1.0, -2.0, 3.0, 0.5];
        let w = [1.0, 2.0, 0.5, 1.0];
        let mut out = [0.0; 4];
        rmsnorm(&mut out, &x, &w, 1e-6);
        let rms = ((1.0 + 4.0 + 9.0 + 0.25) / 4.0f32 + 1e-6).sqrt();
        for i in 0..4 {
            assert!((out[i] - x[i] / rms * w[i]).abs() < 1e-6);
        }
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

    #[test]
    fn activations_match_formulas() {
        let mut g = [1.0f32, -1.0];
        swiglu(&mut g, &[2.0, 3.0]);
        assert!((g[0] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
        let mut g = [1.0f32, 20.0, -20.0];
        geglu(&mut g, &[1.0, 2.0, 3.0]);
        // gelu(1) = 0.841192 (tanh form), rounded to f16 as ggml's table holds it.
        assert_eq!(g[0], half::f16::from_f32(0.841192).to_f32());
        assert_eq!(g[1], 40.0);
        assert_eq!(g[2], 0.0);
        assert!((gelu(1.0) - 0.841192).abs() < 1e-5);
        assert!((logsumexp(&[0.0, 0.0]) - 2f32.ln()).abs() < 1e-6);
    }
}
