//! The scheduler thread: each step it takes new requests, admits what fits in the KV cache,
//! plans one batch (decode tokens first, then prefill chunks), runs one forward and hands each
//! sequence its logits row. See the [module above](super) for the policy.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::{prompt_slot, Counters, Event, Finished, Pending, Shared, TokenEvent};
use crate::engine::context::SINK_BLOCKS;
use crate::engine::sequence::{Sequence, SequenceStep};
use crate::engine::speculate::ngram::NgramProposer;
use crate::engine::speculate::{DraftLength, SpecStats, StepCost};
use crate::kv_cache::{BlockHash, KvCache, SeqId};
use crate::model::{Batch, ForwardState, Model};
use crate::tokenizer::{TokenId, Tokenizer};

mod admission;
mod draft;
mod speculation;

use admission::take_cached;
pub(super) use draft::DraftRunner;
use draft::DraftState;

struct Seq<'t> {
    tx: UnboundedSender<Event>,
    /// Hashes of the full blocks of the prompt, for the prefix cache.
    hashes: Vec<BlockHash>,
    /// Prompt tokens taken from the prefix cache since the last admission.
    cached_tokens: usize,
    /// The decoding state; its context (prompt, then the generated tokens: the last one not yet
    /// in the cache while decoding) is what the batches feed.
    seq: Sequence<'t>,
    kv_seq: Option<SeqId>,
    n_cached: usize,
    /// Admission order; the highest is the newest (preempted first).
    order: u64,
    preemptions: usize,
    /// `stream`: the window slides instead of the sequence ending.
    streams: bool,
    /// Context tokens after the sinks that the streamed window evicted from the cache (the
    /// cache holds the sinks, then the context from `SINK_BLOCKS × block_size + n_evicted`).
    n_evicted: usize,
    /// Tokens dropped from the context: the prompt's by `truncate`, and every eviction.
    dropped_tokens: usize,
    /// Cached blocks it may take at most (a streamed sequence: what its window holds).
    max_cached_blocks: usize,
    /// With speculation: how many tokens to propose next.
    draft_len: Option<DraftLength>,
    /// Tokens proposed for this step after the pending one.
    drafts: Vec<TokenId>,
    spec: SpecStats,
    /// With a draft model: what its cache holds of this sequence.
    draft: DraftState,
}

impl Seq<'_> {
    fn tokens(&self) -> &[TokenId] {
        self.seq.context()
    }

    /// Hashes of the cached blocks this sequence may take: full prompt blocks before its last
    /// uncached token (whose logits must be computed).
    fn reusable_hashes(&self, block_size: usize) -> &[BlockHash] {
        let n = (self.tokens().len() - 1) / block_size;
        &self.hashes[..n.min(self.hashes.len()).min(self.max_cached_blocks)]
    }

    fn uncached(&self) -> usize {
        self.tokens().len() - self.n_evicted - self.n_cached
    }

    /// Index in the context of the token at cache position `pos`.
    fn context_index(&self, pos: usize, block_size: usize) -> usize {
        if self.n_evicted > 0 && pos >= SINK_BLOCKS * block_size {
            pos + self.n_evicted
        } else {
            pos
        }
    }

    /// Uncached tokens that will need room in the cache before the next ones can come:
    /// all of them, or for a streamed sequence, what is left of its window.
    fn kv_demand(&self, n_ctx: usize) -> usize {
        if self.streams {
            self.uncached().min(n_ctx.saturating_sub(self.n_cached))
        } else {
            self.uncached()
        }
    }
}

pub(super) struct Scheduler<'a> {
    shared: &'a Shared,
    model: &'a Model,
    tok: &'a Tokenizer,
    kv: KvCache,
    state: ForwardState,
    batch: Batch,
    running: Vec<Seq<'a>>,
    waiting: VecDeque<Seq<'a>>,
    next_order: u64,
    ngram: NgramProposer,
    /// The draft model proposing instead of prompt lookup, with its own KV pool.
    draft: Option<DraftRunner<'a>>,
    /// Step time against rows, for the cost of a verification row.
    step_cost: StepCost,
}

