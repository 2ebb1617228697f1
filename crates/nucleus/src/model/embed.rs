//! Sentence embeddings from a generative model: the mean over the input's tokens of the final
//! hidden state (after the output norm, before the output projection), L2-normalized.
//!
//! This is what llama.cpp's `--pooling mean` computes for a decoder model. A chat model was not
//! trained for it, so these vectors are usable for rough similarity, not as a substitute for an
//! embedding model's.

use super::{Batch, ForwardState, Model, ModelError};
use crate::kernels::PromptSlot;
use crate::tokenizer::TokenId;

/// Tokens per forward when embedding.
pub const EMBED_CHUNK: usize = 512;

impl Model {
    /// The mean-pooled, L2-normalized final hidden state of `tokens` (one vector of `n_embd`).
    /// The tokens are one prompt computed `chunk` at a time in a KV cache of their own, so the
    /// result does not depend on `chunk` (beyond rounding) nor on anything else running.
    pub fn embed(&self, tokens: &[TokenId], chunk: usize) -> Result<Vec<f32>, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::BadBatch("nothing to embed".into()));
        }
        let e = self.hp.n_embd;
        let block = 16;
        let mut kv = self.new_kv_cache(tokens.len(), block);
        let seq = kv.new_seq();
        let mut state = ForwardState::new();
        state.set_hidden_only(true);
        let mut batch = Batch::new();
        let mut sum = vec![0f64; e];
        let chunk = chunk.max(1);
        for (ci, part) in tokens.chunks(chunk).enumerate() {
            batch.clear();
            for (i, &tok) in part.iter().enumerate() {
                let index = ci * chunk + i;
                let slot = PromptSlot {
                    len: tokens.len(),
                    index,
                    all_logits: true,
                };
                batch.push_prompt(tok, index, seq, true, slot);
            }
            self.forward(&batch, &mut kv, &mut state)?;
            for row in state.hidden()[..part.len() * e].chunks_exact(e) {
                for (s, &x) in sum.iter_mut().zip(row) {
                    *s += f64::from(x);
                }
            }
        }
        Ok(normalize_mean(&sum, tokens.len()))
    }
}

/// `sum / n`, scaled to unit L2 norm (left as is when it is all zeros).
fn normalize_mean(sum: &[f64], n: usize) -> Vec<f32> {
    let mean: Vec<f64> = sum.iter().map(|s| s / n as f64).collect();
    let norm = mean.iter().map(|x| x * x).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { 1.0 / norm } else { 1.0 };
    mean.iter().map(|x| (x * scale) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::normalize_mean;

    #[test]
    fn mean_then_unit_norm() {
        let v = normalize_mean(&[6.0, 8.0], 2);
        assert!(
            (v[0] - 0.6).abs() < 1e-7 && (v[1] - 0.8).abs() < 1e-7,
            "{v:?}"
        );
        assert_eq!(normalize_mean(&[0.0, 0.0], 3), vec![0.0, 0.0]);
    }
}
