//! A draft model for the engine's speculation: a second, smaller model with the model's
//! vocabulary proposes each speculating sequence's next tokens (see
//! [`Engine::start_with_draft`](super::Engine::start_with_draft)). It keeps a KV cache per
//! sequence in its own paged pool, sized here.

use std::sync::Arc;

use super::EngineConfig;
use crate::engine::speculate::draft::check_draft;
use crate::engine::speculate::MAX_DRAFT;
use crate::kv_cache::KvConfig;
use crate::model::{available_memory, human_bytes, Model};
use crate::tokenizer::Tokenizer;

/// A draft model checked against the model it proposes for.
pub struct DraftModel {
    pub(super) model: Arc<Model>,
    pub(super) pass_cost: Option<f64>,
}

impl DraftModel {
    /// `model` (with its tokenizer `draft_tokenizer`) as the draft of a model whose tokenizer
    /// is `target`; an error naming the difference when the vocabularies differ.
    pub fn new(
        model: Arc<Model>,
        draft_tokenizer: &Tokenizer,
        target: &Tokenizer,
    ) -> Result<DraftModel, String> {
        check_draft(&model, draft_tokenizer, target)?;
        Ok(DraftModel {
            model,
            pass_cost: None,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Takes a draft pass (one proposed token for each speculating sequence) to cost `cost`
    /// steps of the model, instead of timing it: with 0, the draft length follows the
    /// acceptance alone (tests use it to make a draft as costly as its model speculate).
    pub fn with_pass_cost(mut self, cost: f64) -> DraftModel {
        self.pass_cost = Some(cost.max(0.0));
        self
    }

    /// A draft pass's cost in steps of `target` before any is timed: the ratio of their
    /// weights, which a decoding step reads once each.
    pub(super) fn prior_cost(&self, target: &Model) -> f64 {
        let bytes = |m: &Model| m.file.tensors.iter().map(|t| t.size).sum::<usize>() as f64;
        (bytes(&self.model) / bytes(target).max(1.0)).clamp(0.0, 4.0)
    }
}

impl EngineConfig {
    /// The draft's KV cache: the tokens of the model's (without shared prefixes: the draft
    /// computes every sequence's own), plus each running sequence's drafts and a partial
    /// block; a sliding-window pool for chunks of a step's tokens and the drafts, whose
    /// rollback it must survive.
    pub fn draft_kv_config(&self, draft: &Model) -> KvConfig {
        let bs = self.block_size.max(1);
        let seqs = self.max_running.max(1);
        let tokens = self
            .kv_tokens
            .max(bs)
            .saturating_add(seqs.saturating_mul(MAX_DRAFT + bs));
        draft.kv_config(tokens, bs, self.kv_type).fit_window_pool(
            seqs,
            self.step_token_budget + MAX_DRAFT,
            0,
        )
    }

    /// [`check`](Self::check) for the model with `draft` beside it: the draft's KV type, and
    /// both KV caches and scratches together against the memory available.
    pub fn check_with_draft(&self, model: &Model, draft: &Model) -> Result<(), String> {
        self.check(model)?;
        let dkv = self.draft_kv_config(draft);
        dkv.check().map_err(|e| format!("the draft model: {e}"))?;
        let n_ctx = if self.allow_long_context {
            self.n_ctx
        } else {
            self.n_ctx.min(model.hp.n_ctx_train)
        };
        let budget = self.step_token_budget;
        crate::engine::session::check_kv_memory(draft, &dkv, n_ctx, budget + MAX_DRAFT)
            .map_err(|e| format!("the draft model: {e}"))?;
        let ours = model
            .memory_plan_for(self.kv_config(model), n_ctx, budget)
            .allocated_bytes();
        let theirs = draft
            .memory_plan_for(dkv, n_ctx, budget + MAX_DRAFT)
            .allocated_bytes();
        let need = ours.saturating_add(theirs) as u64;
        match available_memory() {
            Some(avail) if need > avail => Err(format!(
                "not enough memory: the KV caches and scratch of the model ({}) and of the \
                 draft model ({}) need {} but {} is available; lower --kv-tokens or --ctx, or \
                 use --kv-type q8_0",
                human_bytes(ours as u64),
                human_bytes(theirs as u64),
                human_bytes(need),
                human_bytes(avail)
            )),
            _ => Ok(()),
        }
    }
}
