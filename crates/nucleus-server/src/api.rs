//! Request bodies of `/v1/completions` and `/v1/chat/completions` and their validation into
//! engine requests.

use std::collections::HashMap;

use nucleus::engine::ContextPolicy;
use nucleus::sampling::SamplingParams;
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

impl ChatMessage {
    /// A message of `role` with a text `content` and nothing else.
    pub fn text(role: &str, content: String) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: Some(Content::Text(content)),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }
}

/// One of [`ChatMessage::tool_calls`]: `{"id", "type": "function", "function": {"name",
/// "arguments"}}`.
pub fn tool_call(id: &str, name: &str, arguments: impl Into<Value>) -> Value {
    serde_json::json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": arguments.into()},
    })
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
