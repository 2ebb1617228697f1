//! Speculative decoding: cheap proposals of the next few tokens, checked in one forward pass
//! of the model (Leviathan et al. 2023; Chen et al. 2023).
//!
//! A [`Proposer`] guesses up to `k` tokens after the sequence so far: [`ngram`] looks the
//! sequence's last n-gram up earlier in it (prompt lookup), [`draft`] runs a smaller model
//! greedily. The model then evaluates the pending token and the `k` drafts in one batch
//! ([`Session::feed_generated`]), which gives the logits after each of them, to the bit those of
//! decoding them one by one.
//!
//! Verification samples each position with the sequence's own sampler chain and random stream,
//! exactly as plain decoding would, and accepts a draft when the sampled token is that draft;
//! the first token that differs, or the token after the last draft, is the step's own. Both
//! proposers propose a point mass (q = 1 on the draft), for which this is Leviathan et al.'s
//! rule: a draft `x` is accepted with probability p(x) = min(1, p(x)/q(x)), and on rejection
//! the token is drawn from p without `x`, renormalized: the normalized max(0, p − q). So the
//! output is distributed exactly as without speculation; more than that, with the same seed it
//! is the same output, token for token, whatever was proposed (the batch-invariance promise).
//! Rejected drafts are rolled back from the KV cache; stop strings, EOS and `max_tokens` are
//! checked on every accepted token, so nothing is overshot.
//!
//! [`DraftLength`] adapts `k` to the recent acceptance: it grows while drafts are accepted
//! whole, shrinks to what was accepted, and pauses speculation when proposals keep failing, so
//! speculation that does not pay costs little.

pub mod draft;
pub mod ngram;
mod step_cost;

pub use step_cost::StepCost;

use std::time::Instant;

use serde::Serialize;

use super::sequence::{Sequence, SequenceStep};
use super::session::{EngineError, Session};
use crate::model::ModelError;
use crate::sampling::FinishReason;
use crate::tokenizer::TokenId;

/// The most tokens proposed at once (`--draft-max`).
pub const MAX_DRAFT: usize = 64;

/// Guesses the tokens that follow a sequence.
pub trait Proposer {
    /// Up to `max` tokens likely to follow `context` (the whole sequence: prompt and output,
    /// its last token sampled but not yet evaluated). Empty when there is nothing worth
    /// proposing.
    fn propose(&mut self, context: &[TokenId], max: usize) -> Result<Vec<TokenId>, ModelError>;

    /// A new sequence starts, its first `prompt_len` tokens its prompt (a draft model computes
    /// them as the model did: a prompt's rows and generated rows take different attention).
    fn start(&mut self, _prompt_len: usize) {}
}

/// What speculation did for a sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SpecStats {
    /// Verification passes (batches of proposals checked).
    pub drafts: usize,
    /// Tokens proposed.
    pub proposed: usize,
    /// Proposed tokens that became output.
    pub accepted: usize,
}

/// How many tokens to propose next: the number that maximizes the tokens gained per unit of
/// time, from the running acceptance rate of proposals and the measured cost of verifying
/// them.
///
/// With a per-token acceptance rate α, a verification of k drafts yields on average
/// (1 − α^(k+1)) / (1 − α) tokens (Leviathan et al., eq. 1), and costs 1 + (c + d)·k decode
/// steps, where c is what one more row of the batch costs beside a one-token step (measured:
/// the forward is memory-bound for one row and compute-bound for many) and d what proposing a
/// token costs (measured: nothing for prompt lookup, a draft model's step for a draft). When
/// no k gains more than a plain step, speculation pauses for a while (longer each time) and
/// then tries one token.
#[derive(Clone, Debug)]
pub struct DraftLength {
    max: usize,
    /// Running per-token acceptance rate.
    alpha: f64,
    /// Running cost of one more row in a verification, in one-token steps.
    row_cost: f64,
    /// Running cost of proposing one token, in one-token steps.
    propose_cost: f64,
    /// Running time of a one-token step, in seconds (`None`: not measured yet).
    step_secs: Option<f64>,
    /// The costs are set from outside ([`set_costs`](Self::set_costs)), not timed here.
    costs_given: bool,
    /// Steps left without speculation, and the length of the next pause.
    paused: usize,
    next_pause: usize,
}

const FIRST_PAUSE: usize = 8;
const LONGEST_PAUSE: usize = 256;
/// Weight of the newest observation in the running averages.
const EMA: f64 = 0.25;

impl DraftLength {
    pub fn new(max: usize) -> DraftLength {
        DraftLength {
            max: max.max(1),
            alpha: 0.7,
            row_cost: 0.4,
            propose_cost: 0.0,
            step_secs: None,
            costs_given: false,
            paused: 0,
            next_pause: FIRST_PAUSE,
        }
    }