impl<'a> Scheduler<'a> {
    pub(super) fn new(
        shared: &'a Shared,
        model: &'a Model,
        tok: &'a Tokenizer,
        kv: KvCache,
        draft: Option<DraftRunner<'a>>,
    ) -> Scheduler<'a> {
        Scheduler {
            shared,
            model,
            tok,
            kv,
            state: ForwardState::new(),
            batch: Batch::new(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            next_order: 0,
            ngram: NgramProposer::default(),
            draft,
            step_cost: StepCost::default(),
        }
    }

    pub(super) fn run(&mut self) {
        loop {
            if !self.take_incoming() {
                self.fail_all("the server is shutting down");
                self.publish();
                return;
            }
            self.drop_cancelled();
            self.admit();
            self.publish();
            if self.running.is_empty() {
                continue;
            }
            let plan = self.plan();
            if !plan.is_empty() {
                self.step(&plan);
            }
            self.publish();
        }
    }

    /// Which tokens of which sequences go into this step's batch: (running index, count).
    /// Preempts the newest sequences while the KV pool cannot hold the step.
    fn plan(&mut self) -> Vec<(usize, usize)> {
        let budget = self.shared.cfg.step_token_budget;
        if self.kv.prefix_caching() {
            // Prompts still being computed may find their next blocks cached by now.
            let bs = self.shared.cfg.block_size;
            for s in self.running.iter_mut().filter(|s| s.uncached() > 1) {
                take_cached(&mut self.kv, &self.shared.counters, bs, s);
            }
        }
        self.slide_windows();
        let n_ctx = self.shared.cfg.n_ctx;
        let mut speculate = self.shared.cfg.max_draft() > 0;
        loop {
            let mut plan = Vec::new();
            let mut left = budget;
            // Decode tokens first: they are what running streams wait for.
            for (i, s) in self.running.iter().enumerate() {
                if s.uncached() == 1 && left > 0 {
                    plan.push((i, 1));
                    left -= 1;
                }
            }
            // Then what speculation proposes after them.
            for s in &mut self.running {
                s.drafts.clear();
            }
            if speculate {
                self.propose_drafts(&plan, &mut left);
            }
            // Then prefill chunks, oldest first.
            let mut order: Vec<usize> = (0..self.running.len())
                .filter(|&i| self.running[i].uncached() > 1 && !self.waits_for_shared_prefix(i))
                .collect();
            order.sort_by_key(|&i| self.running[i].order);
            for i in order {
                if left == 0 {
                    break;
                }
                let n = self.running[i].kv_demand(n_ctx).min(left);
                if n > 0 {
                    plan.push((i, n));
                    left -= n;
                }
            }
            let needed: usize = plan
                .iter()
                .map(|&(i, n)| {
                    let s = &self.running[i];
                    let id = s.kv_seq.expect("running sequences have a cache seq");
                    self.kv
                        .blocks_needed(id, n + s.drafts.len())
                        .unwrap_or(usize::MAX / 4)
                })
                .sum();
            let free = self.kv.free_blocks();
            if needed <= free {
                return plan;
            }
            if speculate && self.running.iter().any(|s| !s.drafts.is_empty()) {
                // Proposals are the first thing to go when blocks run short.
                speculate = false;
                continue;
            }
            if self.running.len() > 1 {
                self.preempt_newest();
                continue;
            }
            // A single sequence: shrink its chunk to what fits.
            let (i, n) = plan[0];
            let id = self.running[i].kv_seq.expect("running");
            let mut fit = n;
            while fit > 0 && self.kv.blocks_needed(id, fit).unwrap_or(usize::MAX) > free {
                fit -= 1;
            }
            self.running[i].drafts.clear();
            if fit == 0 {
                let mut s = self.running.remove(i);
                self.fail(&mut s, "the KV cache is too small for this sequence");
                return Vec::new();
            }
            return vec![(i, fit)];
        }
    }

