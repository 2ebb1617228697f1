//! One sequence's decoding state, independent of how its logits are computed.
//!
//! A [`Sequence`] is what a request needs between two forward passes: its [`Sampler`] (with the
//! sequence's own RNG stream), its token context (prompt + generated, for the penalties), the
//! streaming detokenizer and the stop conditions. It knows nothing of the model or the KV cache:
//! the caller hands it each new logits row and gets back a [`SequenceStep`] saying which token was
//! chosen, the text that is safe to emit now, logprob / explain records, and whether (and why)
//! the sequence finished. The single-sequence [`Session`](super::Session) drives one; a
//! multi-sequence scheduler drives many, batching their next tokens into one forward.
//!
//! The driving loop, whatever computes the logits:
//!
//! ```text
//! let mut seq = Sequence::new(&tokenizer, &prompt, &request)?;
//! let mut logits = /* forward of the prompt, last row */;
//! loop {
//!     let step = seq.step(&mut logits)?;
//!     emit(&step.text);
//!     if step.finish.is_some() { break; }        // the last token is not fed
//!     logits = /* forward of step.token */;
//! }
//! ```
//!
//! Text guarantees: concatenating every step's `text` gives [`Sequence::text`]; it is made of
//! whole UTF-8 characters; a stop string — or any beginning of one that a later token could
//! complete — is never in it (held text is released only once it can no longer become a stop
//! string, or when the sequence ends for another reason); the text of end-of-generation tokens
//! is never in it.

use crate::sampling::{
    Explain, FinishReason, Sampler, SamplingError, SamplingParams, StopConditions, TokenId,
};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Everything a generation request sets, besides its prompt.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct GenerateRequest {
    /// The sampler chain; `sampling.logprobs = Some(n)` asks for each token's logprob and its
    /// `n` most likely alternatives. Temperature 0 is exactly greedy.
    pub sampling: SamplingParams,
    /// Stop strings: generation ends when the text contains one; it is not part of the output.
    pub stop: Vec<String>,
    /// New tokens at most (also capped by the context window).
    pub max_tokens: usize,
    /// Keep going past end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
    /// Attach an [`Explain`] record (candidate-set sizes, entropy, chosen probability) to each
    /// step.
    pub explain: bool,
    /// Beam width; `1` = sample token by token, `> 1` = beam search (the sampler settings other
    /// than `max_tokens`, `ignore_eos` and `stop` are then unused).
    pub beams: usize,
    /// Beam search's `alpha` in `score = sum_logprob / len^alpha`.
    pub length_penalty: f32,
    /// Prompt tokens per forward during prefill.
    pub prefill_chunk: usize,
}

impl Default for GenerateRequest {
    fn default() -> Self {
        GenerateRequest {
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            max_tokens: 256,
            ignore_eos: false,
            explain: false,
            beams: 1,
            length_penalty: 1.0,
            prefill_chunk: 512,
        }
    }
}

impl GenerateRequest {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        GenerateRequest {
            sampling: SamplingParams::greedy(),
            max_tokens,
            ..Default::default()
        }
    }

    /// Check every setting; the error names the parameter.
    pub fn validate(&self) -> Result<(), SamplingError> {
        self.sampling.validate()?;
        let bad = |name, reason: &str| {
            Err(SamplingError::InvalidParam {
                name,
                reason: reason.into(),
            })
        };
        if self.beams == 0 {
            return bad("beams", "must be >= 1");
        }
        if !self.length_penalty.is_finite() {
            return bad("length_penalty", "must be finite");
        }
        if self.prefill_chunk == 0 {
            return bad("prefill_chunk", "must be >= 1");
        }
        if self.sampling.grammar.is_some() {
            if self.beams > 1 {
                return bad("beams", "beam search does not combine with a grammar");
            }
            if self.ignore_eos {
                return bad(
                    "ignore_eos",
                    "a grammar ends the output with end-of-generation once complete",
                );
            }
        }
        Ok(())
    }
}

/// A token's logprob in the raw model distribution (see [`crate::sampling::logprobs`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    pub token: TokenId,
    /// The token's text (special tokens included; invalid UTF-8 shown as U+FFFD).
    pub text: String,
    pub logprob: f32,
    /// The most likely tokens at this position, most likely first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative of [`TokenLogprob::top_logprobs`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TopLogprob {
    pub token: TokenId,
    pub text: String,
    pub logprob: f32,
}

