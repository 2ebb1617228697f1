//! One sequence's generation: prefill the prompt in chunks through the batched forward, then
//! decode token by token until an end-of-generation token, a stop, or the token limit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::context::{check_stream_window, slide_window, ContextError, ContextPolicy, SINK_BLOCKS};
use super::sequence::TokenLogprob;
use super::speculate::SpecStats;
use crate::kernels::PromptSlot;
use crate::kv_cache::{extend_block_hashes, KvCache, KvConfig, KvType, SeqId, PINNED_BLOCKS};
use crate::model::{arithmetic_class, Batch, ForwardState, Model, ModelError, MAX_CONTEXT};
use crate::sampling::{BeamError, FinishReason, SamplingError};
use crate::tokenizer::TokenId;

#[path = "session_generate.rs"]
mod generate;

/// Why a generation failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("{0}")]
    Request(String),
}

impl From<BeamError<ModelError>> for EngineError {
    fn from(e: BeamError<ModelError>) -> Self {
        match e {
            BeamError::Model(e) => EngineError::Model(e),
            BeamError::Sampling(e) => EngineError::Sampling(e),
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

/// The result of [`Session::generate`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct Generation {
    /// The prompt given to this call.
    pub prompt_tokens: Vec<TokenId>,
    /// Generated tokens: an ending end-of-generation token excluded, a token that completed a
    /// stop string included.
    pub tokens: Vec<TokenId>,
    /// The output text (a stop string and what follows it cut off).
    pub text: String,
    pub finish_reason: FinishReason,
    /// One record per generated token, when the request asked for logprobs (sampling only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Beam search: the best hypothesis's summed logprob (raw model distribution, an ending
    /// EOS included). Sampling with logprobs: the sum of the tokens' logprobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sum_logprob: Option<f32>,
    /// Prompt tokens taken from the prefix cache instead of being computed.
    pub cached_tokens: usize,
    /// With speculative decoding: what was proposed and accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpecStats>,
    pub timings: Timings,
}

/// Block size of the sessions' KV caches, in tokens.
pub const BLOCK_SIZE: usize = 16;

/// Tokens a session evaluates in one forward at most (prompts are fed in chunks of at most
/// this; the output does not depend on the chunking).
pub const MAX_CHUNK: usize = 512;

/// A model's working state for one sequence at a time: its KV cache and forward scratch.
pub struct Session<'m> {
    pub model: &'m Model,
    pub kv: KvCache,
    pub state: ForwardState,
    pub seq: SeqId,
    n_ctx: usize,
    batch: Batch,
    /// The session's tokens, in order: those in `seq`, then `n_unfed` not yet evaluated.
    tokens: Vec<TokenId>,
    n_unfed: usize,
    /// Tokens of the last prompt taken from the prefix cache.
    cached_tokens: usize,
    policy: ContextPolicy,
    sink_blocks: usize,
    /// Tokens evicted from the KV cache by the streamed window (`ContextPolicy::Stream`).
    n_evicted: usize,
    /// Set from outside (Ctrl-C in `nucleus chat`): sampling ends after the current token.
    interrupt: Option<Arc<AtomicBool>>,
}

impl<'m> Session<'m> {
    /// A session whose context holds `n_ctx` tokens (prompt and generated together).
    pub fn new(model: &'m Model, n_ctx: usize) -> Session<'m> {
        Self::with_kv_tokens(model, n_ctx, n_ctx)
    }

    /// A session whose context holds `n_ctx` tokens, over a KV cache of `kv_tokens ≥ n_ctx`
    /// tokens: beam search needs room beyond the context for the beams' own blocks (about
    /// `beams × (max_tokens + 2 × BLOCK_SIZE)` tokens; the prompt's blocks are shared).
    /// Panics when the cache does not fit in the memory available: use
    /// [`with_kv_type`](Self::with_kv_type) for an error.
    pub fn with_kv_tokens(model: &'m Model, n_ctx: usize, kv_tokens: usize) -> Session<'m> {
        Self::with_kv_type(model, n_ctx, kv_tokens, KvType::F16)
            .expect("the KV cache fits in memory")
    }

    /// [`with_kv_tokens`](Self::with_kv_tokens) with keys and values stored as `ty`; an error
    /// when the model's head dimension does not fit the type.
    pub fn with_kv_type(
        model: &'m Model,
        n_ctx: usize,
        kv_tokens: usize,
        ty: KvType,
    ) -> Result<Session<'m>, ModelError> {
        // The sliding-window pool holds this sequence's window and a chunk, and the beams' own
        // blocks (the tokens beyond the context).
        let extra_blocks = kv_tokens.saturating_sub(n_ctx).div_ceil(BLOCK_SIZE);
        let cfg = model
            .kv_config(kv_tokens.max(n_ctx), BLOCK_SIZE, ty)
            .fit_window_pool(1, MAX_CHUNK, extra_blocks);
        Self::with_kv_config(model, n_ctx, cfg)
    }

    /// A session over a KV cache configured by the caller (blocks of `cfg.block_size`; a
    /// sliding-window pool must hold a window and [`MAX_CHUNK`] tokens: see
    /// [`KvConfig::fit_window_pool`]).
    pub fn with_kv_config(
        model: &'m Model,
        n_ctx: usize,
        cfg: KvConfig,
    ) -> Result<Session<'m>, ModelError> {
        cfg.check().map_err(ModelError::Invalid)?;
        check_kv_memory(model, &cfg, n_ctx, MAX_CHUNK)?;
        let mut kv = KvCache::new(cfg);
        kv.set_prefix_caching(true);
        let seq = kv.new_seq();
        Ok(Session {
            model,
            kv,
            state: ForwardState::new(),
            seq,
            n_ctx,
            batch: Batch::new(),
            tokens: Vec::new(),
            n_unfed: 0,
            cached_tokens: 0,
            policy: ContextPolicy::Error,
            sink_blocks: SINK_BLOCKS,
            n_evicted: 0,
            interrupt: None,
        })
    }

