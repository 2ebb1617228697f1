//! The batch's attention: which of the two arithmetics each token gets, and how the work of
//! all tokens and heads is cut into tasks for the thread pool.

use super::{attend_heads, attend_tiled, visible_range, ScoreScale, TILED_MIN_BATCH};
use crate::kernels::interleaved::Arithmetic;
use crate::kernels::matmul::PromptSlot;
use crate::kv_cache::KvCache;
use crate::model::{Batch, Model, ModelError};

/// What of a token's arithmetic its place in its prompt decides, as a small number: two tokens
/// with the same class, the same position and the same tokens before them get the same keys and
/// values, bit for bit. The prefix cache keys blocks by it
/// ([`crate::kv_cache::extend_block_hashes`]).
///
/// In [`Arithmetic::Exact`] that is llama.cpp's choice of product kernels and whether the token
/// gets the tiled attention of a 64+ token micro-batch. nucleus's own arithmetic computes every
/// token alike wherever it sits, so there every token has class 0.
pub fn arithmetic_class(arithmetic: Arithmetic, slot: PromptSlot) -> u8 {
    match arithmetic {
        Arithmetic::Fast => 0,
        Arithmetic::Exact => {
            let tiled = u8::from(tiled_attention(arithmetic, slot));
            slot.matmul_class() | tiled << 3
        }
    }
}

/// Whether a token's attention over an f16 cache is the tiled one ([`attend_tiled`]) rather
/// than the one-query one ([`attend_heads`]). llama.cpp takes the tiled one for the queries of a
/// 64+ token micro-batch, so `--exact` does too; nucleus's own arithmetic takes it for every
/// token, so that a generated token and a prompt's, one query or many, are computed alike (and
/// a verification's rows share the reading of the keys).
fn tiled_attention(arithmetic: Arithmetic, slot: PromptSlot) -> bool {
    arithmetic == Arithmetic::Fast || slot.ubatch_len() >= TILED_MIN_BATCH
}

/// A slice written from several pool threads at once, each thread to its own disjoint rows.
struct SharedOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: SharedOut is only used inside `ThreadPool::run`, where every task writes a range no
// other task touches (see `rows`), and the borrow it came from outlives the run.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    fn new(s: &mut [f32]) -> SharedOut {
        SharedOut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// # Safety
    /// Callers must not hand out overlapping ranges to concurrent tasks.
    #[allow(clippy::mut_from_ref)]
    unsafe fn rows(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len);
        // SAFETY: in bounds (asserted) and, by the caller's contract, not aliased.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// The most tokens of a sequence in one unit of tiled attention: each unit widens its keys
/// and values to f32 once for all its queries, so larger units widen less per query (the 1.5B
/// Q4_K_M shape's pp2048, two alternating rounds: 8 tokens 216.6-218.9 tok/s, 16 225.3-226.0,
/// 32 229.9-232.2, 64 221.0-226.5 against 32's 216.8-230.1 in a second pair).
const UNIT_TOKENS: usize = 32;

/// Units of work per head: a token with tiled attention (`tiled(t)`, [`tiled_attention`])
/// goes with up to [`UNIT_TOKENS`] − 1 more of its sequence's (`same_seq`), any other token
/// alone (its one-query attention). As (first token, tokens).
fn attention_units(
    n_tokens: usize,
    tiled: &dyn Fn(usize) -> bool,
    same_seq: impl Fn(usize, usize) -> bool,
) -> Vec<(usize, usize)> {
    let mut units = Vec::new();
    let mut t = 0;
    while t < n_tokens {
        let mut m = 1;
        if tiled(t) {
            while m < UNIT_TOKENS && t + m < n_tokens && tiled(t + m) && same_seq(t + m, t) {
                m += 1;
            }
        }
        units.push((t, m));
        t += m;
    }
    units
}

/// How the `group` query heads of a KV head split into parts: (parts, heads per part). A unit
/// is one task per KV head and part: the heads that share a KV head are computed together (the
/// keys and values read once for them all), in as many parts as keep every thread busy when
/// the units are few (one decode step). A query's bits do not depend on the heads or queries
/// it is computed with, so the split is free to follow the load. Tiled units widen each tile
/// of keys and values once per task, so they take one task per thread; one-query ones, which
/// read the cache as it is, four for a finer balance.
fn head_parts(
    units: &[(usize, usize)],
    tiled: &dyn Fn(usize) -> bool,
    threads: usize,
    n_head_kv: usize,
    group: usize,
) -> (usize, usize) {
    let tasks_per_thread = if units.iter().all(|&(t0, _)| tiled(t0)) {
        1
    } else {
        4
    };
    let parts = (tasks_per_thread * threads)
        .div_ceil((units.len() * n_head_kv).max(1))
        .clamp(1, group);
    let heads_per_part = group.div_ceil(parts);
    (group.div_ceil(heads_per_part), heads_per_part)
}

