//! The engine's counters, kept by the scheduler thread and read from any thread (`/metrics`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A snapshot of the engine's counters (for `/metrics`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_used_blocks: usize,
    pub kv_free_blocks: usize,
    pub kv_total_blocks: usize,
    /// Blocks holding a cached prefix (in use or kept for reuse).
    pub kv_cached_blocks: usize,
    /// Prompt tokens looked up in the prefix cache (each admitted request's prompt, once).
    pub prefix_cache_queries_tokens: u64,
    /// Of those, tokens found in the cache.
    pub prefix_cache_hits_tokens: u64,
    /// Prompt tokens of admitted requests (counted once, not per recomputation).
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    /// Tokens through the forward pass (prefill, decode and recomputation).
    pub forward_tokens_total: u64,
    pub steps_total: u64,
    pub requests_finished: u64,
    pub requests_cancelled: u64,
    pub requests_failed: u64,
    pub preemptions_total: u64,
    /// Speculation: verifications of proposals, tokens proposed, of those accepted (vLLM's
    /// `spec_decode_num_drafts`, `…_num_draft_tokens`, `…_num_accepted_tokens`).
    pub spec_decode_num_drafts: u64,
    pub spec_decode_num_draft_tokens: u64,
    pub spec_decode_num_accepted_tokens: u64,
    /// Blocks of the draft model's KV pool that sequences use, and its size (0 without one).
    pub draft_kv_used_blocks: usize,
    pub draft_kv_total_blocks: usize,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) running: AtomicUsize,
    pub(super) waiting: AtomicUsize,
    pub(super) kv_used: AtomicUsize,
    pub(super) kv_free: AtomicUsize,
    pub(super) kv_total: AtomicUsize,
    pub(super) kv_cached: AtomicUsize,
    pub(super) prefix_queries: AtomicU64,
    pub(super) prefix_hits: AtomicU64,
    pub(super) prompt_tokens: AtomicU64,
    pub(super) generation_tokens: AtomicU64,
    pub(super) forward_tokens: AtomicU64,
    pub(super) steps: AtomicU64,
    pub(super) finished: AtomicU64,
    pub(super) cancelled: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) preemptions: AtomicU64,
    pub(super) spec_drafts: AtomicU64,
    pub(super) spec_proposed: AtomicU64,
    pub(super) spec_accepted: AtomicU64,
    pub(super) draft_kv_used: AtomicUsize,
    pub(super) draft_kv_total: AtomicUsize,
}

impl Counters {
    /// The counters now, with `incoming` requests not yet taken by the scheduler counted as
    /// waiting.
    pub(super) fn snapshot(&self, incoming: usize) -> EngineStats {
        let c = self;
        EngineStats {
            running: c.running.load(Ordering::Relaxed),
            waiting: c.waiting.load(Ordering::Relaxed) + incoming,
            kv_used_blocks: c.kv_used.load(Ordering::Relaxed),
            kv_free_blocks: c.kv_free.load(Ordering::Relaxed),
            kv_total_blocks: c.kv_total.load(Ordering::Relaxed),
            kv_cached_blocks: c.kv_cached.load(Ordering::Relaxed),
            prefix_cache_queries_tokens: c.prefix_queries.load(Ordering::Relaxed),
            prefix_cache_hits_tokens: c.prefix_hits.load(Ordering::Relaxed),
            prompt_tokens_total: c.prompt_tokens.load(Ordering::Relaxed),
            generation_tokens_total: c.generation_tokens.load(Ordering::Relaxed),
            forward_tokens_total: c.forward_tokens.load(Ordering::Relaxed),
            steps_total: c.steps.load(Ordering::Relaxed),
            requests_finished: c.finished.load(Ordering::Relaxed),
            requests_cancelled: c.cancelled.load(Ordering::Relaxed),
            requests_failed: c.failed.load(Ordering::Relaxed),
            preemptions_total: c.preemptions.load(Ordering::Relaxed),
            spec_decode_num_drafts: c.spec_drafts.load(Ordering::Relaxed),
            spec_decode_num_draft_tokens: c.spec_proposed.load(Ordering::Relaxed),
            spec_decode_num_accepted_tokens: c.spec_accepted.load(Ordering::Relaxed),
            draft_kv_used_blocks: c.draft_kv_used.load(Ordering::Relaxed),
            draft_kv_total_blocks: c.draft_kv_total.load(Ordering::Relaxed),
        }
    }
}
