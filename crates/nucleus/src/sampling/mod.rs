//! Decoding: turning a logits vector into the next token, plus beam search and stop conditions.
//!
//! # The sampler chain
//!
//! [`Sampler::sample`] applies these stages, in this order, to one logits vector:
//!
//! 0. **grammar** — with [`SamplingParams::grammar`], every token the grammar does not allow
//!    next gets `-inf`, and the chosen token advances the grammar's parser (see [`grammar`]);
//! 1. **logit bias** — `logit[t] += bias[t]` (`-inf` bans a token);
//! 2. **repetition penalty** — for each distinct token among the last `repeat_last_n` of the
//!    context: `logit > 0 ? logit / penalty : logit * penalty` (CTRL / llama.cpp form);
//! 3. **presence and frequency penalties** — over the same window, OpenAI's
//!    `logit -= count * frequency + (count > 0) * presence`;
//! 4. **DRY** — with `dry_multiplier > 0`, tokens that would extend a repeat of the context
//!    lose `multiplier · base^(length − allowed_length)` (see [`dry`]);
//! 5. **no-repeat-n-gram** — ban any token that would repeat an n-gram already in the context;
//! 6. then, when `T > 0`, the stages of [`SamplingParams::order`] (see [`order`]), by default
//!    llama.cpp's order: **top-n-σ** (keep `logit ≥ max − n·σ`), **top-k**, **typical-p**
//!    (keep the smallest set closest to the expected surprise whose mass reaches `p`),
//!    **top-p** (the smallest most-likely-first set whose mass reaches `p`), **min-p**
//!    (`prob ≥ min_p · max_prob`), **XTC** (with `xtc_probability`, drop the tokens at least
//!    `xtc_threshold` likely but the least likely of them), and **temperature** (`logit / T`;
//!    dynamic temperature when `dynatemp_range > 0`, from the entropy of what is left) last:
//!    the truncations see the untempered distribution, as in llama.cpp. A request may reorder
//!    them or leave stages out (llama-server's `samplers`, the CLI's `--samplers`); penalties
//!    and DRY (stages 2–4) are in that list too and, when left out, are not applied;
//! 7. **pick** — draw from what is left, renormalised, with a seeded RNG.
//!
//! `T == 0` means greedy argmax exactly (stage 6 is skipped). With `mirostat` 1 or 2, stage 6
//! is replaced by llama.cpp's temperature then mirostat, whose state `mu` is the sequence's.
//! The community samplers (DRY, top-n-σ, XTC, dynamic temperature, mirostat) follow
//! llama.cpp's definitions ([`community`]). Each truncation stage renormalises what survived
//! the previous one. Ties between equal logits are broken by the lower token id everywhere, so
//! with the same seed, settings and logits the same token comes out.
//!
//! Stages 1–5 edit the caller's logits vector in place (they touch only the few tokens they
//! concern; top-n-σ also masks it, in one pass); the truncations work on a candidate list that starts as the top-k of the finite
//! logits, found in one pass without sorting the vocabulary (top-k commutes with temperature).
//!
//! Cost on a 262k vocabulary (release, one core): about 0.2 ms per token with top-k on, most of
//! it one pass over the logits; asking for logprobs adds a full log-sum-exp (~0.5 ms). With
//! top-k off, top-p sorts only the prefix that carries the mass, which is small for peaked
//! distributions but can approach a full sort for flat ones.
//!
//! # Also here
//! - [`Sampled::logprob`] / [`Sampled::top_logprobs`]: from the raw model distribution (see
//!   [`logprobs`]);
//! - [`Explain`]: candidate-set size after each stage, final entropy, chosen probability;
//! - [`beam`]: beam search over any [`beam::BeamModel`];
//! - [`stop`]: EOS / stop strings / max-tokens checks with a streaming hold-back buffer.

pub mod beam;
pub mod candidates;
mod chain;
pub mod community;
pub mod dry;
mod explain;
pub mod grammar;
pub mod infill;
pub mod logprobs;
mod math;
pub mod order;
mod rng;
pub mod stages;
pub mod stop;

#[cfg(test)]
pub(crate) mod stat_tests;