    /// Expected tokens per unit of cost for `k` drafts.
    fn gain(&self, k: usize) -> f64 {
        let a = self.alpha.min(0.999);
        let tokens = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
        tokens / (1.0 + (self.row_cost + self.propose_cost) * k as f64)
    }

    /// The best number of drafts, and its gain.
    fn best(&self) -> (usize, f64) {
        (1..=self.max)
            .map(|k| (k, self.gain(k)))
            .fold((1, 0.0), |b, x| if x.1 > b.1 { x } else { b })
    }

    /// Whether some draft length is expected to gain more than a plain step, from the
    /// acceptance and costs known so far.
    pub fn pays(&self) -> bool {
        self.best().1 > 1.0
    }

    /// Tokens to propose at this step (0 while paused, and for the first step, whose time
    /// measures a plain step; each call counts a step).
    pub fn next_len(&mut self) -> usize {
        if self.step_secs.is_none() && !self.costs_given {
            return 0;
        }
        if self.paused > 0 {
            self.paused -= 1;
            return 0;
        }
        self.best().0
    }

    /// Records a verification: `accepted` of `proposed` drafts were right.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        // Per token: the drafts up to the first wrong one were each accepted, that one not.
        let trials = (accepted + 1).min(proposed) as f64;
        let rate = accepted as f64 / trials;
        self.alpha = (1.0 - EMA) * self.alpha + EMA * rate;
        if self.best().1 <= 1.0 {
            // No length pays: stop for a while, longer each time, then try again.
            self.paused = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(LONGEST_PAUSE);
            self.alpha = self.alpha.max(0.5);
        } else if accepted > 0 {
            self.next_pause = FIRST_PAUSE;
        }
    }

    /// Sets the costs, in the unit of the sequence's share of a step, instead of timing them
    /// (a scheduler that batches many sequences measures them for all: see [`StepCost`]).
    pub fn set_costs(&mut self, row_cost: f64, propose_cost: f64) {
        self.row_cost = row_cost.clamp(0.02, 2.0);
        self.propose_cost = propose_cost.clamp(0.0, 4.0);
        self.costs_given = true;
    }

    /// Records the time of a one-token step.
    pub fn time_step(&mut self, secs: f64) {
        self.step_secs = Some(match self.step_secs {
            Some(s) => (1.0 - EMA) * s + EMA * secs,
            None => secs,
        });
    }

    /// Records the time taken to propose `n` tokens.
    pub fn time_proposal(&mut self, n: usize, secs: f64) {
        if let (Some(one), true) = (self.step_secs, n > 0) {
            let d = (secs / one / n as f64).clamp(0.0, 4.0);
            self.propose_cost = (1.0 - EMA) * self.propose_cost + EMA * d;
        }
    }

    /// Records the time of a verification of `rows` rows (the pending token and the drafts).
    pub fn time_verification(&mut self, rows: usize, secs: f64) {
        if let (Some(one), true) = (self.step_secs, rows > 1) {
            let c = ((secs / one - 1.0) / (rows - 1) as f64).clamp(0.02, 2.0);
            self.row_cost = (1.0 - EMA) * self.row_cost + EMA * c;
        }
    }
}

/// A proposer with its draft length and its statistics.
pub struct Speculator<'p> {
    proposer: Box<dyn Proposer + 'p>,
    length: DraftLength,
    stats: SpecStats,
}