    fn step(&mut self, plan: &[(usize, usize)]) {
        self.fill_batch(plan);
        let c = &self.shared.counters;
        c.steps.fetch_add(1, Ordering::Relaxed);
        c.forward_tokens
            .fetch_add(self.batch.len() as u64, Ordering::Relaxed);
        let started = Instant::now();
        let result = self
            .model
            .forward(&self.batch, &mut self.kv, &mut self.state);
        if plan.iter().all(|&(_, n)| n == 1) {
            // Decode steps only: prefill rows (long attention, other arithmetic) would blur it.
            self.step_cost
                .observe(self.batch.len(), started.elapsed().as_secs_f64());
        }
        if let Err(e) = result {
            // Should not happen (the plan fits); fail the sequences of this batch, keep serving.
            let msg = format!("forward pass failed: {e}");
            let mut idx: Vec<usize> = plan.iter().map(|&(i, _)| i).collect();
            idx.sort_unstable_by(|a, b| b.cmp(a));
            for i in idx {
                let mut s = self.running.remove(i);
                self.fail(&mut s, &msg);
            }
            return;
        }
        let n_vocab = self.model.hp.n_vocab;
        let all_logits = self.state.logits();
        let mut buf: Vec<f32> = Vec::with_capacity(n_vocab);
        let mut row = 0;
        let mut done: Vec<usize> = Vec::new();
        let mut finals: Vec<(UnboundedSender<Event>, Finished)> = Vec::new();
        for &(i, n) in plan {
            let s = &mut self.running[i];
            let last = n == s.uncached();
            s.n_cached += n;
            if let Some(id) = s.kv_seq {
                let _ = self.kv.offer_blocks(id, &s.hashes, s.seq.context());
            }
            if !last {
                continue;
            }
            // One row for the pending token, one per draft.
            let rows = 1 + s.drafts.len();
            let drafts = std::mem::take(&mut s.drafts);
            let logits = &all_logits[row * n_vocab..(row + rows) * n_vocab];
            let (accepted, end) = sample_rows(s, logits, &drafts, c, &mut buf);
            match end {
                RowsEnd::Open => {}
                RowsEnd::Failed => done.push(i),
                RowsEnd::Finished(f) => {
                    // Sent after the blocks are freed and the stats published, so that a
                    // client that saw its request end sees the engine without it.
                    finals.push((s.tx.clone(), f));
                    done.push(i);
                }
            }
            row += rows;
            if !drafts.is_empty() && done.last() != Some(&i) {
                let (kv, c) = (&mut self.kv, &self.shared.counters);
                let s = &mut self.running[i];
                if let Err(e) = speculation::verified(kv, c, s, drafts.len(), accepted) {
                    // (The rollback slack keeps what a rollback needs: not expected.)
                    c.failed.fetch_add(1, Ordering::Relaxed);
                    let _ =
                        s.tx.send(Event::Error(format!("cannot roll back drafts: {e}")));
                    done.push(i);
                }
            }
        }
        done.sort_unstable_by(|a, b| b.cmp(a));
        for i in done {
            let mut s = self.running.remove(i);
            self.release(&mut s);
        }
        self.publish();
        for (tx, f) in finals {
            let _ = tx.send(Event::Done(f));
        }
    }

    /// The plan's tokens into the batch: `n` uncached tokens of each planned sequence, then its
    /// drafts.
    fn fill_batch(&mut self, plan: &[(usize, usize)]) {
        self.batch.clear();
        for &(i, n) in plan {
            let s = &self.running[i];
            let id = s.kv_seq.expect("running");
            let last = n == s.uncached();
            // Prompt tokens (also when recomputed after preemption) get prompt arithmetic,
            // generated ones decode arithmetic, whatever the chunking: see `Batch::push_prompt`.
            let n_prompt = s.seq.prompt().len();
            let bs = self.shared.cfg.block_size;
            for k in 0..n {
                let pos = s.n_cached + k;
                let index = s.context_index(pos, bs);
                let logits = last && k + 1 == n;
                if index < n_prompt {
                    let slot = prompt_slot(n_prompt, index);
                    self.batch
                        .push_prompt(s.tokens()[index], pos, id, logits, slot);
                } else {
                    self.batch.push(s.tokens()[index], pos, id, logits);
                }
            }
            // The drafts follow as generated tokens, each with its logits for verification.
            for (k, &draft) in s.drafts.iter().enumerate() {
                self.batch.push(draft, s.n_cached + n + k, id, true);
            }
        }
    }

    fn fail(&mut self, s: &mut Seq, msg: &str) {
        self.release(s);
        self.shared.counters.failed.fetch_add(1, Ordering::Relaxed);
        let _ = s.tx.send(Event::Error(msg.to_string()));
    }

