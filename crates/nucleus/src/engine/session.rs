//! One sequence's generation: prefill the prompt in chunks through the batched forward, then
//! decode token by token until an end-of-generation token, a stop, or the token limit.

use std::time::Instant;

use crate::kv_cache::{KvCache, SeqId};
use crate::model::{Batch, ForwardState, Model, ModelError};
use crate::tokenizer::TokenId;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The token limit or the end of the context window.
    Length,
}

#[derive(Clone, Debug)]
pub struct GenerationConfig {
    pub max_tokens: usize,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Prompt tokens per forward during prefill.
    pub prefill_chunk: usize,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig {
            max_tokens: 256,
            ignore_eos: false,
            prefill_chunk: 512,
        }
    }
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_ms: f64,
    pub generated_tokens: usize,
    pub generate_ms: f64,
    pub prompt_tokens_per_s: f64,
    pub generate_tokens_per_s: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Generation {
    pub prompt_tokens: Vec<TokenId>,
    pub tokens: Vec<TokenId>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
}

/// A model's working state for one sequence at a time: its KV cache and forward scratch.
pub struct Session<'m> {
    pub model: &'m Model,
    pub kv: KvCache,
    pub state: ForwardState,
    pub seq: SeqId,
    n_ctx: usize,
    batch: Batch,
}

impl<'m> Session<'m> {
    /// A session whose context holds `n_ctx` tokens (prompt and generated together).
    pub fn new(model: &'m Model, n_ctx: usize) -> Session<'m> {
        let mut kv = model.new_kv_cache(n_ctx, 16);
        let seq = kv.new_seq();
        Session {
            model,
            kv,
            state: ForwardState::new(),
            seq,
            n_ctx,
            batch: Batch::new(),
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Tokens in the sequence so far.
    pub fn len(&self) -> usize {
        self.kv.seq_len(self.seq).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets the sequence (a new conversation).
    pub fn reset(&mut self) {
        let _ = self.kv.free_seq(self.seq);
        self.seq = self.kv.new_seq();
    }

    /// Appends `tokens`, `chunk` at a time; returns the logits after the last one. With
    /// `all_logits`, every position's logits are kept (for conformance tests) and returned
    /// concatenated.
    pub fn feed(
        &mut self,
        tokens: &[TokenId],
        chunk: usize,
        all_logits: bool,
    ) -> Result<Vec<f32>, ModelError> {
        if self.len() + tokens.len() > self.n_ctx {
            return Err(ModelError::BadBatch(format!(
                "{} tokens do not fit: the context window holds {} and {} are used",
                tokens.len(),
                self.n_ctx,
                self.len()
            )));
        }
        let mut out = Vec::new();
        for (ci, part) in tokens.chunks(chunk.max(1)).enumerate() {
            let last_chunk = (ci + 1) * chunk.max(1) >= tokens.len();
            self.batch.clear();
            let start = self.len();
            for (i, &tok) in part.iter().enumerate() {
                let want = all_logits || (last_chunk && i + 1 == part.len());
                self.batch.push(tok, start + i, self.seq, want);
            }
            self.model
                .forward(&self.batch, &mut self.kv, &mut self.state)?;
            if all_logits || last_chunk {
                out.extend_from_slice(self.state.logits());
            }
        }
        Ok(out)
    }
}

/// Index of the largest logit (the first one on ties, as llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> TokenId {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as TokenId
}

impl Session<'_> {
    /// Greedy generation after `prompt`, calling `on_token` with each new token id.
    pub fn generate_greedy(
        &mut self,
        prompt: &[TokenId],
        cfg: &GenerationConfig,
        is_eog: impl Fn(TokenId) -> bool,
        mut on_token: impl FnMut(TokenId),
    ) -> Result<(Vec<TokenId>, FinishReason, Timings), ModelError> {
        let t0 = Instant::now();
        let mut logits = self.feed(prompt, cfg.prefill_chunk, false)?;
        let prompt_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let mut tokens = Vec::new();
        let mut finish = FinishReason::Length;
        while tokens.len() < cfg.max_tokens {
            let tok = argmax(&logits);
            if !cfg.ignore_eos && is_eog(tok) {
                finish = FinishReason::Stop;
                break;
            }
            tokens.push(tok);
            on_token(tok);
            if tokens.len() == cfg.max_tokens || self.len() >= self.n_ctx {
                break;
            }
            logits = self.feed(&[tok], 1, false)?;
        }
        let generate_ms = t1.elapsed().as_secs_f64() * 1e3;
        let timings = Timings {
            prompt_tokens: prompt.len(),
            prompt_ms,
            generated_tokens: tokens.len(),
            generate_ms,
            prompt_tokens_per_s: prompt.len() as f64 / (prompt_ms / 1e3),
            generate_tokens_per_s: tokens.len() as f64 / (generate_ms / 1e3),
        };
        Ok((tokens, finish, timings))
    }
}