impl<'p> Speculator<'p> {
    /// `max_draft` tokens at most per proposal (1..=[`MAX_DRAFT`]).
    pub fn new(proposer: Box<dyn Proposer + 'p>, max_draft: usize) -> Speculator<'p> {
        Speculator {
            proposer,
            length: DraftLength::new(max_draft.min(MAX_DRAFT)),
            stats: SpecStats::default(),
        }
    }

    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// Starts counting afresh (a new request). What was learned of the acceptance and the
    /// cost of verification carries over; a pause does not.
    pub fn reset(&mut self) {
        self.stats = SpecStats::default();
        self.length.paused = 0;
    }

    /// The sampling loop with speculation: `logits` are the logits after the session's last
    /// token; tokens are chosen through `seq` until it finishes (`max_tokens` new tokens at
    /// most). The session ends holding the output but its last token, as plain decoding
    /// leaves it.
    pub(crate) fn decode(
        &mut self,
        session: &mut Session,
        seq: &mut Sequence,
        mut logits: Vec<f32>,
        max_tokens: usize,
        on_event: &mut impl FnMut(&SequenceStep),
    ) -> Result<(), EngineError> {
        let n_vocab = session.model.hp.n_vocab;
        self.proposer.start(seq.prompt().len());
        let mut step = seq.step(&mut logits)?;
        on_event(&step);
        while step.finish.is_none() {
            if session.interrupted() {
                seq.abort(FinishReason::Length);
                break;
            }
            let pending = step.token;
            // Room for the pending token and the drafts, in the window and in max_tokens.
            let left = max_tokens.saturating_sub(seq.tokens().len());
            let want = self
                .length
                .next_len()
                .min(left.saturating_sub(1))
                .min(session.room().saturating_sub(1));
            let t = Instant::now();
            let mut drafts = match want {
                0 => Vec::new(),
                _ => self.proposer.propose(seq.context(), want)?,
            };
            // (The first proposal of a request may catch up on the whole prompt: not timed.)
            if want > 0 && self.stats.drafts > 0 {
                self.length.time_proposal(want, t.elapsed().as_secs_f64());
            }
            drafts.truncate(want);
            // Proposals the grammar forbids would be rejected: do not compute them.
            let valid = seq.grammar_valid_prefix(&drafts);
            drafts.truncate(valid);
            if drafts.is_empty() {
                let t = Instant::now();
                logits.clear();
                logits.extend_from_slice(&session.feed(&[pending], 1, false)?);
                self.length.time_step(t.elapsed().as_secs_f64());
                step = seq.step(&mut logits)?;
                on_event(&step);
                continue;
            }
            let batch: Vec<TokenId> = std::iter::once(pending)
                .chain(drafts.iter().copied())
                .collect();
            // (The rollback below goes back no further than the length before this forward,
            // so a sliding-window pool still holds what it needs.)
            let t = Instant::now();
            let rows = session.feed_generated(&batch)?.to_vec();
            self.length
                .time_verification(batch.len(), t.elapsed().as_secs_f64());
            // Row i holds the logits after batch[i]: the position drafts[i] proposes for.
            let mut matched = 0;
            loop {
                logits.clear();
                logits.extend_from_slice(&rows[matched * n_vocab..(matched + 1) * n_vocab]);
                step = seq.step(&mut logits)?;
                on_event(&step);
                let right = matched < drafts.len() && step.token == drafts[matched];
                if step.finish.is_some() || !right {
                    // The pending token and the drafts before this one stay in the cache.
                    session.rollback(drafts.len() - matched)?;
                    self.record(drafts.len(), matched + usize::from(right));
                    break;
                }
                matched += 1;
            }
        }
        Ok(())
    }

    fn record(&mut self, proposed: usize, accepted: usize) {
        self.stats.drafts += 1;
        self.stats.proposed += proposed;
        self.stats.accepted += accepted;
        self.length.record(proposed, accepted);
    }
}

#[cfg(test)]
mod stat_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_length_follows_acceptance_and_cost() {
        let mut d = DraftLength::new(16);
        assert_eq!(d.next_len(), 0, "the first step is timed plain");
        // Four of every eight accepted (α → 0.8), cheap rows: drafts of 6 gain the most.
        for _ in 0..40 {
            d.record(8, 4);
        }
        assert!((d.alpha - 0.8).abs() < 0.01, "{}", d.alpha);
        d.time_step(0.020);
        for _ in 0..20 {
            d.time_proposal(8, 0.0);
            d.time_verification(9, 0.020 * (1.0 + 0.1 * 8.0));
        }
        assert!((d.row_cost - 0.1).abs() < 0.01, "{}", d.row_cost);
        let long = d.next_len();
        assert_eq!(long, 6);
        assert!(d.pays());
        // Expensive rows: shorter drafts for the same acceptance.
        for _ in 0..20 {
            d.time_verification(9, 0.020 * (1.0 + 0.6 * 8.0));
        }
        assert_eq!(d.next_len(), 1);
        // So with cheap rows but proposals that cost half a step each.
        for _ in 0..20 {
            d.time_verification(9, 0.020 * (1.0 + 0.1 * 8.0));
            d.time_proposal(8, 0.020 * 0.5 * 8.0);
        }
        assert_eq!(d.next_len(), 1);
        // The gain is what the formula says: k = 2, alpha = 0.5, c = 0.5: 1.75 / 2.
        let f = DraftLength {
            alpha: 0.5,
            row_cost: 0.5,
            ..DraftLength::new(4)
        };
        assert!((f.gain(2) - 0.875).abs() < 1e-12);
        // The prior acceptance (0.7) pays for cheap rows and proposals, not for costly ones.
        let mut g = DraftLength::new(8);
        g.set_costs(0.1, 0.1);
        assert!(g.pays());
        g.set_costs(0.4, 1.0);
        assert!(!g.pays());
        // Nothing accepted, again and again: speculation pauses for 8 steps, then 16.
        let mut misses = 0;
        while d.next_len() > 0 {
            d.record(4, 0);
            misses += 1;
            assert!(misses < 20);
        }
        let paused = 1 + (0..100).take_while(|_| d.next_len() == 0).count();
        assert_eq!(paused, FIRST_PAUSE);
        while d.next_len() > 0 {
            d.record(4, 0);
        }
        let paused = 1 + (0..1000).take_while(|_| d.next_len() == 0).count();
        assert_eq!(paused, 2 * FIRST_PAUSE);
    }
}
