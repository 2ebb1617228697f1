//! Request bodies of `/v1/completions` and `/v1/chat/completions` and their validation into
//! engine requests.

use std::collections::HashMap;

use nucleus::engine::ContextPolicy;
use nucleus::sampling::{SamplingError, SamplingParams};
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::tools::ToolSettings;

pub const MAX_N: i64 = 16;
pub const MAX_LOGPROBS: i64 = 20;
pub const MAX_STOPS: usize = 16;

#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug, Clone, Default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug, Clone)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant's calls: `[{"id", "type": "function", "function": {"name", "arguments"}}]`.
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// An assistant's earlier reasoning (for templates that render it).
    pub reasoning_content: Option<String>,
}

/// The fields of both endpoints (OpenAI's, then nucleus extensions). Unknown fields are ignored,
/// except those [`crate::unsupported`] lists.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct ApiRequest {
    pub model: Option<String>,
    pub prompt: Option<Value>,
    pub messages: Option<Vec<ChatMessage>>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Completions: an integer (number of alternatives); chat: a boolean.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<i64>,
    pub stop: Option<StopField>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    pub echo: Option<bool>,
    /// Completions: the text after the insertion point; the prompt is then the text before it
    /// (fill-in-the-middle, see [`crate::infill`]).
    pub suffix: Option<String>,
    /// Accepted and unused (OpenAI: an end-user id).
    pub user: Option<String>,
    /// Accepted and unused (OpenAI: up to 16 string key-value pairs stored with the request).
    pub metadata: Option<Value>,
    /// Sample this many and return the `n` with the highest mean logprob per token.
    pub best_of: Option<i64>,
    /// Structured output (see [`crate::structured`]).
    pub response_format: Option<Value>,
    /// Tool calls (see [`crate::tools`]).
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    // llama-server's: a grammar (GBNF; Lark when it has no `name ::=` rule) or a JSON Schema.
    pub grammar: Option<Value>,
    pub json_schema: Option<Value>,
    // vLLM's guided decoding.
    pub guided_json: Option<Value>,
    pub guided_regex: Option<Value>,
    pub guided_grammar: Option<Value>,
    // vLLM's extensions
    /// Beam search of `best_of` (default `n`) beams; the `n` best hypotheses are returned.
    pub use_beam_search: Option<bool>,
    /// Beam search's `alpha` in `score = sum_logprob / len^alpha`.
    pub length_penalty: Option<f32>,
    // nucleus extensions
    /// Per token: candidates left after each sampler stage, entropy, chosen probability.
    pub explain: Option<bool>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub typical_p: Option<f32>,
    #[serde(alias = "repeat_penalty")]
    pub repetition_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub no_repeat_ngram: Option<i64>,
    /// llama-server's DRY, XTC, mirostat, top-n-σ and dynamic temperature fields.
    #[serde(flatten)]
    pub samplers: crate::samplers::SamplerFields,
    pub ignore_eos: Option<bool>,
    /// `error`, `truncate` or `stream`: what to do when the prompt and the answer do not fit
    /// the context window (default: the server's `--context-policy`).
    pub context_policy: Option<String>,
    // Reasoning (see [`crate::reasoning`]).
    pub reasoning_effort: Option<Value>,
    /// llama-server's: `deepseek` (default) or `none`.
    pub reasoning_format: Option<String>,
    /// Variables for the chat template (`enable_thinking`, ...).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

/// Parses a completions or chat body; the error names the offending field, or the first field
/// set that would change the output and is not supported ([`crate::unsupported`]).
pub fn parse(body: &[u8]) -> Result<ApiRequest, ApiError> {
    let req = parse_json(body)?;
    if let Ok(map) = serde_json::from_slice::<serde_json::Map<String, Value>>(body) {
        crate::unsupported::check(&map)?;
    }
    Ok(req)
}

/// Parses a JSON body into `T`; the error names the offending field.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize::<_, T>(de) {
        Ok(r) => Ok(r),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let msg = inner.to_string();
            if inner.is_syntax() || inner.is_eof() {
                Err(ApiError::invalid(format!("malformed JSON body: {inner}"))
                    .with_code("invalid_json"))
            } else if let Some(field) = msg
                .strip_prefix("unknown field `")
                .and_then(|r| r.split('`').next())
            {
                // Bodies that deny unknown fields: name the field.
                Err(ApiError::param(field, msg.clone()).with_code("unknown_field"))
            } else if let Some(field) = msg
                .strip_prefix("missing field `")
                .and_then(|r| r.split('`').next())
            {
                Err(ApiError::param(field, format!("`{field}` is required")))
            } else if path == "." || path.is_empty() {
                Err(ApiError::invalid(format!(
                    "the body must be a JSON object: {inner}"
                )))
            } else {
                let param = path.split(['.', '[']).next().unwrap_or(&path).to_string();
                Err(
                    ApiError::param(&param, format!("invalid value for `{path}`: {inner}"))
                        .with_code("invalid_type"),
                )
            }
        }
    }
}

