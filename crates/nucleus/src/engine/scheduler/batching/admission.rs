//! Admission and eviction: requests move from the inbox to the waiting queue, from the waiting
//! queue into the running set while the KV pool can hold them (with the cached blocks of their
//! prefix), out of it when cancelled or preempted (newest first), and streamed sequences slide
//! their windows. What each step computes is decided by the scheduler's `plan`.

use std::sync::atomic::Ordering;

use super::draft::DraftState;
use super::{Scheduler, Seq};
use crate::engine::context::{slide_window, ContextPolicy, SINK_BLOCKS};
use crate::engine::scheduler::Counters;
use crate::engine::sequence::Sequence;
use crate::engine::speculate::{DraftLength, SpecStats};
use crate::kv_cache::KvCache;

/// Extends `s` (at a block edge) with the cached blocks that continue its prompt.
pub(super) fn take_cached(kv: &mut KvCache, counters: &Counters, block_size: usize, s: &mut Seq) {
    let Some(id) = s.kv_seq else { return };
    let added = kv
        .attach_cached(id, s.reusable_hashes(block_size))
        .unwrap_or(0);
    s.n_cached += added;
    s.cached_tokens += added;
    if s.preemptions == 0 {
        counters
            .prefix_hits
            .fetch_add(added as u64, Ordering::Relaxed);
    }
}

