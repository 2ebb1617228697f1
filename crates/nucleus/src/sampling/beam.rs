//! Beam search, generic over the model through [`BeamModel`].
//!
//! The search never re-runs the prompt: the caller evaluates the prompt once into a root beam
//! and passes its next-token logits. Each step, every live beam proposes its best next tokens,
//! the `width` best extensions overall survive, and a beam with several surviving children is
//! [`BeamModel::fork`]ed (for a paged KV cache: copy the block table, share the blocks
//! copy-on-write). All surviving beams then advance together in one [`BeamModel::step`] call —
//! one batched forward.
//!
//! Scores: a hypothesis of `len` generated tokens (EOS included) with summed logprob `s` scores
//! `s / len^alpha` (`alpha` = `length_penalty`; `0` = raw sum, `> 0` favours longer output).
//!
//! Stopping: a hypothesis ends on an EOS token or at `max_new_tokens`. The search stops when no
//! beam is live, or when `width` finished hypotheses all score at least the best any live beam
//! could still reach. That bound is exact, not a heuristic: logprobs are ≤ 0, so a live beam's
//! sum can only fall; with `alpha > 0` its best case is the longest length (`max_new_tokens`),
//! with `alpha ≤ 0` the shortest (one more token).

use super::candidates::Candidates;
use super::logprobs::{log_sum_exp, top_logprobs};
use super::stop::FinishReason;
use super::{SamplingError, TokenId};

/// A model-side handle of one beam's state (its KV-cache sequence).
pub type BeamId = u32;

/// What beam search needs from a model.
pub trait BeamModel {
    type Error;

    /// A new beam whose state is a copy of `parent`'s (same tokens so far). Cheap for a paged
    /// KV cache: copy the block table and share blocks copy-on-write.
    fn fork(&mut self, parent: BeamId) -> Result<BeamId, Self::Error>;

    /// Release a beam's state.
    fn drop_beam(&mut self, id: BeamId);

    /// Append one token to each listed beam, evaluating them all as one batch, and return each
    /// beam's next-token logits, in the order given.
    fn step(&mut self, beams: &[(BeamId, TokenId)]) -> Result<Vec<Vec<f32>>, Self::Error>;
}

/// Beam search settings.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamParams {
    /// Number of beams `B` (≥ 1).
    pub width: usize,
    /// `alpha` in `score = sum_logprob / len^alpha`.
    pub length_penalty: f32,
    /// Generated tokens per hypothesis at most (≥ 1).
    pub max_new_tokens: usize,
    /// Tokens that end a hypothesis.
    pub eos: Vec<TokenId>,
    /// How many hypotheses to return (≤ `width`).
    pub n_best: usize,
}

impl Default for BeamParams {
    fn default() -> Self {
        BeamParams {
            width: 4,
            length_penalty: 1.0,
            max_new_tokens: 128,
            eos: Vec::new(),
            n_best: 1,
        }
    }
}

/// One finished hypothesis.
#[derive(Clone, Debug, PartialEq)]
pub struct Hypothesis {
    /// Generated tokens, ending with the EOS token when `finish` is `Stop`.
    pub tokens: Vec<TokenId>,
    /// Sum of the tokens' logprobs (raw model distribution).
    pub sum_logprob: f32,
    /// `sum_logprob / tokens.len()^length_penalty`.
    pub score: f32,
    pub finish: FinishReason,
}

/// Beam search failure: the model's error, or bad logits / parameters.
#[derive(Debug, thiserror::Error)]
pub enum BeamError<E> {
    #[error("model error: {0}")]
    Model(E),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
}

struct Live {
    id: BeamId,
    tokens: Vec<TokenId>,
    sum: f64,
}

fn score(sum: f64, len: usize, alpha: f32) -> f64 {
    sum / (len as f64).powf(alpha as f64)
}

/// Keep the best `cap` hypotheses, sorted by descending score (kept in f64 for the stop test).
fn add_finished(done: &mut Vec<(f64, Hypothesis)>, sc: f64, h: Hypothesis, cap: usize) {
    let at = done.partition_point(|x| x.0 >= sc);
    if at < cap {
        done.insert(at, (sc, h));
        done.truncate(cap);
    }
}

/// Ends a beam: `parent` extended by `tok`, with total logprob `sum`, scored and filed among
/// the finished hypotheses.
fn finish_beam(
    done: &mut Vec<(f64, Hypothesis)>,
    parent: &[TokenId],
    tok: TokenId,
    sum: f64,
    alpha: f32,
    finish: FinishReason,
    cap: usize,
) {
    let mut tokens = parent.to_vec();
    tokens.push(tok);
    let sc = score(sum, tokens.len(), alpha);
    let h = Hypothesis {
        tokens,
        sum_logprob: sum as f32,
        score: sc as f32,
        finish,
    };
    add_finished(done, sc, h, cap);
}

