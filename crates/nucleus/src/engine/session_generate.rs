//! Generation on a session: a prompt's continuation sampled token by token (with speculation
//! where a speculator is given) or found by beam search, and its timings.

use std::time::Instant;

use super::super::sequence::{GenerateRequest, Sequence, SequenceStep};
use super::super::speculate::Speculator;
use super::{EngineError, Generation, Session, Timings};
use crate::sampling::FinishReason;
use crate::tokenizer::{TokenId, Tokenizer};

impl Timings {
    fn new(
        prompt_tokens: usize,
        prompt_ms: f64,
        generated_tokens: usize,
        generate_ms: f64,
    ) -> Self {
        Timings {
            prompt_tokens,
            prompt_ms,
            generated_tokens,
            generate_ms,
            prompt_tokens_per_s: prompt_tokens as f64 / (prompt_ms / 1e3),
            generate_tokens_per_s: generated_tokens as f64 / (generate_ms / 1e3),
        }
    }
}

impl Session<'_> {
    /// Generate a continuation of `prompt` (appended to what the session already holds, e.g. a
    /// conversation so far) as `req` says: sampled token by token, or by beam search when
    /// `req.beams > 1`. `on_event` gets every [`SequenceStep`]: while sampling, as each token
    /// is chosen (stream `step.text`); with beam search, the best hypothesis's steps once the
    /// search is over (stop strings then cut the chosen hypothesis; they do not steer the
    /// search).
    ///
    /// The number of new tokens is capped by the context window (finish reason `Length`).
    /// Afterwards the session holds the prompt and the generated tokens, except possibly the
    /// last one, which is never fed: [`tokens`](Self::tokens) says exactly.
    pub fn generate(
        &mut self,
        tokenizer: &Tokenizer,
        prompt: &[TokenId],
        req: &GenerateRequest,
        on_event: impl FnMut(&SequenceStep),
    ) -> Result<Generation, EngineError> {
        self.generate_with(tokenizer, prompt, req, None, on_event)
    }

    /// [`generate`](Self::generate), with speculative decoding when `speculator` is given
    /// (sampling only: the output is the same, token for token; see [`speculate`]).
    pub fn generate_with(
        &mut self,
        tokenizer: &Tokenizer,
        prompt: &[TokenId],
        req: &GenerateRequest,
        mut speculator: Option<&mut Speculator>,
        mut on_event: impl FnMut(&SequenceStep),
    ) -> Result<Generation, EngineError> {
        req.validate()?;
        if speculator.is_some() && req.beams > 1 {
            return Err(EngineError::Request(
                "speculative decoding does not combine with beam search".into(),
            ));
        }
        if prompt.is_empty() {
            return Err(EngineError::Request("the prompt is empty".into()));
        }
        if self.streams() && req.beams > 1 {
            return Err(EngineError::Request(
                "beam search cannot stream past the context window; use the error or truncate \
                 context policy with --beams"
                    .into(),
            ));
        }
        let used = self.len() + prompt.len();
        if used > self.n_ctx && !self.streams() {
            return Err(EngineError::Request(format!(
                "the prompt is {} tokens but the context window holds {} ({} used)",
                prompt.len(),
                self.n_ctx,
                self.len()
            )));
        }
        // The last token is never fed, hence the + 1.
        let mut req = req.clone();
        if !self.streams() {
            req.max_tokens = req.max_tokens.min(self.n_ctx - used + 1);
        }

        let t0 = Instant::now();
        let starts = self.is_empty();
        let mut logits = self.feed(prompt, req.prefill_chunk, false)?;
        let cached_tokens = if starts { self.cached_tokens } else { 0 };
        let prompt_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let mut seq = Sequence::new(tokenizer, &self.tokens, &req)?;
        let mut sum_logprob = None;
        if req.max_tokens == 0 {
            let text = seq.abort(FinishReason::Length);
            debug_assert!(text.is_empty());
        } else if req.beams > 1 {
            sum_logprob =
                Some(self.beam_search(tokenizer, &logits, &req, &mut seq, &mut on_event)?);
        } else if let Some(spec) = speculator.as_deref_mut() {
            spec.reset();
            spec.decode(self, &mut seq, logits, req.max_tokens, &mut on_event)?;
        } else {
            loop {
                let step = seq.step(&mut logits)?;
                on_event(&step);
                if step.finish.is_some() {
                    break;
                }
                if self.interrupted() {
                    seq.abort(FinishReason::Length);
                    break;
                }
                logits = self.feed(&[step.token], 1, false)?;
            }
            if req.sampling.logprobs.is_some() {
                sum_logprob = Some(seq.logprobs().iter().map(|l| l.logprob).sum());
            }
        }
        let generate_ms = t1.elapsed().as_secs_f64() * 1e3;
        let tokens = seq.tokens().to_vec();
        Ok(Generation {
            prompt_tokens: prompt.to_vec(),
            timings: Timings::new(prompt.len(), prompt_ms, tokens.len(), generate_ms),
            tokens,
            text: seq.text().to_string(),
            finish_reason: seq.finish_reason().unwrap_or(FinishReason::Length),
            logprobs: req
                .sampling
                .logprobs
                .map(|_| seq.logprobs().to_vec())
                .filter(|_| req.beams <= 1),
            sum_logprob,
            cached_tokens,
            speculation: speculator.map(|s| s.stats()),
        })
    }

    /// Beam search from the session's sequence (prompt already fed, `logits` its next-token
    /// logits); the best hypothesis is replayed through `seq`. Returns its summed logprob.
    fn beam_search(
        &mut self,
        tokenizer: &Tokenizer,
        logits: &[f32],
        req: &GenerateRequest,
        seq: &mut Sequence,
        on_event: &mut impl FnMut(&SequenceStep),
    ) -> Result<f32, EngineError> {
        let best = self
            .beam_hypotheses(tokenizer, logits, req, 1)?
            .into_iter()
            .next()
            .ok_or_else(|| EngineError::Request("beam search found no hypothesis".into()))?;
        for &t in &best.tokens {
            let step = seq.accept_token(t);
            on_event(&step);
            if step.finish.is_some() {
                break;
            }
        }
        if !seq.is_finished() {
            seq.abort(best.finish);
        }
        // The session holds the output but its last token, as after sampling; they are
        // evaluated lazily, with the next prompt.
        let out = seq.tokens();
        if out.len() > 1 {
            self.tokens.extend_from_slice(&out[..out.len() - 1]);
            self.n_unfed = out.len() - 1;
        }
        Ok(best.sum_logprob)
    }
}