/// Which endpoint: their `logprobs` fields differ.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// Validated settings shared by both endpoints.
#[derive(Debug, Clone)]
pub struct GenSettings {
    pub sampling: SamplingParams,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub stop: Vec<String>,
    pub max_tokens: Option<usize>,
    pub ignore_eos: bool,
    /// `None`: the server's default.
    pub context_policy: Option<ContextPolicy>,
    /// Choices sampled (`>= n`); the `n` best by mean logprob per token are returned.
    pub best_of: usize,
    /// `use_beam_search`: the sampler settings above are unused (and refused when set).
    pub beams: Option<BeamSettings>,
    pub explain: bool,
    /// The field that set `sampling.grammar` (named when it does not compile).
    pub grammar_field: Option<&'static str>,
    /// Chat with tools (`tool_choice` other than `none`): rendered, and the output parsed.
    pub tools: Option<ToolSettings>,
    /// Split a thinking block off the answer: `Some(opened)`, where `opened` says the prompt
    /// opened it (set by the route once the prompt is built).
    pub reasoning: Option<bool>,
}

/// Beam search over HTTP.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamSettings {
    pub width: usize,
    pub length_penalty: f32,
}

fn range_f32(name: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
    match v {
        Some(x) if !(x.is_finite() && x >= lo && x <= hi) => Err(ApiError::param(
            name,
            format!("`{name}` = {x} is out of range [{lo}, {hi}]"),
        )),
        _ => Ok(v),
    }
}

fn range_i64(name: &str, v: Option<i64>, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match v {
        Some(x) if x < lo || x > hi => Err(ApiError::param(
            name,
            format!("`{name}` = {x} is out of range [{lo}, {hi}]"),
        )),
        _ => Ok(v),
    }
}

impl ApiRequest {
    /// `use_beam_search` (with `best_of` beams, `length_penalty`), refusing the sampler settings
    /// it would leave unused.
    fn beam_settings(&self, width: usize) -> Result<Option<BeamSettings>, ApiError> {
        let length_penalty = range_f32("length_penalty", self.length_penalty, -10.0, 10.0)?;
        if self.use_beam_search != Some(true) {
            if length_penalty.is_some_and(|a| a != 1.0) {
                return Err(ApiError::param(
                    "length_penalty",
                    "`length_penalty` applies to beam search only: set `use_beam_search: true`",
                ));
            }
            return Ok(None);
        }
        let unused = |field: &str, neutral: bool| -> Result<(), ApiError> {
            if neutral {
                return Ok(());
            }
            Err(ApiError::param(
                field,
                format!("`{field}` steers sampling; beam search does not sample: leave it out with `use_beam_search`"),
            ))
        };
        unused("temperature", self.temperature.is_none_or(|t| t == 0.0))?;
        unused("top_p", self.top_p.is_none_or(|v| v == 1.0))?;
        unused("top_k", self.top_k.is_none_or(|v| v <= 0))?;
        unused("min_p", self.min_p.is_none_or(|v| v == 0.0))?;
        unused("typical_p", self.typical_p.is_none_or(|v| v == 1.0))?;
        unused(
            "presence_penalty",
            self.presence_penalty.is_none_or(|v| v == 0.0),
        )?;
        unused(
            "frequency_penalty",
            self.frequency_penalty.is_none_or(|v| v == 0.0),
        )?;
        unused(
            "repetition_penalty",
            self.repetition_penalty.is_none_or(|v| v == 1.0),
        )?;
        unused(
            "no_repeat_ngram",
            self.no_repeat_ngram.is_none_or(|v| v == 0),
        )?;
        unused(
            "logit_bias",
            self.logit_bias.as_ref().is_none_or(HashMap::is_empty),
        )?;
        let no_logprobs = matches!(
            self.logprobs,
            None | Some(Value::Null) | Some(Value::Bool(false))
        );
        unused("logprobs", no_logprobs)?;
        unused("explain", self.explain != Some(true))?;
        let mut community = nucleus::sampling::CommunityParams::default();
        self.samplers.apply(&mut community)?;
        if let Some(field) = self.samplers.first_set(&community) {
            unused(field, false)?;
        }
        unused("samplers", self.samplers.order()?.is_none())?;
        if self.context_policy.as_deref() == Some("stream") {
            return Err(ApiError::param(
                "context_policy",
                "beam search cannot stream past the context window: use `error` or `truncate`",
            ));
        }
        Ok(Some(BeamSettings {
            width,
            length_penalty: length_penalty.unwrap_or(1.0),
        }))
    }