/// What one logits row turned into.
#[derive(Clone, Debug, PartialEq)]
pub struct SequenceStep {
    /// The chosen token.
    pub token: TokenId,
    /// An end-of-generation token (and `ignore_eos` is off): it ends the sequence and is not
    /// part of the output.
    pub is_eos: bool,
    /// Text safe to stream now (may be empty while a possible stop string is held back).
    pub text: String,
    /// Present when the request asked for logprobs (absent for EOS and forced tokens).
    pub logprob: Option<TokenLogprob>,
    /// Present when the request asked for explain (absent for forced tokens).
    pub explain: Option<Explain>,
    /// `Some` when the sequence ended with this step: then `token` need not be fed to the
    /// model. `None`: feed `token` and call [`Sequence::step`] with the next logits.
    pub finish: Option<FinishReason>,
}

/// The decoding state of one sequence: see the [module docs](self).
pub struct Sequence<'t> {
    tokenizer: &'t Tokenizer,
    sampler: Sampler,
    want_logprobs: bool,
    /// Prompt then generated tokens (EOS excluded): the penalties' context.
    context: Vec<TokenId>,
    n_prompt: usize,
    decoder: StreamDecoder<'t>,
    stop: StopConditions,
    text: String,
    logprobs: Vec<TokenLogprob>,
}

impl<'t> Sequence<'t> {
    /// A sequence continuing `prompt` (every token the model has seen for it: the penalties
    /// look back into it). Fails on invalid settings.
    pub fn new(
        tokenizer: &'t Tokenizer,
        prompt: &[TokenId],
        req: &GenerateRequest,
    ) -> Result<Self, SamplingError> {
        req.validate()?;
        let sampler = Sampler::for_tokenizer(req.sampling.clone(), tokenizer)?;
        Ok(Self::with_sampler(tokenizer, prompt, req, sampler))
    }

    /// [`new`](Self::new) for a request validated beforehand, with `sampler` already built from
    /// `req.sampling` (it is used as is, RNG state included). For a caller that checks requests
    /// where they arrive and decodes them elsewhere: the scheduler validates at submission and
    /// builds the sequence on its own thread.
    pub fn with_sampler(
        tokenizer: &'t Tokenizer,
        prompt: &[TokenId],
        req: &GenerateRequest,
        mut sampler: Sampler,
    ) -> Self {
        sampler.set_explain(req.explain);
        Sequence {
            tokenizer,
            want_logprobs: sampler.params().logprobs.is_some(),
            sampler,
            context: prompt.to_vec(),
            n_prompt: prompt.len(),
            decoder: StreamDecoder::new(tokenizer, true),
            stop: StopConditions::new(
                tokenizer.eog_tokens().to_vec(),
                req.ignore_eos,
                req.stop.iter().cloned(),
                req.max_tokens,
            ),
            text: String::new(),
            logprobs: Vec::new(),
        }
    }

    /// Sample the next token from `logits` (this sequence's next-token logits; modified in place
    /// by the bias and penalty stages) and advance the stop conditions. After the sequence has
    /// finished, returns a step with no text and the finish reason, recording nothing.
    pub fn step(&mut self, logits: &mut [f32]) -> Result<SequenceStep, SamplingError> {
        if let Some(f) = self.finish_reason() {
            return Ok(self.finished_step(0, f));
        }
        let s = self.sampler.sample(logits, &self.context)?;
        let logprob = match (self.want_logprobs, s.logprob) {
            (true, Some(lp)) => Some(TokenLogprob {
                token: s.token,
                text: self.token_text(s.token),
                logprob: lp,
                top_logprobs: s
                    .top_logprobs
                    .iter()
                    .map(|&(token, logprob)| TopLogprob {
                        token,
                        text: self.token_text(token),
                        logprob,
                    })
                    .collect(),
            }),
            _ => None,
        };
        Ok(self.accept(s.token, logprob, s.explain))
    }

    /// Append a token chosen elsewhere (the best beam of a beam search, a draft token accepted
    /// by speculative decoding): it goes through the detokenizer and the stop conditions as a
    /// sampled one would, without logprob or explain records. (A grammar is advanced over it;
    /// beam search, the one caller that forces tokens, is refused with a grammar.)
    pub fn accept_token(&mut self, token: TokenId) -> SequenceStep {
        if let Some(f) = self.finish_reason() {
            return self.finished_step(token, f);
        }
        let _ = self.sampler.accept_forced(token);
        self.accept(token, None, None)
    }

