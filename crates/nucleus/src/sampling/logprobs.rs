//! Log-probabilities reported with each sampled token.
//!
//! Like OpenAI's API, we report the *raw model distribution*: `log_softmax` of the logits as the
//! model produced them, before logit bias, penalties, temperature or any truncation. That makes
//! the numbers comparable across sampling settings (a token cut by top-k still has a logprob),
//! and the chosen token's logprob is what a scorer/perplexity computation wants.

use super::candidates::Candidates;
use super::math;
use super::TokenId;

/// `ln Σ exp(l)` over the logits (`-inf` entries contribute nothing), with the max subtracted
/// so that large logits do not overflow; relative error of the sum < 1e-6.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let m = math::max(logits);
    if m == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    m as f64 + math::sum_exp(logits, m).ln()
}

/// The `n` most likely tokens as `(token, logprob)`, most likely first (ties: lower id first).
/// `lse` is [`log_sum_exp`] of the same logits; `buf` is reused scratch.
pub fn top_logprobs(
    logits: &[f32],
    n: usize,
    lse: f64,
    buf: &mut Candidates,
) -> Vec<(TokenId, f32)> {
    if n == 0 {
        return Vec::new();
    }
    buf.fill_top_k(logits, n);
    buf.sort_all();
    buf.v
        .iter()
        .map(|c| (c.id, (c.logit as f64 - lse) as f32))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_sum_exp_exact_and_stable() {
        let l = [0.0f32, 0.0, 0.0, 0.0];
        assert!((log_sum_exp(&l) - 4f64.ln()).abs() < 1e-12);
        let big = [1000.0f32, 1000.0];
        assert!((log_sum_exp(&big) - (1000.0 + 2f64.ln())).abs() < 1e-9);
        let masked = [f32::NEG_INFINITY, 1.0];
        assert!((log_sum_exp(&masked) - 1.0).abs() < 1e-12);
        assert_eq!(log_sum_exp(&[f32::NEG_INFINITY]), f64::NEG_INFINITY);
    }

    #[test]
    fn top_logprobs_sorted_and_normalised() {
        let probs = [0.1f32, 0.6, 0.3];
        let l: Vec<f32> = probs.iter().map(|p| p.ln() + 5.0).collect();
        let lse = log_sum_exp(&l);
        let mut buf = Candidates::default();
        let top = top_logprobs(&l, 2, lse, &mut buf);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].0, 1);
        assert_eq!(top[1].0, 2);
        assert!((top[0].1 - 0.6f32.ln()).abs() < 1e-6);
        assert!((top[1].1 - 0.3f32.ln()).abs() < 1e-6);
        // n larger than the vocab: everything, still sorted.
        let all = top_logprobs(&l, 10, lse, &mut buf);
        assert_eq!(all.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2, 0]);
        assert!(top_logprobs(&l, 0, lse, &mut buf).is_empty());
    }
}