    /// KV-cache tokens [`with_kv_tokens`](Self::with_kv_tokens) needs for a context of `n_ctx`
    /// and beam search of `beams` × `max_tokens` (the root beam is a fork of the session's
    /// sequence, so even one beam needs a little room).
    pub fn kv_tokens_for_beams(n_ctx: usize, beams: usize, max_tokens: usize) -> usize {
        n_ctx + beams * (max_tokens.min(n_ctx) + 2 * BLOCK_SIZE)
    }

    /// The session's tokens, in order. After a beam search the last ones may not be in the KV
    /// cache yet: they are evaluated at the start of the next [`feed`](Self::feed).
    pub fn tokens(&self) -> &[TokenId] {
        &self.tokens
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Tokens in the session so far (as [`tokens`](Self::tokens)).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Prefix caching (on by default): a prompt fed to an empty session takes the blocks of
    /// an earlier prompt of this session that started the same way (kept in the KV pool after
    /// [`reset`](Self::reset) until their room is needed), and computes only the rest, with
    /// the same results. Turning it off drops what is cached.
    pub fn set_prefix_caching(&mut self, on: bool) {
        self.kv.set_prefix_caching(on);
    }

    /// What to do when the session outgrows its window: [`ContextPolicy::Error`] (the
    /// default) refuses; [`ContextPolicy::Stream`] slides the window (see
    /// [`crate::engine::context`]). `Truncate` is for whole prompts, before a session sees
    /// them ([`crate::engine::context::truncate_to_window`]); here it acts as `Error`.
    pub fn set_context_policy(&mut self, policy: ContextPolicy) -> Result<(), ContextError> {
        if policy == ContextPolicy::Stream {
            check_stream_window(self.n_ctx, self.kv.config().block_size)?;
        }
        self.policy = policy;
        Ok(())
    }

    /// Blocks a streamed window keeps at its start (default [`SINK_BLOCKS`]). 0 gives a plain
    /// window of recent tokens, without attention sinks: only for measuring what sinks are
    /// worth (StreamingLLM's comparison). At most [`PINNED_BLOCKS`]: the sliding-window layers
    /// keep no more of a sequence's start.
    pub fn set_sink_blocks(&mut self, n: usize) {
        assert!(n <= PINNED_BLOCKS, "at most {PINNED_BLOCKS} sink blocks");
        self.sink_blocks = n;
    }

    /// A flag that, once set, ends [`generate_with`](Self::generate_with)'s sampling after the
    /// current token (finish reason `length`, as a caller's own limit), with or without
    /// speculation. Beam search does not look at it.
    pub fn set_interrupt(&mut self, flag: Arc<AtomicBool>) {
        self.interrupt = Some(flag);
    }

    pub(crate) fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Tokens the streamed window has evicted from the cache so far.
    pub fn evicted_tokens(&self) -> usize {
        self.n_evicted
    }

    pub(super) fn streams(&self) -> bool {
        self.policy == ContextPolicy::Stream
    }

    /// Forgets the sequence (a new conversation). Its prompt's blocks stay in the prefix cache.
    pub fn reset(&mut self) {
        let _ = self.kv.free_seq(self.seq);
        self.seq = self.kv.new_seq();
        self.tokens.clear();
        self.n_unfed = 0;
        self.n_evicted = 0;
    }

    /// Appends `tokens`, `chunk` at a time; returns the logits after the last one. With
    /// `all_logits`, every position's logits are kept (for conformance tests) and returned
    /// concatenated. The tokens of one call are one prompt (`Batch::push_prompt`), whatever
    /// `chunk` is.
    pub fn feed(
        &mut self,
        tokens: &[TokenId],
        chunk: usize,
        all_logits: bool,
    ) -> Result<Vec<f32>, ModelError> {
        if self.n_unfed > 0 {
            let unfed = self.tokens.split_off(self.tokens.len() - self.n_unfed);
            self.n_unfed = 0;
            if let Err(e) = self.feed_kv(&unfed, chunk, false) {
                self.reset(); // the sequence is no longer known: start over
                return Err(e);
            }
        }
        self.feed_kv(tokens, chunk, all_logits)
    }

    fn feed_kv(
        &mut self,
        tokens: &[TokenId],
        chunk: usize,
        all_logits: bool,
    ) -> Result<Vec<f32>, ModelError> {
        if !self.streams() && self.len() + tokens.len() > self.n_ctx {
            return Err(ModelError::BadBatch(format!(
                "{} tokens do not fit: the context window holds {} and {} are used",
                tokens.len(),
                self.n_ctx,
                self.len()
            )));
        }
        let slot = |index| PromptSlot {
            len: tokens.len(),
            index,
            all_logits,
        };
        // A prompt that starts the sequence is looked up in the prefix cache (unless every
        // position's logits are wanted); its full blocks are offered to it once computed.
        let mut hashes = Vec::new();
        let mut skip = 0;
        let starts = self.is_empty();
        if starts && self.kv.prefix_caching() && !tokens.is_empty() {
            let bs = self.kv.config().block_size;
            let arithmetic = self.model.arithmetic();
            extend_block_hashes(
                tokens,
                |i| arithmetic_class(arithmetic, slot(i)),
                bs,
                &mut hashes,
            );
            if !all_logits {
                let reusable = (tokens.len() - 1) / bs;
                skip = self
                    .kv
                    .attach_cached(self.seq, &hashes[..reusable.min(hashes.len())])?;
                self.tokens.extend_from_slice(&tokens[..skip]);
            }
        }
        let mut chunk = chunk.clamp(1, MAX_CHUNK);
        if self.streams() {
            // A chunk must fit the window beside the sinks.
            chunk = chunk.min(self.n_ctx / 2);
        }
        let evicted_before = self.n_evicted;
        let mut out = Vec::new();
        let rest = &tokens[skip..];
        for (ci, part) in rest.chunks(chunk).enumerate() {
            let last_chunk = (ci + 1) * chunk >= rest.len();
            self.batch.clear();
            if self.streams() {
                self.n_evicted += slide_window(
                    self.model,
                    &mut self.kv,
                    self.seq,
                    self.sink_blocks,
                    self.n_ctx,
                    part.len(),
                )?;
            }
            let start = self.kv.seq_len(self.seq)?;
            for (i, &tok) in part.iter().enumerate() {
                let want = all_logits || (last_chunk && i + 1 == part.len());
                let index = skip + ci * chunk + i;
                self.batch
                    .push_prompt(tok, start + i, self.seq, want, slot(index));
            }
            self.model
                .forward(&self.batch, &mut self.kv, &mut self.state)?;
            self.tokens.extend_from_slice(part);
            if all_logits || last_chunk {
                out.extend_from_slice(self.state.logits());
            }
            if self.n_evicted == evicted_before {
                // Offered chunk by chunk: a sliding-window pool frees blocks as it goes. (After
                // an eviction the blocks no longer hold the prompt's positions.)
                self.kv.offer_blocks(self.seq, &hashes, &self.tokens)?;
            }
        }
        if starts {
            self.cached_tokens = skip;
        }
        Ok(out)
    }
}

impl Session<'_> {
    /// Tokens that can still be appended without going past the window (streaming: without
    /// sliding it).
    pub fn room(&self) -> usize {
        if self.streams() {
            let bs = self.kv.config().block_size;
            let len = self.kv.seq_len(self.seq).unwrap_or(0);
            (self.n_ctx / bs * bs).saturating_sub(len)
        } else {
            self.n_ctx.saturating_sub(self.len())
        }
    }