impl Model {
    /// Attention for every (token, head) of the batch, spread over the thread pool.
    pub(in crate::model) fn attention(
        &self,
        il: usize,
        batch: &Batch,
        kv: &KvCache,
        q: &[f32],
        att: &mut [f32],
    ) -> Result<(), ModelError> {
        let hp = &self.hp;
        let (hd, hdv) = (hp.head_dim, hp.head_dim_v);
        let group = hp.n_head / hp.n_head_kv;
        let window = hp.layer_window(il);
        // (A quantized cache takes the one-query path for every token.)
        let f16_cache = kv.config().ty == crate::kv_cache::KvType::F16;
        let tiled = |t: usize| f16_cache && tiled_attention(self.arithmetic, batch.prompt[t]);
        let units = attention_units(batch.len(), &tiled, |t, u| batch.seqs[t] == batch.seqs[u]);
        let (parts, heads_per_part) = if f16_cache {
            head_parts(&units, &tiled, self.pool.n_threads(), hp.n_head_kv, group)
        } else {
            // A quantized cache: one head a task.
            (group, 1)
        };
        let tasks_per_unit = hp.n_head_kv * parts;
        let mut task_start = Vec::with_capacity(units.len() + 1);
        task_start.push(0);
        for _ in &units {
            let last = *task_start.last().expect("pushed");
            task_start.push(last + tasks_per_unit);
        }
        let n_tasks = *task_start.last().expect("pushed");
        let out = SharedOut::new(att);
        let kv_ref = kv;
        let scale = ScoreScale::new(
            if hp.scale_queries { 1.0 } else { hp.attn_scale },
            hp.attn_softcap,
        );
        // gpt-oss's attention sinks, one per query head.
        let sinks = self.weights.layers[il].attn_sinks.as_deref();
        // Tasks are claimed in small groups from a shared counter, so a thread that is
        // descheduled or slower (long prompts: later tokens see more keys) holds up little.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let group_of = (n_tasks / (self.pool.n_threads() * 16)).clamp(1, 16);
        self.pool.run(|_, _| loop {
            let g0 = next.fetch_add(group_of, std::sync::atomic::Ordering::Relaxed);
            if g0 >= n_tasks {
                break;
            }
            for task in g0..(g0 + group_of).min(n_tasks) {
                let unit = task_start.partition_point(|&s| s <= task) - 1;
                let ((t0, m), i) = (units[unit], task - task_start[unit]);
                let blocks = kv_ref
                    .layer_blocks(il, batch.seqs[t0])
                    .expect("checked in check_batch");
                let q_of =
                    |t: usize, h: usize| &q[(t * hp.n_head + h) * hd..(t * hp.n_head + h + 1) * hd];
                // SAFETY: a task is the only one writing its heads of its unit's rows.
                let out_of =
                    |t: usize, h: usize| unsafe { out.rows((t * hp.n_head + h) * hdv, hdv) };
                let range_of = |t: usize| visible_range(batch.positions[t], window);
                // Part i % parts of KV head i / parts.
                let (kvh, part) = (i / parts, i % parts);
                let h0 = kvh * group + part * heads_per_part;
                let heads = h0..(h0 + heads_per_part).min((kvh + 1) * group);
                if tiled(t0) {
                    // Its heads' queries, head by head.
                    let pairs = || {
                        heads
                            .clone()
                            .flat_map(|h| (t0..t0 + m).map(move |t| (t, h)))
                    };
                    let queries: Vec<&[f32]> = pairs().map(|(t, h)| q_of(t, h)).collect();
                    let ranges: Vec<(usize, usize)> = pairs().map(|(t, _)| range_of(t)).collect();
                    let mut outs: Vec<&mut [f32]> = pairs().map(|(t, h)| out_of(t, h)).collect();
                    let sinks: Option<Vec<f32>> =
                        sinks.map(|s| pairs().map(|(_, h)| s[h]).collect());
                    let how = (scale, sinks.as_deref());
                    attend_tiled(kv_ref, il, blocks, kvh, &queries, &ranges, how, &mut outs);
                } else {
                    let queries: Vec<&[f32]> = heads.clone().map(|h| q_of(t0, h)).collect();
                    let how = (scale, sinks.map(|s| &s[heads.clone()]));
                    let mut outs: Vec<&mut [f32]> = heads.map(|h| out_of(t0, h)).collect();
                    attend_heads(
                        kv_ref,
                        il,
                        blocks,
                        kvh,
                        &queries,
                        range_of(t0),
                        how,
                        &mut outs,
                    );
                }
            }
        });
        Ok(())
    }
}
