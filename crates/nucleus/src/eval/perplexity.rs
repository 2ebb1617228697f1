//! Perplexity of a model on a text, with llama.cpp's `llama-perplexity` method, so that the
//! figures compare with its own:
//!
//! - the whole text is tokenized once (with BOS when the vocabulary adds it);
//! - it is cut into windows of `n_ctx` tokens, each evaluated from an empty cache, its first
//!   token replaced by BOS when the vocabulary adds one (as llama.cpp does);
//! - only the second half of each window is scored: positions `n_ctx/2 .. n_ctx-2` predict the
//!   next token, so every scored token has at least half a window of context;
//! - PPL = exp(mean NLL), and its uncertainty llama.cpp's way: the standard error of the mean
//!   NLL, sqrt((E[nll²] − E[nll]²) / (N − 1)), times PPL.
//!
//! [`Mode::Stream`] instead runs the whole text as one sequence through a window of `n_ctx`
//! tokens with the streaming context policy (attention sinks plus recent tokens, see
//! [`crate::engine::context`]), scoring every position from `n_ctx/2` on: StreamingLLM's
//! evaluation. With no sinks it is the plain window of recent tokens the paper compares with.

use crate::engine::{ContextPolicy, Session};
use crate::kv_cache::KvType;
use crate::model::{Model, ModelError};
use crate::tokenizer::TokenId;

/// How the text is evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Fresh windows of `n_ctx` tokens (llama-perplexity).
    Windows,
    /// One stream through a sliding window that keeps `sink_blocks` blocks at its start.
    Stream { sink_blocks: usize },
}

/// One scored position: the log-probabilities it gave, in the caller's hands for KL.
pub struct Scored<'a> {
    /// Index in the text's tokens of the token predicted.
    pub target_index: usize,
    pub target: TokenId,
    /// The model's logits for that position.
    pub logits: &'a [f32],
    /// −ln p(target).
    pub nll: f64,
}

/// Running totals of the scored NLLs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NllStats {
    pub count: usize,
    pub sum: f64,
    pub sum_sq: f64,
}

impl NllStats {
    pub fn add(&mut self, nll: f64) {
        self.count += 1;
        self.sum += nll;
        self.sum_sq += nll * nll;
    }

    pub fn mean(&self) -> f64 {
        self.sum / self.count.max(1) as f64
    }

    pub fn ppl(&self) -> f64 {
        self.mean().exp()
    }

    /// llama-perplexity's uncertainty of PPL: the standard error of the mean NLL times PPL.
    pub fn ppl_stderr(&self) -> f64 {
        if self.count < 2 {
            return f64::NAN;
        }
        let n = self.count as f64;
        let var = self.sum_sq / n - self.mean() * self.mean();
        (var.max(0.0) / (n - 1.0)).sqrt() * self.ppl()
    }
}

/// −ln softmax(logits)[target], in f64 from a max-shifted sum (as llama.cpp's
/// `log_softmax`).
pub fn nll_of(logits: &[f32], target: TokenId) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    -(logits[target as usize] as f64 - max - sum.ln())
}

/// Why an evaluation cannot run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("the text has {tokens} tokens; perplexity needs at least two windows (2 × {n_ctx} = {} tokens)", 2 * n_ctx)]
    TooShort { tokens: usize, n_ctx: usize },
    #[error(
        "the window must be at least 8 tokens and at most the model's context ({max}); got {n_ctx}"
    )]
    BadWindow { n_ctx: usize, max: usize },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{0}")]
    Other(String),
}

/// Checks the window and the text's length (before any work).
pub fn check(model: &Model, tokens: usize, n_ctx: usize) -> Result<(), EvalError> {
    let max = model.hp.n_ctx_train;
    if n_ctx < 8 || n_ctx > max {
        return Err(EvalError::BadWindow { n_ctx, max });
    }
    if tokens < 2 * n_ctx {
        return Err(EvalError::TooShort { tokens, n_ctx });
    }
    Ok(())
}