pub use beam::{beam_search, BeamError, BeamId, BeamModel, BeamParams, Hypothesis};
pub use community::CommunityParams;
pub use explain::{Explain, Stage};
pub use grammar::{Grammar, GrammarCompiler, GrammarError, GrammarSpec};
pub use order::{ChainStage, LLAMA_CPP_ORDER};
pub use rng::Rng;
pub use stop::{FinishReason, StopChecker, StopConditions, StopStep};

use crate::tokenizer::Tokenizer;
use candidates::Candidates;
use community::Mirostat;
use dry::{Breakers, DrySettings};
use stages::Penalties;

/// A token id, an index into the vocabulary and the logits vector.
pub type TokenId = u32;

/// Errors from sampling and from parameter validation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("the logits vector is empty")]
    EmptyVocab,
    #[error("the logit of token {0} is NaN")]
    NanLogit(TokenId),
    #[error("the logit of token {0} is +inf")]
    InfiniteLogit(TokenId),
    #[error("no token left to sample: every logit is -inf (masked, biased or banned)")]
    NoCandidates,
    #[error("logit_bias names token {token}, outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { token: TokenId, vocab: usize },
    #[error("invalid sampling parameter `{name}`: {reason}")]
    InvalidParam { name: &'static str, reason: String },
    /// The grammar does not compile, or its parser failed.
    #[error("grammar: {0}")]
    Grammar(String),
}

impl From<GrammarError> for SamplingError {
    fn from(e: GrammarError) -> Self {
        SamplingError::Grammar(e.0)
    }
}

