//! Beam search on the real model: [`BeamModel`] over the sequences of one paged [`KvCache`].
//!
//! Each beam is a KV-cache sequence. The prompt is evaluated once into a root sequence; forking
//! a beam copies only its block table ([`KvCache::fork_seq`]), so every beam shares the
//! prompt's blocks and only a shared partial last block is copied when a beam first writes to
//! it. A step appends one token to every live beam in ONE batched [`Model::forward`], so the
//! weights are read once per step whatever the width.

use super::sequence::{GenerateRequest, Sequence};
use super::session::{EngineError, Session};
use crate::kv_cache::{KvCache, SeqId};
use crate::model::{Batch, ForwardState, Model, ModelError};
use crate::sampling::{
    beam_search, BeamId, BeamModel, BeamParams, FinishReason, Hypothesis, TokenId,
};
use crate::tokenizer::Tokenizer;

/// The beams of a search, as sequences of `kv`.
pub struct KvBeams<'a> {
    model: &'a Model,
    kv: &'a mut KvCache,
    state: &'a mut ForwardState,
    batch: Batch,
    peak_used_blocks: usize,
    steps: usize,
}

impl<'a> KvBeams<'a> {
    /// Beams over `kv`; the root beam is a sequence of `kv` whose prompt has been evaluated
    /// (fork the caller's sequence with [`KvCache::fork_seq`] to keep it).
    pub fn new(model: &'a Model, kv: &'a mut KvCache, state: &'a mut ForwardState) -> Self {
        let peak_used_blocks = kv.used_blocks();
        KvBeams {
            model,
            kv,
            state,
            batch: Batch::new(),
            peak_used_blocks,
            steps: 0,
        }
    }

    /// The most KV blocks in use at once during the search (after each step's forward).
    pub fn peak_used_blocks(&self) -> usize {
        self.peak_used_blocks
    }

    /// Batched forwards run so far.
    pub fn steps(&self) -> usize {
        self.steps
    }
}

impl BeamModel for KvBeams<'_> {
    type Error = ModelError;

    fn fork(&mut self, parent: BeamId) -> Result<BeamId, ModelError> {
        Ok(self.kv.fork_seq(parent as SeqId)? as BeamId)
    }

    fn drop_beam(&mut self, id: BeamId) {
        let _ = self.kv.free_seq(id as SeqId);
    }

    fn step(&mut self, beams: &[(BeamId, TokenId)]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.batch.clear();
        for &(id, tok) in beams {
            let seq = id as SeqId;
            self.batch.push(tok, self.kv.seq_len(seq)?, seq, true);
        }
        self.model.forward(&self.batch, self.kv, self.state)?;
        self.steps += 1;
        self.peak_used_blocks = self.peak_used_blocks.max(self.kv.used_blocks());
        let n_vocab = self.model.hp.n_vocab;
        Ok(self
            .state
            .logits()
            .chunks(n_vocab)
            .map(<[f32]>::to_vec)
            .collect())
    }
}

/// One hypothesis of [`Session::beam_choices`], as a caller shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamChoice {
    /// Generated tokens, as in [`Generation::tokens`](super::Generation::tokens): an ending
    /// end-of-generation token excluded, cut after the token that completed a stop string.
    pub tokens: Vec<TokenId>,
    /// The output text (a stop string and what follows it cut off).
    pub text: String,
    pub finish_reason: FinishReason,
    /// The hypothesis's summed logprob (raw model distribution, an ending EOS included).
    pub sum_logprob: f32,
    /// `sum_logprob / len^length_penalty`, which ranks the hypotheses.
    pub score: f32,
}

impl Session<'_> {
    /// Beam search of `req.beams` beams from the session's sequence (its prompt fed, `logits`
    /// the next-token logits); the `n_best` best hypotheses, best first. The session's own
    /// sequence is left as it was (the root beam is a fork of it).
    pub fn beam_hypotheses(
        &mut self,
        tokenizer: &Tokenizer,
        logits: &[f32],
        req: &GenerateRequest,
        n_best: usize,
    ) -> Result<Vec<Hypothesis>, EngineError> {
        let params = BeamParams {
            width: req.beams,
            length_penalty: req.length_penalty,
            max_new_tokens: req.max_tokens,
            eos: if req.ignore_eos {
                Vec::new()
            } else {
                tokenizer.eog_tokens().to_vec()
            },
            n_best,
        };
        // The root shares every prompt block with the session's own sequence, which stays.
        let root = self.kv.fork_seq(self.seq).map_err(ModelError::from)?;
        let mut beams = KvBeams::new(self.model, &mut self.kv, &mut self.state);
        Ok(beam_search(&mut beams, root as BeamId, logits, &params)?)
    }

    /// Beam search of `req.beams` beams continuing `prompt` (appended to what the session
    /// holds): the `n_best` best hypotheses (`1 ≤ n_best ≤ req.beams`), best first, each
    /// replayed through a [`Sequence`] of its own, so that stop strings cut its text (they do
    /// not steer the search). `req.max_tokens` is capped by the context window. Make the
    /// session with room for the beams ([`Session::kv_tokens_for_beams`]). Afterwards the
    /// session holds the prompt; the hypotheses are not in it.
    pub fn beam_choices(
        &mut self,
        tokenizer: &Tokenizer,
        prompt: &[TokenId],
        req: &GenerateRequest,
        n_best: usize,
    ) -> Result<Vec<BeamChoice>, EngineError> {
        req.validate()?;
        if n_best == 0 || n_best > req.beams {
            return Err(EngineError::Request(format!(
                "{n_best} hypotheses asked of {} beams: ask for 1 to {0}",
                req.beams
            )));
        }
        if req.max_tokens == 0 {
            return Err(EngineError::Request("max_tokens must be >= 1".into()));
        }
        if prompt.is_empty() {
            return Err(EngineError::Request("the prompt is empty".into()));
        }
        if self.streams() {
            return Err(EngineError::Request(
                "beam search cannot stream past the context window".into(),
            ));
        }
        if self.len() + prompt.len() > self.n_ctx() {
            return Err(EngineError::Request(format!(
                "the prompt is {} tokens but the context window holds {} ({} used)",
                prompt.len(),
                self.n_ctx(),
                self.len()
            )));
        }
        let mut req = req.clone();
        // The last token is never fed, hence the + 1.
        req.max_tokens = req
            .max_tokens
            .min(self.n_ctx() - self.len() - prompt.len() + 1);
        let logits = self.feed(prompt, req.prefill_chunk, false)?;
        let hypotheses = self.beam_hypotheses(tokenizer, &logits, &req, n_best)?;
        let mut out = Vec::with_capacity(hypotheses.len());
        for h in hypotheses {
            let mut seq = Sequence::new(tokenizer, self.tokens(), &req)?;
            for &t in &h.tokens {
                if seq.accept_token(t).finish.is_some() {
                    break;
                }
            }
            seq.abort(h.finish); // no-op when the replay finished it
            out.push(BeamChoice {
                tokens: seq.tokens().to_vec(),
                text: seq.text().to_string(),
                finish_reason: seq.finish_reason().unwrap_or(h.finish),
                sum_logprob: h.sum_logprob,
                score: h.score,
            });
        }
        Ok(out)
    }
}
