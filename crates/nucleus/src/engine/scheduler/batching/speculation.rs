//! Speculation in the scheduler: proposals for the decoding sequences of a step (by prompt
//! lookup, or by the draft model: [`super::draft`]), and the bookkeeping after their
//! verification (see the [engine module](super::super)).

use std::sync::atomic::Ordering;

use super::{Counters, Scheduler, Seq};
use crate::kv_cache::{KvCache, KvError};

impl Scheduler<'_> {
    /// Gives each decoding sequence of `plan` (entries `(i, 1)`) its drafts for this step, as
    /// many as its [`DraftLength`](crate::engine::speculate::DraftLength) asks and `left`
    /// (the step's token budget) allows, within its window and its `max_tokens`.
    pub(super) fn propose_drafts(&mut self, plan: &[(usize, usize)], left: &mut usize) {
        let decoding = plan.len();
        let row_cost = self.step_cost.row_cost(decoding, decoding);
        // Prompt lookup costs nothing beside a forward; a draft model, its passes.
        let propose_cost = self
            .draft
            .as_ref()
            .map_or(0.0, |d| d.token_cost(decoding, &self.step_cost));
        let bs = self.shared.cfg.block_size;
        let n_ctx = self.shared.cfg.n_ctx;
        // With a draft model: the sequences that want proposals, and how many.
        let mut wants = Vec::new();
        for &(i, _) in plan {
            if *left == 0 {
                break;
            }
            let s = &mut self.running[i];
            let Some(length) = s.draft_len.as_mut() else {
                continue;
            };
            length.set_costs(row_cost, propose_cost);
            let pays = length.pays();
            let want = length.next_len();
            // The pending token and the drafts: within max_tokens (the pending token's sample
            // is one of them), and within the window.
            let room = if s.streams {
                (n_ctx / bs * bs).saturating_sub(s.n_cached + 1)
            } else {
                n_ctx.saturating_sub(s.tokens().len())
            };
            let k = want
                .min(s.seq.tokens_left().saturating_sub(1))
                .min(room)
                .min(*left);
            if k == 0 {
                continue;
            }
            if self.draft.is_some() {
                // The draft's cache follows the context's positions: not once a streamed
                // window has slid, nor past the window's end. A draft starts on a sequence
                // (catching up on its prompt) only when it is expected to pay.
                let starts = s.draft.kv_seq.is_some() || pays;
                if starts && s.n_evicted == 0 && s.tokens().len() + k <= n_ctx {
                    wants.push((i, k));
                    *left -= k;
                }
                continue;
            }
            let mut drafts = self.ngram.lookup(s.tokens(), k);
            // Proposals the grammar forbids would be rejected: do not compute them.
            let valid = s.seq.grammar_valid_prefix(&drafts);
            drafts.truncate(valid);
            s.drafts = drafts;
            *left -= s.drafts.len();
        }
        if let Some(d) = self.draft.as_mut() {
            d.propose(&mut self.running, &wants);
            for &(i, k) in &wants {
                let s = &mut self.running[i];
                let valid = s.seq.grammar_valid_prefix(&s.drafts);
                s.drafts.truncate(valid);
                *left += k - s.drafts.len();
            }
        }
    }
}

/// After the rows of `s`'s pending token and `proposed` drafts were sampled, `accepted` of
/// the drafts being right: keeps the pending token and the accepted drafts in the cache and
/// rolls the rest back (their blocks return to the pool), and counts.
pub(super) fn verified(
    kv: &mut KvCache,
    counters: &Counters,
    s: &mut Seq,
    proposed: usize,
    accepted: usize,
) -> Result<(), KvError> {
    s.n_cached += accepted;
    s.draft.verified(accepted);
    if let Some(id) = s.kv_seq {
        // The cache holds the pending token and every draft: cut it back to the accepted.
        kv.truncate(id, s.n_cached)?;
    }
    if let Some(length) = s.draft_len.as_mut() {
        length.record(proposed, accepted);
    }
    s.spec.drafts += 1;
    s.spec.proposed += proposed;
    s.spec.accepted += accepted;
    counters.spec_drafts.fetch_add(1, Ordering::Relaxed);
    counters
        .spec_proposed
        .fetch_add(proposed as u64, Ordering::Relaxed);
    counters
        .spec_accepted
        .fetch_add(accepted as u64, Ordering::Relaxed);
    Ok(())
}