/// Settings of the sampler chain. `Default` gives llama.cpp-like defaults.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Temperature `T ≥ 0`; `0` means greedy.
    pub temperature: f32,
    /// Keep the `k` most likely tokens; `0` = off (also off when `k ≥` vocabulary size).
    pub top_k: usize,
    /// Nucleus mass in `(0, 1]`; `1` = off.
    pub top_p: f32,
    /// Min-p in `[0, 1]`; `0` = off.
    pub min_p: f32,
    /// Typical-p mass in `(0, 1]`; `1` = off.
    pub typical_p: f32,
    /// Multiplicative repetition penalty `> 0`; `1` = off.
    pub repeat_penalty: f32,
    /// Window (last tokens of the context) for all three penalties; `0` = penalties off,
    /// `usize::MAX` = the whole context.
    pub repeat_last_n: usize,
    /// OpenAI presence penalty, subtracted once from every token seen in the window.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, subtracted once per occurrence in the window.
    pub frequency_penalty: f32,
    /// Forbid repeating any n-gram of this size from the context; `0` = off.
    pub no_repeat_ngram: usize,
    /// Added to the logits first; `-inf` bans a token.
    pub logit_bias: Vec<(TokenId, f32)>,
    /// RNG seed; `None` seeds from the clock (not reproducible).
    pub seed: Option<u64>,
    /// Which of the seed's random streams to draw from ([`Rng::for_stream`]): several
    /// sequences that share a seed (the `n` choices of a request, the turns of a chat) each
    /// take their own, independent of every other (seed, stream) pair. 0: the seed's own.
    pub stream: u64,
    /// Report the chosen token's logprob and this many top alternatives (`Some(0)`: just the
    /// chosen one); `None` = off.
    pub logprobs: Option<usize>,
    /// Constrain the output to a grammar (the chain's first stage); `None` = free text. A
    /// sampler with a grammar is built with [`Sampler::for_tokenizer`].
    pub grammar: Option<GrammarSpec>,
    /// llama.cpp's community samplers: DRY, XTC, mirostat, top-n-σ, dynamic temperature
    /// (see [`community`]); off by default. Flattened: the fields keep their own names.
    #[serde(flatten)]
    pub community: CommunityParams,
    /// The order of the stages (llama-server's `samplers`); a stage left out is not applied.
    /// `None`: llama.cpp's default, [`LLAMA_CPP_ORDER`]. See [`order`].
    pub samplers: Option<Vec<ChainStage>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            no_repeat_ngram: 0,
            logit_bias: Vec::new(),
            seed: None,
            stream: 0,
            logprobs: None,
            grammar: None,
            community: CommunityParams::default(),
            samplers: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: temperature 0, every truncation off.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        }
    }

    /// Pure sampling from the model distribution at temperature 1 (no truncation), seeded.
    pub fn unrestricted(seed: u64) -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(seed),
            ..Default::default()
        }
    }

    /// The settings of choice `index` of a request with these settings: the same, drawing from
    /// the seed's stream `index` (choice 0 draws what `n = 1` draws).
    pub fn for_choice(&self, index: usize) -> SamplingParams {
        SamplingParams {
            stream: index as u64,
            ..self.clone()
        }
    }

    /// Check every value is in range; the error names the parameter.
    pub fn validate(&self) -> Result<(), SamplingError> {
        fn bad(name: &'static str, reason: String) -> Result<(), SamplingError> {
            Err(SamplingError::InvalidParam { name, reason })
        }
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return bad("temperature", format!("{t} must be finite and >= 0"));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} must be in (0, 1]", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return bad("min_p", format!("{} must be in [0, 1]", self.min_p));
        }
        if !(self.typical_p > 0.0 && self.typical_p <= 1.0) {
            return bad("typical_p", format!("{} must be in (0, 1]", self.typical_p));
        }
        let r = self.repeat_penalty;
        if !(r.is_finite() && r > 0.0) {
            return bad("repeat_penalty", format!("{r} must be finite and > 0"));
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", "must be finite".into());
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency_penalty", "must be finite".into());
        }
        for &(tok, b) in &self.logit_bias {
            if b.is_nan() || b == f32::INFINITY {
                return bad(
                    "logit_bias",
                    format!("bias {b} for token {tok}: must be a number or -inf"),
                );
            }
        }
        if let Some(o) = &self.samplers {
            if let Err(reason) = order::check(o) {
                return bad("samplers", reason);
            }
        }
        self.community.validate()
    }

    /// The stages in their order (see [`order`]).
    pub fn order(&self) -> &[ChainStage] {
        self.samplers.as_deref().unwrap_or(&LLAMA_CPP_ORDER)
    }

    /// Whether `stage` is in the order.
    pub fn has_stage(&self, stage: ChainStage) -> bool {
        self.order().contains(&stage)
    }

    fn dry(&self) -> DrySettings {
        let c = &self.community;
        DrySettings {
            multiplier: c.dry_multiplier,
            base: c.dry_base,
            allowed_length: c.dry_allowed_length,
            last_n: c.dry_penalty_last_n,
        }
    }

    fn penalties(&self) -> Penalties {
        Penalties {
            repeat: self.repeat_penalty,
            last_n: self.repeat_last_n,
            presence: self.presence_penalty,
            frequency: self.frequency_penalty,
        }
    }
}

/// The result of one sampling step.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: TokenId,
    /// ln p(token) under the raw model distribution; `Some` when `logprobs` is set.
    pub logprob: Option<f32>,
    /// The most likely tokens of the raw model distribution with their logprobs, most likely
    /// first; `logprobs: Some(n)` asks for `n` of them.
    pub top_logprobs: Vec<(TokenId, f32)>,
    /// Present when explain is on.
    pub explain: Option<Explain>,
}

/// A sampler chain with its RNG and reusable buffers. One per sequence: the RNG stream is the
/// sequence's, so that a seeded request gives the same text whatever else is batched with it.
pub struct Sampler {
    params: SamplingParams,
    grammar: Option<Grammar>,
    rng: Rng,
    explain: bool,
    cands: Candidates,
    top_buf: Candidates,
    raw: Vec<f32>,
    scratch_ids: Vec<TokenId>,
    counts: Vec<(TokenId, u32)>,
    probs: Vec<f64>,
    dry_breakers: Breakers,
    dry_scratch: (Vec<TokenId>, Vec<usize>, Vec<(TokenId, usize)>),
    /// Mirostat's state (`mu`), this sequence's own.
    mirostat: Option<Mirostat>,
    /// The vocabulary's texts for the infill stage, when the order has it.
    infill: Option<infill::InfillVocab>,
}

