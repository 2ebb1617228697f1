//! The grammar stage: constrained decoding with [llguidance].
//!
//! A [`GrammarSpec`] (a JSON Schema, "any JSON object", a Lark grammar or a regular expression)
//! is compiled against the model's vocabulary ([`GrammarCompiler`], one per vocabulary) into a
//! [`Grammar`]: one sequence's parser state. It is the first stage of the
//! [`Sampler`](super::Sampler)'s chain: before the logit bias, the penalties, temperature and
//! the truncations, every token that cannot continue a string of the grammar gets a logit of
//! `-inf`; after the pick, the chosen token advances the parser. So whatever the sampler
//! settings, the output is a prefix of a string of the grammar, and once the grammar is
//! complete only end-of-generation tokens are allowed, which end the sequence (finish reason
//! `stop`); `max_tokens` may end it earlier (`length`).
//!
//! The parser state is the sequence's own, like its random stream: a sequence's output depends
//! only on its tokens, settings and seed, never on the batch. Speculative decoding needs nothing
//! more: each verified position is sampled through the same chain, so a proposed token the
//! grammar forbids has probability 0 and is rejected, and the parser only ever sees the tokens
//! that become output (no rollback is needed).
//!
//! An object schema with `properties` and no `additionalProperties` admits only its declared
//! properties, as llama.cpp's `json-schema-to-grammar` reads it (and as OpenAI's strict mode
//! requires); `"additionalProperties": true` or a schema opens it again ([`close_objects`]).
//!
//! JSON is generated in one line with Python's separators (`", "`, `": "`): llguidance's
//! `x-guidance` options `{"whitespace_flexible": false, "item_separator": ", ",
//! "key_separator": ": "}` are added to every schema that sets none, because free whitespace lets
//! a small model at high temperature wander into runs of blank lines until `max_tokens`.

mod gbnf;
mod schema;
mod vocab;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use gbnf::{gbnf_to_lark, looks_like_gbnf};
pub use schema::close_objects;
pub use vocab::{vocab_env, GrammarCompiler};

use super::TokenId;

/// What the output must match.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value valid against this JSON Schema (llguidance's subset: `$ref`/`$defs`, `enum`,
    /// `const`, `anyOf`, nested objects and arrays, required and optional properties, string
    /// formats and patterns, number bounds...).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax (which may embed `%json { schema }` rules).
    Lark(String),
    /// A grammar in llama.cpp's GBNF (start rule `root`), translated to Lark ([`gbnf`]).
    Gbnf(String),
    /// A regular expression (Rust `regex` syntax) the whole output must match.
    Regex(String),
}

impl GrammarSpec {
    /// The JSON options every schema gets unless it sets its own `x-guidance`.
    fn with_json_options(mut schema: Value) -> Value {
        if let Value::Object(m) = &mut schema {
            m.entry("x-guidance").or_insert_with(|| {
                json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
            });
        }
        schema
    }

    pub(crate) fn top_level(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(Self::with_json_options(
                json!({"type": "object"}),
            )),
            GrammarSpec::JsonSchema(s) => {
                TopLevelGrammar::from_json_schema(Self::with_json_options(close_objects(s.clone())))
            }
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            GrammarSpec::Gbnf(g) => TopLevelGrammar::from_lark(gbnf_to_lark(g)?),
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
        })
    }
}

/// A grammar that does not compile, or a parser that failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// One sequence's parser: the mask of the tokens that may come next, advanced token by token.
pub struct Grammar {
    matcher: Matcher,
    /// Tokens of the vocabulary (the mask's length; logits beyond it are never allowed).
    n_vocab: usize,
    eog: Arc<[TokenId]>,
    mask: SimpleVob,
}

impl Grammar {
    pub(crate) fn new(matcher: Matcher, n_vocab: usize, eog: Arc<[TokenId]>) -> Grammar {
        Grammar {
            matcher,
            n_vocab,
            eog,
            mask: SimpleVob::new(),
        }
    }

    /// Sets the logit of every token the grammar does not allow next to `-inf`; returns how
    /// many tokens are allowed. Once the grammar is complete, only end-of-generation tokens are.
    pub fn apply_mask(&mut self, logits: &mut [f32]) -> Result<usize, GrammarError> {
        self.mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError(e.to_string()))?;
        let words = self.mask.as_slice();
        let n = logits.len().min(self.n_vocab);
        for (w, &bits) in words.iter().enumerate() {
            let base = w * 32;
            if base >= n {
                break;
            }
            if bits == u32::MAX {
                continue;
            }
            let end = (base + 32).min(n);
            let row = &mut logits[base..end];
            if bits == 0 {
                row.fill(f32::NEG_INFINITY);
            } else {
                for (b, l) in row.iter_mut().enumerate() {
                    if bits >> b & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
        let covered = (words.len() * 32).min(n);
        logits[covered..].fill(f32::NEG_INFINITY);
        Ok(self.mask.num_set())
    }

    /// Whether the last computed mask allows `token`.
    pub fn allows(&self, token: TokenId) -> bool {
        (token as usize) < self.mask.len() && self.mask.is_allowed(token)
    }

    /// Advances the parser over `token` (the sampled or forced next token). An
    /// end-of-generation token ends the sequence and is not fed to the parser.
    pub fn accept(&mut self, token: TokenId) -> Result<(), GrammarError> {
        if self.eog.contains(&token) {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError(e.to_string()))
    }

    /// How many of `tokens`, in order from the current state, the grammar accepts (the state
    /// does not change). For trimming speculative proposals.
    pub fn valid_prefix(&mut self, tokens: &[TokenId]) -> usize {
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }

    /// The grammar is complete: nothing but end-of-generation may follow.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Could the output end here?
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests;