    /// Appends generated tokens in one forward and returns every position's logits, each
    /// token computed with the arithmetic it gets when it is decoded alone
    /// (`feed(&[token], 1, false)`), so the logits are those, to the bit: speculative
    /// decoding's verification. The tokens must fit in [`room`](Self::room).
    pub fn feed_generated(&mut self, tokens: &[TokenId]) -> Result<&[f32], ModelError> {
        if tokens.len() > self.room() || self.n_unfed > 0 {
            return Err(ModelError::BadBatch(format!(
                "{} tokens do not fit the window without sliding it ({} left)",
                tokens.len(),
                self.room()
            )));
        }
        let slot = PromptSlot {
            len: 1,
            index: 0,
            all_logits: false,
        };
        self.batch.clear();
        let start = self.kv.seq_len(self.seq)?;
        for (i, &tok) in tokens.iter().enumerate() {
            self.batch.push_prompt(tok, start + i, self.seq, true, slot);
        }
        self.model
            .forward(&self.batch, &mut self.kv, &mut self.state)?;
        self.tokens.extend_from_slice(tokens);
        Ok(self.state.logits())
    }

    /// Drops the last `n` tokens from the session and its KV cache (rejected drafts).
    pub fn rollback(&mut self, n: usize) -> Result<(), ModelError> {
        let len = self.kv.seq_len(self.seq)?;
        if n > len || n > self.tokens.len() || self.n_unfed > 0 {
            return Err(ModelError::BadBatch(format!(
                "cannot roll back {n} of {len} tokens"
            )));
        }
        self.kv.truncate(self.seq, len - n)?;
        self.tokens.truncate(self.tokens.len() - n);
        Ok(())
    }
}

/// Errors, before anything is allocated, when a KV cache `cfg` for contexts of `n_ctx` tokens
/// (prompts fed `chunk` at a time) is beyond [`MAX_CONTEXT`] or needs more memory than the
/// machine has available ([`MemoryPlan::check_available`](crate::model::MemoryPlan)).
pub fn check_kv_memory(
    model: &Model,
    cfg: &KvConfig,
    n_ctx: usize,
    chunk: usize,
) -> Result<(), ModelError> {
    if n_ctx > MAX_CONTEXT {
        return Err(ModelError::Limit(format!(
            "a context of {n_ctx} tokens is beyond what nucleus supports ({MAX_CONTEXT})"
        )));
    }
    let tokens = cfg.n_blocks.saturating_mul(cfg.block_size);
    if tokens > 2 * MAX_CONTEXT {
        return Err(ModelError::Limit(format!(
            "a KV cache of {tokens} tokens is beyond what nucleus supports ({})",
            2 * MAX_CONTEXT
        )));
    }
    model
        .memory_plan_for(*cfg, n_ctx, chunk)
        .check_available()
        .map_err(ModelError::Limit)
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