    pub fn settings(&self, ep: Endpoint, n_vocab: usize) -> Result<GenSettings, ApiError> {
        let mut p = SamplingParams::default();
        if let Some(t) = range_f32("temperature", self.temperature, 0.0, 2.0)? {
            p.temperature = t;
        }
        if let Some(v) = self.top_p {
            if !(v > 0.0 && v <= 1.0) {
                return Err(ApiError::param(
                    "top_p",
                    format!("`top_p` = {v} must be in (0, 1]"),
                ));
            }
            p.top_p = v;
        }
        if let Some(v) = range_f32("presence_penalty", self.presence_penalty, -2.0, 2.0)? {
            p.presence_penalty = v;
        }
        if let Some(v) = range_f32("frequency_penalty", self.frequency_penalty, -2.0, 2.0)? {
            p.frequency_penalty = v;
        }
        if let Some(v) = range_i64("top_k", self.top_k, 0, i64::from(u32::MAX))? {
            p.top_k = v as usize;
        }
        if let Some(v) = range_f32("min_p", self.min_p, 0.0, 1.0)? {
            p.min_p = v;
        }
        if let Some(v) = self.typical_p {
            if !(v > 0.0 && v <= 1.0) {
                return Err(ApiError::param(
                    "typical_p",
                    format!("`typical_p` = {v} must be in (0, 1]"),
                ));
            }
            p.typical_p = v;
        }
        if let Some(v) = self.repetition_penalty {
            if !(v.is_finite() && v > 0.0) {
                return Err(ApiError::param(
                    "repetition_penalty",
                    format!("`repetition_penalty` = {v} must be > 0"),
                ));
            }
            p.repeat_penalty = v;
        }
        if let Some(v) = self.repeat_last_n {
            p.repeat_last_n = if v < 0 { usize::MAX } else { v as usize };
        }
        if let Some(v) = range_i64("no_repeat_ngram", self.no_repeat_ngram, 0, 64)? {
            p.no_repeat_ngram = v as usize;
        }
        p.seed = self.seed.map(|s| s as u64);
        if let Some(bias) = &self.logit_bias {
            for (k, &b) in bias {
                let tok: u32 = k.trim().parse().map_err(|_| {
                    ApiError::param(
                        "logit_bias",
                        format!("logit_bias key {k:?} is not a token id"),
                    )
                })?;
                if tok as usize >= n_vocab {
                    return Err(ApiError::param(
                        "logit_bias",
                        format!("logit_bias token {tok} is outside the vocabulary of {n_vocab}"),
                    ));
                }
                if !(-100.0..=100.0).contains(&b) {
                    return Err(ApiError::param(
                        "logit_bias",
                        format!("logit_bias value {b} for token {tok} must be in [-100, 100]"),
                    ));
                }
                // OpenAI: -100 effectively bans the token.
                p.logit_bias
                    .push((tok, if b <= -100.0 { f32::NEG_INFINITY } else { b }));
            }
            p.logit_bias.sort_by_key(|&(t, _)| t);
        }
        p.logprobs = match ep {
            Endpoint::Completions => match &self.logprobs {
                None | Some(Value::Null) => None,
                Some(Value::Number(x)) => match x.as_i64() {
                    Some(k) if (0..=MAX_LOGPROBS).contains(&k) => Some(k as usize),
                    _ => {
                        return Err(ApiError::param(
                            "logprobs",
                            format!("`logprobs` must be an integer in [0, {MAX_LOGPROBS}]"),
                        ))
                    }
                },
                Some(_) => {
                    return Err(ApiError::param("logprobs", "`logprobs` must be an integer"))
                }
            },
            Endpoint::Chat => {
                let top = range_i64("top_logprobs", self.top_logprobs, 0, MAX_LOGPROBS)?;
                match &self.logprobs {
                    None | Some(Value::Null) | Some(Value::Bool(false)) => {
                        if top.is_some_and(|t| t > 0) {
                            return Err(ApiError::param(
                                "top_logprobs",
                                "`top_logprobs` requires `logprobs: true`",
                            ));
                        }
                        None
                    }
                    Some(Value::Bool(true)) => Some(top.unwrap_or(0) as usize),
                    Some(_) => {
                        return Err(ApiError::param("logprobs", "`logprobs` must be a boolean"))
                    }
                }
            }
        };
        self.samplers.apply(&mut p.community)?;
        p.samplers = self.samplers.order()?;
        p.validate().map_err(|e| match e {
            SamplingError::InvalidParam { name, .. } => ApiError::param(name, e.to_string()),
            other => ApiError::invalid(other.to_string()),
        })?;
        let n = range_i64("n", self.n, 1, MAX_N)?.unwrap_or(1) as usize;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOPS {
            return Err(ApiError::param(
                "stop",
                format!("at most {MAX_STOPS} stop strings"),
            ));
        }
        if let (Some(a), Some(b)) = (self.max_completion_tokens, self.max_tokens) {
            if a != b {
                return Err(ApiError::param(
                    "max_completion_tokens",
                    format!("`max_completion_tokens` = {a} and `max_tokens` = {b} disagree; `max_completion_tokens` is the new name of `max_tokens`: send one"),
                ));
            }
        }
        let max = self.max_completion_tokens.or(self.max_tokens);
        let param = if self.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        let max_tokens = match max {
            Some(m) if m < 1 => {
                return Err(ApiError::param(
                    param,
                    format!("`{param}` = {m} must be >= 1"),
                ))
            }
            Some(m) => Some(m as usize),
            // The legacy completions endpoint defaults to 16 tokens, as OpenAI's.
            None if ep == Endpoint::Completions => Some(16),
            None => None,
        };
        if self.echo == Some(true) {
            return Err(ApiError::param("echo", "`echo` is not supported")
                .with_code("unsupported_parameter"));
        }
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::param(
                "stream_options",
                "`stream_options` is only allowed with `stream: true`",
            ));
        }
        match &self.metadata {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) if m.len() <= 16 && m.values().all(Value::is_string) => {}
            Some(_) => {
                return Err(ApiError::param(
                    "metadata",
                    "`metadata` must be an object of at most 16 string values",
                ))
            }
        }
        let best_of = range_i64("best_of", self.best_of, 1, MAX_N)?.map_or(n, |b| b as usize);
        if best_of < n {
            return Err(ApiError::param(
                "best_of",
                format!("`best_of` = {best_of} must be >= `n` = {n}"),
            ));
        }
        if ep == Endpoint::Chat && self.suffix.is_some() {
            return Err(ApiError::param(
                "suffix",
                "`suffix` (fill-in-the-middle) belongs to /v1/completions",
            )
            .with_code("unsupported_parameter"));
        }
        let explain = self.explain.unwrap_or(false);
        let beams = self.beam_settings(best_of)?;
        let constraint = crate::structured::constraint(self)?;
        let tools = match ep {
            Endpoint::Chat => crate::tools::tool_settings(self)?,
            Endpoint::Completions => {
                crate::reasoning::refuse_on_completions(self)?;
                if !matches!(&self.tools, None | Some(Value::Null))
                    && self
                        .tools
                        .as_ref()
                        .and_then(Value::as_array)
                        .is_none_or(|a| !a.is_empty())
                {
                    return Err(
                        ApiError::param("tools", "`tools` belong to /v1/chat/completions")
                            .with_code("unsupported_parameter"),
                    );
                }
                None
            }
        };
        let mut stop = stop;
        let mut grammar_field = None;
        if let Some(c) = &constraint {
            if tools.is_some() {
                return Err(ApiError::param(
                    c.field,
                    format!(
                        "`{}` cannot be combined with `tools` (unless `tool_choice` is \"none\")",
                        c.field
                    ),
                ));
            }
            p.grammar = Some(c.spec.clone());
            grammar_field = Some(c.field);
        }
        if let Some(t) = &tools {
            if let Some(g) = &t.grammar {
                p.grammar = Some(g.clone());
                grammar_field = Some("tools");
            }
            stop.extend(
                t.stop
                    .iter()
                    .filter(|s| !stop.contains(s))
                    .cloned()
                    .collect::<Vec<_>>(),
            );
        }
        if let Some(field) = grammar_field.or(tools.as_ref().map(|_| "tools")) {
            if beams.is_some() {
                return Err(ApiError::param(
                    field,
                    format!("`{field}` does not combine with `use_beam_search`"),
                ));
            }
        }
        if grammar_field.is_some() && self.ignore_eos == Some(true) {
            return Err(ApiError::param(
                "ignore_eos",
                "`ignore_eos` does not combine with a constrained output, which ends once complete",
            ));
        }
        if beams.is_none() && best_of > n && stream {
            return Err(ApiError::param(
                "best_of",
                "`best_of` > `n` cannot stream: the best choices are known only at the end",
            ));
        }
        Ok(GenSettings {
            reasoning: None,
            grammar_field,
            tools,
            best_of,
            beams,
            explain,
            sampling: p,
            n,
            stream,
            include_usage: self
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            stop,
            max_tokens,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            context_policy: match &self.context_policy {
                None => None,
                Some(name) => Some(
                    name.parse()
                        .map_err(|e: String| ApiError::param("context_policy", e))?,
                ),
            },
        })
    }
}