    /// End the sequence now for a reason found outside (context window full, cancelled). The
    /// text held back as a possible stop string is released and returned. No-op once finished.
    pub fn abort(&mut self, reason: FinishReason) -> String {
        if self.is_finished() {
            return String::new();
        }
        // The held text precedes the detokenizer's incomplete bytes.
        let mut text = self.stop.finish_now(reason).text;
        text.push_str(&self.decoder.finish());
        self.text.push_str(&text);
        text
    }

    fn accept(
        &mut self,
        token: TokenId,
        logprob: Option<TokenLogprob>,
        explain: Option<Explain>,
    ) -> SequenceStep {
        let is_eos = !self.stop.ignore_eos && self.stop.eos.contains(&token);
        let last = is_eos || self.stop.generated() + 1 >= self.stop.max_new_tokens;
        let mut piece = if is_eos {
            String::new()
        } else {
            self.decoder.push(token)
        };
        // An incomplete character at the very end becomes U+FFFD, as `decode` gives.
        if last && !is_eos {
            piece.push_str(&self.decoder.finish());
        }
        let mut st = self.stop.on_token(token, &piece);
        if is_eos {
            // The stop conditions ignore an EOS token's piece; the released held text precedes
            // the detokenizer's incomplete bytes (as in `abort`).
            st.text.push_str(&self.decoder.finish());
        }
        if !is_eos {
            self.context.push(token);
            if let Some(lp) = &logprob {
                self.logprobs.push(lp.clone());
            }
        }
        self.text.push_str(&st.text);
        SequenceStep {
            token,
            is_eos,
            text: st.text,
            logprob: if is_eos { None } else { logprob },
            explain,
            finish: st.finish,
        }
    }

    fn finished_step(&self, token: TokenId, f: FinishReason) -> SequenceStep {
        SequenceStep {
            token,
            is_eos: false,
            text: String::new(),
            logprob: None,
            explain: None,
            finish: Some(f),
        }
    }

    fn token_text(&self, id: TokenId) -> String {
        String::from_utf8_lossy(self.tokenizer.piece(id, false)).into_owned()
    }

    /// The prompt this sequence continues.
    pub fn prompt(&self) -> &[TokenId] {
        &self.context[..self.n_prompt]
    }

    /// Generated tokens so far (an ending EOS token excluded; a token that completed a stop
    /// string included).
    pub fn tokens(&self) -> &[TokenId] {
        &self.context[self.n_prompt..]
    }

    /// Tokens it may still generate before `max_tokens` ends it.
    pub fn tokens_left(&self) -> usize {
        self.stop
            .max_new_tokens
            .saturating_sub(self.stop.generated())
    }

    /// Prompt and generated tokens.
    pub fn context(&self) -> &[TokenId] {
        &self.context
    }

    /// Text emitted so far; once finished, the final output text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// One record per generated token when logprobs were asked for (empty otherwise).
    pub fn logprobs(&self) -> &[TokenLogprob] {
        &self.logprobs
    }

    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.stop.finish_reason()
    }

    pub fn is_finished(&self) -> bool {
        self.finish_reason().is_some()
    }

    /// The stop string that ended the sequence, if one did.
    pub fn matched_stop(&self) -> Option<&str> {
        self.stop.checker().matched()
    }

    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// How many of `drafts` (proposed to follow the last token) the sequence's grammar accepts
    /// in order: all of them without a grammar. Proposals past that would be rejected anyway.
    pub fn grammar_valid_prefix(&mut self, drafts: &[TokenId]) -> usize {
        match self.sampler.grammar_mut() {
            Some(g) => g.valid_prefix(drafts),
            None => drafts.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    // The Sequence needs a real vocabulary; it is exercised end to end on real models in
    // tests/suite/generate.rs. Here: request validation.
    use super::*;

    #[test]
    fn request_validation_names_the_parameter() {
        assert!(GenerateRequest::default().validate().is_ok());
        let r = GenerateRequest {
            beams: 0,
            ..Default::default()
        };
        assert!(matches!(
            r.validate(),
            Err(SamplingError::InvalidParam { name: "beams", .. })
        ));
        let mut r = GenerateRequest::default();
        r.sampling.top_p = 0.0;
        assert!(matches!(
            r.validate(),
            Err(SamplingError::InvalidParam { name: "top_p", .. })
        ));
    }
}
