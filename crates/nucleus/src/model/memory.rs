//! What running a model costs in memory, before anything is allocated: its weights, the KV
//! cache per token for each kind of layer and in all for a context, the pool's bookkeeping,
//! and the forward pass's scratch for a prompt chunk. `nucleus inspect MODEL --memory` prints
//! it; `scripts/memory_check.sh` compares it with the RSS of real runs. Before a KV cache is
//! allocated, [`MemoryPlan::check_available`] compares what it will allocate with the memory
//! the machine has available, so a context too large errors instead of aborting.

use super::Model;
use crate::kv_cache::{KvConfig, KvType};

/// The longest context accepted at all (tokens), whatever the memory: 2^24.
pub const MAX_CONTEXT: usize = 1 << 24;

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
        self.weights_bytes.saturating_add(self.allocated_bytes())
    }

    /// What is allocated besides the weights (which are mapped from the file): the KV pools,
    /// their bookkeeping and the forward's scratch.
    pub fn allocated_bytes(&self) -> usize {
        self.kv_pool_bytes
            .saturating_add(self.bookkeeping_bytes)
            .saturating_add(self.scratch_bytes)
    }

    /// An error, before anything is allocated, when the KV pools, their bookkeeping and the
    /// scratch need more than the memory available ([`available_memory`]). The weights are
    /// not counted: they are mapped from the file, and the page cache can drop them.
    pub fn check_available(&self) -> Result<(), String> {
        let need = self.allocated_bytes();
        match available_memory() {
            Some(avail) if need as u64 > avail => Err(format!(
                "not enough memory: a KV cache of {} tokens (context {}) and the forward's \
                 scratch need {} (KV cache {}, scratch {}) but {} is available; lower --ctx \
                 (or serve's --kv-tokens), or use --kv-type q8_0",
                self.kv.n_blocks.saturating_mul(self.kv.block_size),
                self.n_ctx,
                human_bytes(need as u64),
                human_bytes(self.kv_pool_bytes.saturating_add(self.bookkeeping_bytes) as u64),
                human_bytes(self.scratch_bytes as u64),
                human_bytes(avail),
            )),
            _ => Ok(()),
        }
    }
}

/// `12.3 GiB`-style.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

/// The memory this process may still allocate, in bytes: `MemAvailable` of /proc/meminfo,
/// or less when the cgroup's `memory.max` leaves less. `None` where neither can be read.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let mem = meminfo
        .as_deref()
        .and_then(|t| kb_field(t, "MemAvailable:"));
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let cgroup = match (
        read("/sys/fs/cgroup/memory.max"),
        read("/sys/fs/cgroup/memory.current"),
    ) {
        (Some(max), Some(cur)) => match (max.trim().parse::<u64>(), cur.trim().parse::<u64>()) {
            (Ok(max), Ok(cur)) => Some(max.saturating_sub(cur)),
            _ => None, // "max": no limit
        },
        _ => None,
    };
    match (mem, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Bytes of this process's anonymous memory in transparent huge pages (`AnonHugePages` of
/// /proc/self/smaps_rollup), where Linux says.
pub fn resident_huge_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    kb_field(&text, "AnonHugePages:")
}

/// The line `KEY  123456 kB` of a /proc file → bytes.
fn kb_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
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
        // One sequence, as `run` and `chat` hold it: prompts fed `chunk` tokens at a time.
        let kv = self
            .kv_config(n_ctx, block_size, ty)
            .fit_window_pool(1, chunk, 0);
        self.memory_plan_for(kv, n_ctx, chunk)
    }

    /// The memory plan of a KV cache configured as `kv` (any number of sequences), for a
    /// context of `n_ctx` tokens and prompt chunks of `chunk` tokens. Sizes saturate rather
    /// than overflow.
    pub fn memory_plan_for(&self, kv: KvConfig, n_ctx: usize, chunk: usize) -> MemoryPlan {
        let hp = &self.hp;
        let block_size = kv.block_size;
        let local_layers = kv.window_layers();
        let per_layer = kv.layer_bytes_per_token();
        let window_pool_blocks = kv.sliding.map_or(0, |s| s.n_blocks);
        let weights_bytes = self.file.tensors.iter().map(|t| t.size).sum();
        // The forward's f32 buffers per token (residual, normed input, q, k, v, attention out,
        // projection, gate, up), its quantized activations (about a byte per value), and the
        // logits of the one row that wants them.
        let (q_dim, kv_dim) = (hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim);
        let att_dim = hp.n_head * hp.head_dim_v;
        // A mixture of experts adds its router's probabilities, each chosen expert's output,
        // and an expert's gathered inputs, gate, up and down rows (all of a chunk's tokens may
        // choose one expert).
        let moe_f32 = hp.moe.map_or(0, |m| {
            m.n_expert + (m.n_expert_used + 2) * hp.n_embd + 2 * m.n_ff_exp
        });
        let per_token_f32 = 3 * hp.n_embd
            + q_dim
            + kv_dim
            + hp.n_head_kv * hp.head_dim_v
            + att_dim
            + 2 * hp.n_ff
            + moe_f32;
        let per_token_q8 = hp.n_embd.max(att_dim) + hp.n_ff.max(hp.moe.map_or(0, |m| m.n_ff_exp));
        let scratch_bytes = chunk
            .saturating_mul(4 * per_token_f32 + per_token_q8 * 34 / 32)
            .saturating_add(4 * (hp.n_vocab + hp.n_embd));
        // Saturating: a huge context must give a huge number, never a wrapped small one.
        let window_pool_bytes = kv
            .window_bytes_per_token()
            .saturating_mul(block_size)
            .saturating_mul(window_pool_blocks);
        let kv_pool_bytes = kv
            .full_bytes_per_token()
            .saturating_mul(block_size)
            .saturating_mul(kv.n_blocks)
            .saturating_add(window_pool_bytes);
        MemoryPlan {
            weights_bytes,
            kv,
            n_ctx,
            global_layers: hp.n_layers - local_layers,
            global_bytes_per_token: per_layer * (hp.n_layers - local_layers),
            local_layers,
            window: hp.sliding_window,
            local_bytes_per_token: per_layer * local_layers,
            kv_pool_bytes,
            window_pool_bytes,
            window_pool_blocks,
            bookkeeping_bytes: BOOKKEEPING_BYTES_PER_BLOCK
                .saturating_mul(kv.n_blocks.saturating_add(window_pool_blocks)),
            chunk_tokens: chunk,
            scratch_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_sizes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   23000000 kB\n";
        assert_eq!(kb_field(text, "MemAvailable:"), Some(23_000_000 * 1024));
        assert_eq!(kb_field("MemTotal: 1 kB\n", "MemAvailable:"), None);
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert!(available_memory().is_some_and(|b| b > 0));
    }
}