impl Scheduler<'_> {
    /// Moves new requests into the waiting queue, sleeping while there is nothing to do.
    /// Returns false on shutdown.
    pub(super) fn take_incoming(&mut self) -> bool {
        let mut inbox = self.shared.inbox.lock().expect("inbox lock");
        while self.running.is_empty()
            && self.waiting.is_empty()
            && inbox.incoming.is_empty()
            && !inbox.shutdown
        {
            inbox = self.shared.wake.wait(inbox).expect("inbox lock");
        }
        if inbox.shutdown {
            return false;
        }
        let bs = self.shared.cfg.block_size;
        for p in inbox.incoming.drain(..) {
            self.waiting.push_back(Seq {
                tx: p.tx,
                hashes: p.hashes,
                cached_tokens: 0,
                seq: Sequence::with_sampler(self.tok, &p.prompt, &p.req, p.sampler),
                kv_seq: None,
                n_cached: 0,
                order: 0,
                preemptions: 0,
                streams: p.policy == ContextPolicy::Stream,
                n_evicted: 0,
                dropped_tokens: p.dropped_tokens,
                max_cached_blocks: match p.policy {
                    ContextPolicy::Stream => (self.shared.cfg.n_ctx / bs).saturating_sub(1),
                    _ => usize::MAX,
                },
                draft_len: match self.shared.cfg.max_draft() {
                    0 => None,
                    k => Some(DraftLength::new(k)),
                },
                drafts: Vec::new(),
                spec: SpecStats::default(),
                draft: DraftState::default(),
            });
        }
        self.shared
            .counters
            .waiting
            .store(self.waiting.len(), Ordering::Relaxed);
        true
    }

    pub(super) fn release(&mut self, seq: &mut Seq) {
        if let Some(id) = seq.kv_seq.take() {
            let _ = self.kv.free_seq(id);
        }
        if let Some(d) = &mut self.draft {
            d.release(&mut seq.draft);
        }
        seq.n_cached = 0;
        seq.drafts.clear();
        // A streamed sequence is recomputed from its start, sliding through its window again.
        seq.n_evicted = 0;
    }

    pub(super) fn drop_cancelled(&mut self) {
        let c = &self.shared.counters;
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].tx.is_closed() {
                let mut s = self.running.remove(i);
                self.release(&mut s);
                c.cancelled.fetch_add(1, Ordering::Relaxed);
            } else {
                i += 1;
            }
        }
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.tx.is_closed());
        c.cancelled
            .fetch_add((before - self.waiting.len()) as u64, Ordering::Relaxed);
    }

    /// Blocks the running sequences still need for their uncached tokens.
    pub(super) fn promised_blocks(&self) -> usize {
        self.running
            .iter()
            .map(|s| match s.kv_seq {
                Some(id) => {
                    let demand = s.kv_demand(self.shared.cfg.n_ctx);
                    self.kv.blocks_needed(id, demand).unwrap_or(0)
                }
                None => s.tokens().len().div_ceil(self.shared.cfg.block_size),
            })
            .sum()
    }

    pub(super) fn admit(&mut self) {
        let cfg = &self.shared.cfg;
        while self.running.len() < cfg.max_running {
            let Some(front) = self.waiting.front() else {
                break;
            };
            // Cached blocks cost nothing, unless no sequence holds them (then they are taken
            // from the free ones).
            let (found, parked) = self.kv.lookup_prefix(front.reusable_hashes(cfg.block_size));
            let tokens = match front.streams {
                true => front.tokens().len().min(cfg.n_ctx),
                false => front.tokens().len(),
            };
            let need = tokens.div_ceil(cfg.block_size).saturating_sub(found)
                + parked
                + cfg.headroom_blocks;
            let free = self.kv.free_blocks();
            if free < self.promised_blocks() + need {
                if self.running.is_empty() && self.kv.used_blocks() == 0 {
                    // Can never fit (submit checks the prompt; this is a preempted sequence that
                    // grew past the whole pool).
                    let mut s = self.waiting.pop_front().expect("front exists");
                    self.fail(&mut s, "the sequence no longer fits in the KV cache");
                    continue;
                }
                break;
            }
            let mut s = self.waiting.pop_front().expect("front exists");
            let id = self.kv.new_seq();
            s.kv_seq = Some(id);
            s.n_cached = 0;
            s.cached_tokens = 0;
            s.order = self.next_order;
            self.next_order += 1;
            let c = &self.shared.counters;
            if s.preemptions == 0 {
                let n = s.seq.prompt().len() as u64;
                c.prompt_tokens.fetch_add(n, Ordering::Relaxed);
                if self.kv.prefix_caching() {
                    c.prefix_queries.fetch_add(n, Ordering::Relaxed);
                }
            }
            take_cached(&mut self.kv, c, cfg.block_size, &mut s);
            self.running.push(s);
        }
    }

    /// Whether running sequence `i` should wait for an older running sequence that is
    /// computing the very block `i` would compute next (equal prefix hashes): it takes the
    /// block from the cache once that one is done, instead of computing it twice.
    pub(super) fn waits_for_shared_prefix(&self, i: usize) -> bool {
        let bs = self.shared.cfg.block_size;
        let s = &self.running[i];
        let next = s.n_cached / bs;
        let Some(&hash) = s.reusable_hashes(bs).get(next) else {
            return false;
        };
        self.running.iter().any(|o| {
            o.order < s.order && o.n_cached < (next + 1) * bs && o.hashes.get(next) == Some(&hash)
        })
    }

    pub(super) fn preempt_newest(&mut self) {
        let i = (0..self.running.len())
            .max_by_key(|&i| self.running[i].order)
            .expect("at least one running");
        let mut s = self.running.remove(i);
        self.release(&mut s);
        s.preemptions += 1;
        self.shared
            .counters
            .preemptions
            .fetch_add(1, Ordering::Relaxed);
        self.waiting.push_front(s);
    }

    /// Makes room in the windows of streamed sequences that are full: each evicts its oldest
    /// blocks after the sinks (see [`slide_window`]) for its next chunk.
    pub(super) fn slide_windows(&mut self) {
        let cfg = &self.shared.cfg;
        let mut failed = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            let Some(id) = s.kv_seq.filter(|_| s.streams && s.uncached() > 0) else {
                continue;
            };
            let want = s.uncached().min(cfg.step_token_budget).min(cfg.n_ctx / 2);
            match slide_window(self.model, &mut self.kv, id, SINK_BLOCKS, cfg.n_ctx, want) {
                Ok(0) => {}
                Ok(evicted) => {
                    s.n_cached -= evicted;
                    s.n_evicted += evicted;
                    s.dropped_tokens += evicted;
                    // The blocks no longer hold the prompt's positions.
                    s.hashes.clear();
                    // (A draft proposes for unslid windows only: see `propose_drafts`.)
                    if let Some(d) = &mut self.draft {
                        d.release(&mut s.draft);
                    }
                }
                Err(e) => failed.push((i, e.to_string())),
            }
        }
        for (i, e) in failed.into_iter().rev() {
            let mut s = self.running.remove(i);
            self.fail(&mut s, &format!("cannot slide the context window: {e}"));
        }
    }
}