/// Evaluates `tokens` in `mode` with windows of `n_ctx` and a KV cache of `kv_type`; `bos` replaces the first token of each
/// window in `Windows` mode (the vocabulary's BOS when it adds one). Calls `on_score` for every
/// scored position in order and `on_progress(done, total)` after each window (or stream
/// chunk). Returns the NLL totals.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    model: &Model,
    tokens: &[TokenId],
    n_ctx: usize,
    mode: Mode,
    kv_type: KvType,
    bos: Option<TokenId>,
    mut on_score: impl FnMut(&Scored),
    mut on_progress: impl FnMut(usize, usize, &NllStats),
) -> Result<NllStats, EvalError> {
    check(model, tokens.len(), n_ctx)?;
    let n_vocab = model.hp.n_vocab;
    let first = n_ctx / 2;
    let mut stats = NllStats::default();
    let mut session = Session::with_kv_type(model, n_ctx, n_ctx, kv_type)?;
    session.set_prefix_caching(false);
    let mut score = |stats: &mut NllStats, logits: &[f32], target_index: usize| {
        let target = tokens[target_index];
        let nll = nll_of(logits, target);
        stats.add(nll);
        on_score(&Scored {
            target_index,
            target,
            logits,
            nll,
        });
    };
    match mode {
        Mode::Windows => {
            let n_windows = tokens.len() / n_ctx;
            let mut window = Vec::with_capacity(n_ctx);
            for w in 0..n_windows {
                let start = w * n_ctx;
                window.clear();
                window.extend_from_slice(&tokens[start..start + n_ctx]);
                if let Some(b) = bos {
                    window[0] = b;
                }
                session.reset();
                let logits = session.feed(&window, n_ctx, true)?;
                for pos in first..n_ctx - 1 {
                    let row = &logits[pos * n_vocab..(pos + 1) * n_vocab];
                    score(&mut stats, row, start + pos + 1);
                }
                on_progress(w + 1, n_windows, &stats);
            }
        }
        Mode::Stream { sink_blocks } => {
            session
                .set_context_policy(ContextPolicy::Stream)
                .map_err(|e| EvalError::Other(e.to_string()))?;
            session.set_sink_blocks(sink_blocks);
            // Chunks of a block or more: each token sees between a window less one chunk
            // and a whole window of context once the window is full.
            let chunk = (n_ctx / 8).clamp(16, 64);
            let n_chunks = (tokens.len() - 1).div_ceil(chunk);
            for (c, part) in tokens[..tokens.len() - 1].chunks(chunk).enumerate() {
                let logits = session.feed(part, chunk, true)?;
                for (i, row) in logits.chunks_exact(n_vocab).enumerate() {
                    let pos = c * chunk + i;
                    if pos >= first {
                        score(&mut stats, row, pos + 1);
                    }
                }
                on_progress(c + 1, n_chunks, &stats);
            }
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_follow_llama_perplexity_formulas() {
        let mut s = NllStats::default();
        for x in [1.0, 2.0, 3.0, 4.0] {
            s.add(x);
        }
        assert_eq!(s.mean(), 2.5);
        assert!((s.ppl() - 2.5f64.exp()).abs() < 1e-12);
        // E[x²] − E[x]² = 7.5 − 6.25 = 1.25; / (n − 1) = 0.41667; sqrt = 0.6455.
        let want = (1.25f64 / 3.0).sqrt() * 2.5f64.exp();
        assert!((s.ppl_stderr() - want).abs() < 1e-12);
    }

    #[test]
    fn nll_is_minus_log_softmax() {
        let logits = [1.0f32, 2.0, 3.0];
        let z: f64 = [1f64, 2., 3.].iter().map(|x| x.exp()).sum();
        for t in 0..3u32 {
            let want = -(((t + 1) as f64).exp() / z).ln();
            assert!((nll_of(&logits, t) - want).abs() < 1e-12);
        }
        // Uniform over n: ln n.
        assert!((nll_of(&[0.5; 8], 3) - 8f64.ln()).abs() < 1e-12);
    }
}
