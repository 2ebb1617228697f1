//! The draft model in the scheduler: the speculating sequences of a step get their proposals
//! from a smaller model, which keeps a KV cache per sequence in its own paged pool.
//!
//! The draft steps of all of them are batched: one forward of the draft takes each sequence's
//! catch-up (what the model accepted since the draft last ran: the pending token, the bonus or
//! corrected one, an unfed last proposal, or a whole prompt, in chunks of a step's budget) and
//! gives each its first proposal; then one forward per further position takes each sequence's
//! latest proposal. Proposals are the draft's greedy tokens, a point mass, which the
//! scheduler verifies as prompt lookup's (see [`crate::engine::speculate`]): the output is the
//! model's whatever the draft proposes.
//!
//! After verification the draft's cache is cut back to what the model accepted: a sequence's
//! [`DraftState`] counts the leading context tokens its draft cache holds (`valid`), and the
//! proposals fed after them (`ahead`), of which the accepted ones become valid; the rest are
//! truncated before the next catch-up.
//!
//! What a proposal costs is timed over all of a step's draft work, catch-ups included: a
//! sequence whose speculation paused has a longer catch-up when it resumes, and a draft pass
//! for one sequence's longer draft holds up the whole step. Only a catch-up on a prompt (once
//! per admission) is left out.

use std::time::Instant;

use super::{prompt_slot, Seq};
use crate::engine::session::argmax;
use crate::engine::speculate::StepCost;
use crate::kv_cache::{KvCache, SeqId};
use crate::model::{Batch, ForwardState, Model};
use crate::tokenizer::TokenId;

/// What a sequence's draft cache holds.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::engine::scheduler) struct DraftState {
    pub kv_seq: Option<SeqId>,
    /// Leading tokens of the sequence's context that the draft cache holds.
    pub valid: usize,
    /// Proposals fed into the draft cache after those, waiting for verification (the last
    /// proposal of a step is never fed).
    pub ahead: usize,
}

impl DraftState {
    /// After verification: `accepted` proposals joined the context.
    pub fn verified(&mut self, accepted: usize) {
        self.valid += accepted.min(self.ahead);
        self.ahead = 0;
    }
}

pub(in crate::engine::scheduler) struct DraftRunner<'a> {
    model: &'a Model,
    pub kv: KvCache,
    state: ForwardState,
    batch: Batch,
    /// Seconds of draft work per proposal (a running average).
    secs_per_proposal: Option<f64>,
    /// A pass's cost in model steps: given, or until timed, the weights' ratio.
    pass_cost: Option<f64>,
    prior_cost: f64,
    /// Catch-up tokens per step at most.
    budget: usize,
}

/// Weight of the newest step in the running cost of a proposal.
const COST_EMA: f64 = 0.25;

/// One sequence's part of a step's draft passes.
struct Job {
    /// Index among the running sequences.
    i: usize,
    id: SeqId,
    /// Proposals wanted.
    k: usize,
    /// Context tokens `from..to` to catch up on in the first pass.
    from: usize,
    to: usize,
    /// The catch-up ends at the context's end: the last row gives the first proposal.
    proposes: bool,
    drafts: Vec<TokenId>,
}