impl Sampler {
    /// Validate `params` and build the chain. A grammar needs the vocabulary: use
    /// [`for_tokenizer`](Self::for_tokenizer).
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        let c = &params.community;
        if c.dry_on() && !c.dry_sequence_breakers.is_empty() {
            return Err(SamplingError::InvalidParam {
                name: "dry_sequence_breakers",
                reason: "DRY's sequence breakers need the vocabulary: build the sampler with \
                         Sampler::for_tokenizer"
                    .into(),
            });
        }
        if params.grammar.is_some() {
            return Err(SamplingError::InvalidParam {
                name: "grammar",
                reason: "a grammar needs the vocabulary: build the sampler with \
                         Sampler::for_tokenizer"
                    .into(),
            });
        }
        Self::build(params, None, Breakers::default())
    }

    /// Validate `params` and build the chain, compiling its grammar (if any) for `tok`'s
    /// vocabulary; a grammar that does not compile is [`SamplingError::Grammar`].
    pub fn for_tokenizer(params: SamplingParams, tok: &Tokenizer) -> Result<Self, SamplingError> {
        params.validate()?;
        let grammar = match &params.grammar {
            Some(spec) => Some(GrammarCompiler::for_tokenizer(tok)?.compile(spec)?),
            None => None,
        };
        let c = &params.community;
        let breakers = if c.dry_on() {
            Breakers::for_tokenizer(tok, &c.dry_sequence_breakers)?
        } else {
            Breakers::default()
        };
        let infill = if params.has_stage(ChainStage::Infill) {
            Some(infill::InfillVocab::for_tokenizer(tok).ok_or_else(|| {
                SamplingError::InvalidParam {
                    name: "samplers",
                    reason: "the infill sampler needs an end-of-generation token; this \
                             vocabulary has none"
                        .into(),
                }
            })?)
        } else {
            None
        };
        let mut s = Self::build(params, grammar, breakers)?;
        s.infill = infill;
        Ok(s)
    }

    /// The chain with the infill stage's vocabulary given directly (for tests).
    pub fn with_infill_vocab(
        params: SamplingParams,
        vocab: infill::InfillVocab,
    ) -> Result<Self, SamplingError> {
        let mut s = Self::build(params, None, Breakers::default())?;
        s.infill = Some(vocab);
        Ok(s)
    }

    /// The chain with an already compiled `grammar` (from `params.grammar` or any other).
    pub fn with_grammar(params: SamplingParams, grammar: Grammar) -> Result<Self, SamplingError> {
        Self::build(params, Some(grammar), Breakers::default())
    }

    fn build(
        params: SamplingParams,
        grammar: Option<Grammar>,
        dry_breakers: Breakers,
    ) -> Result<Self, SamplingError> {
        params.validate()?;
        let c = &params.community;
        let mirostat =
            (c.mirostat > 0).then(|| Mirostat::new(c.mirostat, c.mirostat_tau, c.mirostat_eta));
        let rng = params
            .seed
            .map_or_else(Rng::from_entropy, |s| Rng::for_stream(s, params.stream));
        Ok(Sampler {
            params,
            grammar,
            rng,
            explain: false,
            cands: Candidates::default(),
            top_buf: Candidates::default(),
            raw: Vec::new(),
            scratch_ids: Vec::new(),
            counts: Vec::new(),
            probs: Vec::new(),
            dry_breakers,
            dry_scratch: Default::default(),
            mirostat,
            infill: None,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The grammar stage's parser, if the chain has one.
    pub fn grammar(&self) -> Option<&Grammar> {
        self.grammar.as_ref()
    }

    pub fn grammar_mut(&mut self) -> Option<&mut Grammar> {
        self.grammar.as_mut()
    }

    /// Advances the grammar over a token chosen outside [`sample`](Self::sample) (a forced
    /// token); no-op without a grammar. [`sample`](Self::sample) advances it itself.
    pub fn accept_forced(&mut self, token: TokenId) -> Result<(), SamplingError> {
        match &mut self.grammar {
            Some(g) => Ok(g.accept(token)?),
            None => Ok(()),
        }
    }

    /// Turn on or off the [`Explain`] record in each [`Sampled`] (costs an extra pass over the
    /// logits and a softmax of the final candidates).
    pub fn set_explain(&mut self, on: bool) {
        self.explain = on;
    }

    /// Restart the RNG stream from `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }

    /// Sample the next token. `logits` is the model's output for the last position (modified
    /// in place by the bias/penalty stages); `context` is the prompt plus the tokens generated
    /// so far, used by the penalties and the n-gram ban.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        context: &[TokenId],
    ) -> Result<Sampled, SamplingError> {
        check_logits(logits)?;
        let p = &self.params;
        let mut stages = Vec::new();
        if self.explain {
            stages.push((Stage::Input, count_finite(logits)));
        }

        // Raw-distribution logprobs, before anything edits the logits.
        let cp = &p.community;
        let penalties_on = !p.penalties().is_off() && p.has_stage(ChainStage::Penalties);
        let dry_on = cp.dry_on() && p.has_stage(ChainStage::Dry);
        let edits = self.grammar.is_some()
            || !p.logit_bias.is_empty()
            || penalties_on
            || (p.no_repeat_ngram > 0 && !context.is_empty())
            || dry_on
            || cp.top_n_sigma_on();
        let mut lse = 0.0;
        let mut top_logprobs = Vec::new();
        if let Some(n) = p.logprobs {
            lse = logprobs::log_sum_exp(logits);
            top_logprobs = logprobs::top_logprobs(logits, n, lse, &mut self.top_buf);
            if edits {
                self.raw.clear();
                self.raw.extend_from_slice(logits);
            }
        }

        if let Some(g) = &mut self.grammar {
            g.apply_mask(logits)?;
            if self.explain {
                stages.push((Stage::Grammar, count_finite(logits)));
            }
        }
        stages::apply_logit_bias(logits, &p.logit_bias)?;
        if penalties_on {
            stages::apply_penalties(
                logits,
                context,
                &p.penalties(),
                &mut self.scratch_ids,
                &mut self.counts,
            );
        }
        if dry_on {
            let hit = dry::apply_dry(
                logits,
                context,
                &p.dry(),
                &self.dry_breakers,
                &mut self.dry_scratch,
            );
            if self.explain {
                stages.push((Stage::Dry, hit));
            }
        }
        stages::ban_repeated_ngrams(logits, context, p.no_repeat_ngram);

        let (token, entropy, chosen_prob) = if p.temperature == 0.0 {
            let t = stages::argmax(logits).ok_or(SamplingError::NoCandidates)?;
            if self.explain {
                stages.push((Stage::Penalties, count_finite(logits)));
                stages.push((Stage::Greedy, 1));
            }
            (t as TokenId, 0.0, 1.0)
        } else if self.mirostat.is_some() {
            self.pick_mirostat(logits, &mut stages)?
        } else {
            self.pick_truncated(logits, &mut stages)?
        };

        let logprob = self.params.logprobs.map(|_| {
            let raw = if edits {
                self.raw[token as usize]
            } else {
                logits[token as usize]
            };
            (raw as f64 - lse) as f32
        });
        if let Some(g) = &mut self.grammar {
            g.accept(token)?;
        }
        Ok(Sampled {
            token,
            logprob,
            top_logprobs,
            explain: self.explain.then_some(Explain {
                stages,
                entropy,
                chosen_prob,
            }),
        })
    }
}

/// Reject empty, NaN and `+inf` logits (`-inf` is a legitimate mask).
fn check_logits(logits: &[f32]) -> Result<(), SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyVocab);
    }
    // One vectorized pass to find out, a second only to name the culprit.
    if math::any_nan_or_inf(logits) {
        let i = logits
            .iter()
            .position(|l| l.is_nan() || *l == f32::INFINITY)
            .unwrap();
        return Err(if logits[i].is_nan() {
            SamplingError::NanLogit(i as TokenId)
        } else {
            SamplingError::InfiniteLogit(i as TokenId)
        });
    }
    Ok(())
}

fn count_finite(logits: &[f32]) -> usize {
    logits.iter().filter(|l| **l > f32::NEG_INFINITY).count()
}

#[cfg(test)]
mod tests;
