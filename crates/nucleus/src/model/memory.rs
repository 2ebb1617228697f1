//! What running a model costs in memory, before anything is allocated: its weights, the KV
//! cache per token for each kind of layer and in all for a context, the pool's bookkeeping,
//! and the forward pass's scratch for a prompt chunk. `nucleus inspect MODEL --memory` prints
//! it; `scripts/memory_check.sh` compares it with the RSS of real runs.

use super::Model;
use crate::kv_cache::{KvConfig, KvType};

/// Per-block bookkeeping of the pool besides the keys and values: a reference count and a
/// free-list entry (4 bytes each), and, for a block holding a cached prefix, its hash in two
/// maps and its place in the eviction order (about 64 bytes).
pub const BOOKKEEPING_BYTES_PER_BLOCK: usize = 8 + 64;

/// The memory a model needs for a context of `n_ctx` tokens.
#[derive(Clone, Debug)]
pub struct MemoryPlan {
    /// Bytes of the weights (memory-mapped from the file: the page cache holds them).
    pub weights_bytes: usize,
    pub kv: KvConfig,
    pub n_ctx: usize,
    /// Layers attending over the whole context, and their KV bytes per token.
    pub global_layers: usize,
    pub global_bytes_per_token: usize,
    /// Sliding-window layers, their window and KV bytes per token (held for the window only).
    pub local_layers: usize,
    pub window: Option<usize>,
    pub local_bytes_per_token: usize,
    /// Bytes of the pools: the full-context pool's blocks (the context rounded up to whole
    /// blocks) for the global layers, and the window pool's for the local layers.
    pub kv_pool_bytes: usize,
    /// Of which the window pool's, and its blocks (0 without local layers).
    pub window_pool_bytes: usize,
    pub window_pool_blocks: usize,
    /// The pool's bookkeeping at most (every block cached).
    pub bookkeeping_bytes: usize,
    /// The forward pass's buffers for a chunk of `chunk_tokens` prompt tokens.
    pub chunk_tokens: usize,
    pub scratch_bytes: usize,
}

impl MemoryPlan {
    pub fn total_bytes(&self) -> usize {
        self.weights_bytes + self.kv_pool_bytes + self.bookkeeping_bytes + self.scratch_bytes
    }
}

impl Model {
    /// The memory plan for a context of `n_ctx` tokens with a KV cache of `ty` in blocks of
    /// `block_size`, prompts computed `chunk` tokens at a time.
    pub fn memory_plan(
        &self,
        n_ctx: usize,
        ty: KvType,
        block_size: usize,
        chunk: usize,
    ) -> MemoryPlan {
        let hp = &self.hp;
        // One sequence, as `run` and `chat` hold it: prompts fed `chunk` tokens at a time.
        let kv = self
            .kv_config(n_ctx, block_size, ty)
            .fit_window_pool(1, chunk, 0);
        let local_layers = kv.window_layers();
        let per_layer = kv.layer_bytes_per_token();
        let window_pool_blocks = kv.sliding.map_or(0, |s| s.n_blocks);
        let weights_bytes = self.file.tensors.iter().map(|t| t.size).sum();
        // The forward's f32 buffers per token (residual, normed input, q, k, v, attention out,
        // projection, gate, up), its quantized activations (about a byte per value), and the
        // logits of the one row that wants them.
        let (q_dim, kv_dim) = (hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim);
        let att_dim = hp.n_head * hp.head_dim_v;
        let per_token_f32 =
            3 * hp.n_embd + q_dim + kv_dim + hp.n_head_kv * hp.head_dim_v + att_dim + 2 * hp.n_ff;
        let per_token_q8 = hp.n_embd.max(att_dim) + hp.n_ff;
        let scratch_bytes =
            chunk * (4 * per_token_f32 + per_token_q8 * 34 / 32) + 4 * (hp.n_vocab + hp.n_embd);
        MemoryPlan {
            weights_bytes,
            kv,
            n_ctx,
            global_layers: hp.n_layers - local_layers,
            global_bytes_per_token: per_layer * (hp.n_layers - local_layers),
            local_layers,
            window: hp.sliding_window,
            local_bytes_per_token: per_layer * local_layers,
            kv_pool_bytes: kv.total_bytes(),
            window_pool_bytes: kv.window_bytes_per_token() * block_size * window_pool_blocks,
            window_pool_blocks,
            bookkeeping_bytes: BOOKKEEPING_BYTES_PER_BLOCK * (kv.n_blocks + window_pool_blocks),
            chunk_tokens: chunk,
            scratch_bytes,
        }
    }
}