    fn fail_all(&mut self, msg: &str) {
        let mut all: Vec<Seq> = self.running.drain(..).collect();
        all.extend(self.waiting.drain(..));
        let incoming: Vec<Pending> = self
            .shared
            .inbox
            .lock()
            .map(|mut i| i.incoming.drain(..).collect())
            .unwrap_or_default();
        for p in incoming {
            let _ = p.tx.send(Event::Error(msg.to_string()));
        }
        for mut s in all {
            self.fail(&mut s, msg);
        }
    }

    fn publish(&mut self) {
        if self.kv.has_events() {
            let events = self.kv.take_events();
            if let Some(tx) = &self.shared.kv_events {
                let _ = tx.send(events);
            }
            if let Ok(mut h) = self.shared.kv_cached_hashes.lock() {
                *h = self.kv.cached_hashes();
            }
        }
        let c = &self.shared.counters;
        c.running.store(self.running.len(), Ordering::Relaxed);
        c.waiting.store(self.waiting.len(), Ordering::Relaxed);
        c.kv_used.store(self.kv.used_blocks(), Ordering::Relaxed);
        c.kv_free.store(self.kv.free_blocks(), Ordering::Relaxed);
        c.kv_cached
            .store(self.kv.cached_blocks(), Ordering::Relaxed);
        if let Some(d) = &self.draft {
            c.draft_kv_used.store(d.kv.used_blocks(), Ordering::Relaxed);
            c.draft_kv_total
                .store(d.kv.config().n_blocks, Ordering::Relaxed);
        }
    }
}

/// How a sequence's rows of a step ended.
enum RowsEnd {
    /// It goes on.
    Open,
    /// Its sampler failed (the error sent).
    Failed,
    /// It finished: the event to send once the engine is without it.
    Finished(Finished),
}

/// Samples a sequence's rows of logits (`n_vocab` each: the pending token's, then one per
/// draft) in order until a sampled token is not the draft (speculation's verification;
/// without drafts, decoding) or the sequence ends. Returns the drafts accepted.
fn sample_rows(
    s: &mut Seq,
    logits: &[f32],
    drafts: &[TokenId],
    c: &Counters,
    buf: &mut Vec<f32>,
) -> (usize, RowsEnd) {
    let n_vocab = logits.len() / (1 + drafts.len());
    let mut accepted = 0;
    for (k, row) in logits.chunks_exact(n_vocab).enumerate() {
        buf.clear();
        buf.extend_from_slice(row);
        let out = match s.seq.step(buf) {
            Ok(out) => out,
            Err(e) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
                let _ = s.tx.send(Event::Error(format!("sampling failed: {e}")));
                return (accepted, RowsEnd::Failed);
            }
        };
        let right = k < drafts.len() && out.token == drafts[k];
        c.generation_tokens.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = deliver(s, out) {
            c.finished.fetch_add(1, Ordering::Relaxed);
            return (accepted, RowsEnd::Finished(f));
        }
        if !right {
            break;
        }
        accepted += 1;
    }
    (accepted, RowsEnd::Open)
}

/// Sends a sampled token's event; returns the end of the request when the token ended it.
fn deliver(s: &mut Seq, out: SequenceStep) -> Option<Finished> {
    // An EOS token is not output: its text (held text released) comes with `Done`. The
    // sequence has fed every other token into its context.
    let end_text = if out.is_eos {
        out.text
    } else {
        let (logprob, top_logprobs) = match out.logprob {
            Some(lp) => (
                Some(lp.logprob),
                lp.top_logprobs
                    .iter()
                    .map(|t| (t.token, t.logprob))
                    .collect(),
            ),
            None => (None, Vec::new()),
        };
        let _ = s.tx.send(Event::Token(TokenEvent {
            token: out.token,
            text: out.text,
            logprob,
            top_logprobs,
            explain: out.explain,
        }));
        String::new()
    };
    let reason = out.finish?;
    Some(Finished {
        text: end_text,
        finish_reason: reason,
        prompt_tokens: s.seq.prompt().len(),
        // Sampled tokens: the generated ones and an ending EOS.
        completion_tokens: s.seq.tokens().len() + usize::from(out.is_eos),
        preemptions: s.preemptions,
        cached_tokens: s.cached_tokens,
        dropped_tokens: s.dropped_tokens,
        speculation: s.spec,
    })
}