impl<'a> DraftRunner<'a> {
    pub fn new(
        model: &'a Model,
        kv: KvCache,
        pass_cost: Option<f64>,
        prior_cost: f64,
        budget: usize,
    ) -> DraftRunner<'a> {
        DraftRunner {
            model,
            kv,
            state: ForwardState::new(),
            batch: Batch::new(),
            secs_per_proposal: None,
            pass_cost,
            prior_cost,
            budget: budget.max(1),
        }
    }

    /// What proposing one token costs a sequence, in its share of a step of the model among
    /// `decoding` sequences (t / decoding for a step of t seconds): the draft's seconds per
    /// proposal over that share. (When every sequence proposes k tokens a step, that is a
    /// draft pass over a model step.)
    pub fn token_cost(&self, decoding: usize, model_steps: &StepCost) -> f64 {
        if let Some(c) = self.pass_cost {
            return c;
        }
        match (self.secs_per_proposal, model_steps.predict(decoding)) {
            (Some(p), Some(t)) if t > 0.0 => (p * decoding as f64 / t).clamp(0.0, 4.0),
            _ => self.prior_cost,
        }
    }

    /// Frees a sequence's draft cache.
    pub fn release(&mut self, d: &mut DraftState) {
        if let Some(id) = d.kv_seq.take() {
            let _ = self.kv.free_seq(id);
        }
        *d = DraftState::default();
    }

    /// Sets the drafts of the sequences of `wants` ((running index, proposals wanted)): at
    /// most that many each, fewer or none when the step's catch-up budget or the draft's pool
    /// runs short (the model decodes without them).
    pub(super) fn propose(&mut self, running: &mut [Seq], wants: &[(usize, usize)]) {
        let started = Instant::now();
        let mut jobs = self.plan(running, wants);
        if jobs.is_empty() {
            return;
        }
        let prompts = jobs
            .iter()
            .any(|j| j.from < running[j.i].seq.prompt().len());
        if self.run_passes(running, &mut jobs).is_err() {
            // (Not expected: the plan fits the pool.) The model goes on without drafts; the
            // draft caches start afresh.
            for j in &jobs {
                self.release(&mut running[j.i].draft);
            }
            return;
        }
        let proposed: usize = jobs.iter().map(|j| j.drafts.len()).sum();
        if !prompts && proposed > 0 {
            let secs = started.elapsed().as_secs_f64() / proposed as f64;
            self.secs_per_proposal = Some(match self.secs_per_proposal {
                Some(p) => (1.0 - COST_EMA) * p + COST_EMA * secs,
                None => secs,
            });
        }
        for j in jobs {
            let s = &mut running[j.i];
            s.draft.valid = j.to;
            s.draft.ahead = j.drafts.len().saturating_sub(1);
            s.drafts = j.drafts;
        }
    }

    /// Each wanting sequence's catch-up, within the budget and the free blocks.
    fn plan(&mut self, running: &mut [Seq], wants: &[(usize, usize)]) -> Vec<Job> {
        let mut budget = self.budget;
        let mut free = self.kv.free_blocks();
        let mut jobs = Vec::new();
        for &(i, k) in wants {
            if budget == 0 {
                break;
            }
            let to = running[i].tokens().len();
            let d = &mut running[i].draft;
            let id = match d.kv_seq {
                Some(id) => id,
                None => {
                    *d = DraftState::default();
                    let id = self.kv.new_seq();
                    d.kv_seq = Some(id);
                    id
                }
            };
            // Drop the proposals that were not accepted (or not verified), and keep the
            // context's last token out: its row gives the first proposal.
            d.ahead = 0;
            d.valid = d.valid.min(to - 1);
            let have = self.kv.seq_len(id).unwrap_or(0);
            if have != d.valid && self.kv.truncate(id, d.valid.min(have)).is_err() {
                self.release(d);
                continue;
            }
            d.valid = d.valid.min(have);
            let from = d.valid;
            let feed = (to - from).min(budget);
            let proposes = from + feed == to;
            let grow = feed + if proposes { k - 1 } else { 0 };
            let need = self.kv.blocks_needed(id, grow).unwrap_or(usize::MAX);
            if need > free {
                continue;
            }
            free -= need;
            budget -= feed;
            jobs.push(Job {
                i,
                id,
                k,
                from,
                to: from + feed,
                proposes,
                drafts: Vec::new(),
            });
        }
        jobs
    }

    /// The catch-up pass, then one pass per further proposal.
    fn run_passes(&mut self, running: &[Seq], jobs: &mut [Job]) -> Result<(), ()> {
        self.batch.clear();
        for j in jobs.iter() {
            let s = &running[j.i];
            let n_prompt = s.seq.prompt().len();
            for index in j.from..j.to {
                let logits = j.proposes && index + 1 == j.to;
                let token = s.tokens()[index];
                if index < n_prompt {
                    let slot = prompt_slot(n_prompt, index);
                    self.batch.push_prompt(token, index, j.id, logits, slot);
                } else {
                    self.batch.push(token, index, j.id, logits);
                }
            }
        }
        self.forward()?;
        for (row, j) in jobs.iter_mut().filter(|j| j.proposes).enumerate() {
            j.drafts.push(self.argmax_row(row));
        }
        let longest = jobs.iter().map(|j| j.k).max().unwrap_or(0);
        for pass in 1..longest {
            self.batch.clear();
            for j in jobs.iter().filter(|j| j.proposes && j.k > pass) {
                // Its previous proposal, after the context and the ones before.
                self.batch
                    .push(j.drafts[pass - 1], j.to + pass - 1, j.id, true);
            }
            self.forward()?;
            let going = jobs.iter_mut().filter(|j| j.proposes && j.k > pass);
            for (row, j) in going.enumerate() {
                j.drafts.push(self.argmax_row(row));
            }
        }
        Ok(())
    }

    fn forward(&mut self) -> Result<(), ()> {
        self.model
            .forward(&self.batch, &mut self.kv, &mut self.state)
            .map_err(|_| ())
    }

    fn argmax_row(&self, row: usize) -> TokenId {
        let n_vocab = self.model.hp.n_vocab;
        argmax(&self.state.logits()[row * n_vocab..(row + 1) * n_vocab])
    }
}