/// Run beam search from `root`, a beam whose prompt the model has already evaluated, given the
/// root's next-token logits. Takes ownership of `root`: every beam (root and forks) is dropped
/// before returning `Ok`. Returns up to `n_best` hypotheses, best first.
pub fn beam_search<M: BeamModel>(
    model: &mut M,
    root: BeamId,
    root_logits: &[f32],
    params: &BeamParams,
) -> Result<Vec<Hypothesis>, BeamError<M::Error>> {
    let width = params.width;
    if width == 0 || params.max_new_tokens == 0 || params.n_best == 0 {
        model.drop_beam(root);
        return Err(SamplingError::InvalidParam {
            name: "beam",
            reason: "width, max_new_tokens and n_best must be >= 1".into(),
        }
        .into());
    }
    let mut done: Vec<(f64, Hypothesis)> = Vec::new();
    let mut live = vec![Live {
        id: root,
        tokens: Vec::new(),
        sum: 0.0,
    }];
    let mut logits: Vec<Vec<f32>> = vec![root_logits.to_vec()];
    let mut buf = Candidates::default();
    loop {
        let props = match proposals(&live, &logits, params, &mut buf) {
            Ok(p) => p,
            Err(e) => {
                drop_all(model, &live);
                return Err(e.into());
            }
        };
        let next = survivors(&props, &live, params, &mut done);
        if next.is_empty() {
            drop_all(model, &live);
            break;
        }
        live = extend(model, live, &next)?;
        // Each beam with the token it just took (its last).
        let batch: Vec<_> = live
            .iter()
            .map(|b| (b.id, b.tokens[b.tokens.len() - 1]))
            .collect();
        logits = match model.step(&batch) {
            Ok(l) if l.len() == batch.len() => l,
            Ok(l) => {
                drop_all(model, &live);
                return Err(SamplingError::InvalidParam {
                    name: "step",
                    reason: format!(
                        "model returned {} logits for {} beams",
                        l.len(),
                        batch.len()
                    ),
                }
                .into());
            }
            Err(e) => {
                drop_all(model, &live);
                return Err(BeamError::Model(e));
            }
        };
    }
    done.truncate(params.n_best);
    Ok(done.into_iter().map(|(_, h)| h).collect())
}

fn drop_all<M: BeamModel>(model: &mut M, live: &[Live]) {
    live.iter().for_each(|b| model.drop_beam(b.id));
}

/// Every live beam's proposals, best first: (new sum, beam index, token). B + |eos| per beam
/// is enough: the B best non-EOS extensions overall, and every EOS ranked in the top B
/// overall, are within their own beam's top B + |eos|.
fn proposals(
    live: &[Live],
    logits: &[Vec<f32>],
    params: &BeamParams,
    buf: &mut Candidates,
) -> Result<Vec<(f64, usize, TokenId)>, SamplingError> {
    let per_beam = params.width + params.eos.len();
    let mut props = Vec::with_capacity(live.len() * per_beam);
    for (bi, (b, l)) in live.iter().zip(logits).enumerate() {
        super::check_logits(l)?;
        let lse = log_sum_exp(l);
        for (tok, _) in top_logprobs(l, per_beam, lse, buf) {
            let lp = l[tok as usize] as f64 - lse; // f64: sums over long outputs
            props.push((b.sum + lp, bi, tok));
        }
    }
    props.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    Ok(props)
}

/// The B best non-EOS proposals that go on, as (beam index, token, sum); the EOS among the B
/// best, and every survivor once out of length, finish into `done`. None go on once B finished
/// hypotheses are better than any survivor could become.
fn survivors(
    props: &[(f64, usize, TokenId)],
    live: &[Live],
    params: &BeamParams,
    done: &mut Vec<(f64, Hypothesis)>,
) -> Vec<(usize, TokenId, f64)> {
    let (width, alpha, max_len) = (params.width, params.length_penalty, params.max_new_tokens);
    let new_len = live[0].tokens.len() + 1;
    let mut next = Vec::with_capacity(width);
    for (rank, &(sum, bi, tok)) in props.iter().enumerate() {
        if params.eos.contains(&tok) {
            // Only EOS among the B best count, as in the usual formulation: a worse one
            // would have lost its place to a live beam anyway.
            if rank < width {
                let parent = &live[bi].tokens;
                finish_beam(done, parent, tok, sum, alpha, FinishReason::Stop, width);
            }
            continue;
        }
        next.push((bi, tok, sum));
        if next.len() == width {
            break;
        }
    }
    // Out of length: the survivors end here, without another forward.
    if new_len >= max_len {
        for &(bi, tok, sum) in &next {
            let parent = &live[bi].tokens;
            finish_beam(done, parent, tok, sum, alpha, FinishReason::Length, width);
        }
        next.clear();
    }
    // Early stop: B finished hypotheses that no survivor can beat.
    let bound = |sum: f64, len: usize| {
        if alpha > 0.0 {
            score(sum, max_len, alpha)
        } else {
            score(sum, len + 1, alpha)
        }
    };
    if done.len() >= width {
        let worst = done[width - 1].0;
        if next.iter().all(|&(_, _, sum)| bound(sum, new_len) <= worst) {
            next.clear();
        }
    }
    next
}

/// The next live beams, each with its new token: a parent's first child takes over its
/// id, further children fork it (before any step, so they copy the parent's state), childless
/// parents are dropped. On a failed fork, every beam held is dropped.
fn extend<M: BeamModel>(
    model: &mut M,
    live: Vec<Live>,
    next: &[(usize, TokenId, f64)],
) -> Result<Vec<Live>, BeamError<M::Error>> {
    let mut used = vec![false; live.len()];
    let mut new_live: Vec<Live> = Vec::with_capacity(next.len());
    for &(bi, tok, sum) in next {
        let id = if used[bi] {
            match model.fork(live[bi].id) {
                Ok(id) => id,
                Err(e) => {
                    // Drop the forks made so far, then every beam we still hold.
                    for b in &new_live {
                        if !live.iter().any(|l| l.id == b.id) {
                            model.drop_beam(b.id);
                        }
                    }
                    drop_all(model, &live);
                    return Err(BeamError::Model(e));
                }
            }
        } else {
            used[bi] = true;
            live[bi].id
        };
        let mut tokens = live[bi].tokens.clone();
        tokens.push(tok);
        new_live.push(Live { id, tokens, sum });
    }
    for (b, &u) in live.iter().zip(&used) {
        if !u {
            model.drop_beam(b.id);
        }
    }
    Ok(new_live)
}

#[cfg(test)]
#[path = "beam_tests.rs"]
mod tests;
