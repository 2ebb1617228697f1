//! Anthropic's Messages request, translated into a chat completions request
//! ([`ApiRequest`]), which the chat machinery then validates, renders and generates.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::api::{tool_call, ApiRequest, ChatMessage, StopField};
use crate::ApiError;

/// The body of `POST /v1/messages` (and, without `max_tokens`, of `count_tokens`). Any other
/// field is a 400 naming it.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessagesRequest {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub messages: Vec<AnthropicMessage>,
    pub system: Option<Value>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// Accepted and unused (`user_id`).
    #[allow(dead_code)]
    pub metadata: Option<Value>,
    /// `{"type": "enabled", "budget_tokens": n}` or `{"type": "disabled"}`.
    pub thinking: Option<Value>,
    /// Accepted and unused.
    #[allow(dead_code)]
    pub service_tier: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnthropicMessage {
    pub role: String,
    pub content: Value,
}

fn text_of(field: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut s = String::new();
            for (k, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => s.push_str(t),
                    _ => {
                        return Err(ApiError::param(
                            &format!("{field}[{k}]"),
                            "only text blocks are supported here",
                        ))
                    }
                }
            }
            Ok(s)
        }
        _ => Err(ApiError::param(
            field,
            "must be a string or a list of text blocks",
        )),
    }
}

/// One Anthropic message as chat messages: a user's `tool_result` blocks become `tool`
/// messages (before its text), an assistant's `tool_use` blocks its `tool_calls` and its
/// `thinking` its `reasoning_content`.
fn translate_message(i: usize, m: &AnthropicMessage) -> Result<Vec<ChatMessage>, ApiError> {
    let field = format!("messages[{i}]");
    if !matches!(m.role.as_str(), "user" | "assistant") {
        return Err(ApiError::param(
            &format!("{field}.role"),
            format!("role {:?} must be \"user\" or \"assistant\"", m.role),
        ));
    }
    let blocks = match &m.content {
        Value::String(s) => return Ok(vec![ChatMessage::text(&m.role, s.clone())]),
        Value::Array(b) => b,
        _ => {
            return Err(ApiError::param(
                &format!("{field}.content"),
                "`content` must be a string or a list of content blocks",
            ))
        }
    };
    let mut out = Vec::new();
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut reasoning: Option<String> = None;
    for (k, b) in blocks.iter().enumerate() {
        let bf = format!("{field}.content[{k}]");
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        let str_of = |key: &str| -> Result<String, ApiError> {
            b.get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| {
                    ApiError::param(
                        &format!("{bf}.{key}"),
                        format!("a {kind} block needs `{key}`"),
                    )
                })
        };
        match (kind, m.role.as_str()) {
            ("text", _) => text.push_str(&str_of("text")?),
            ("tool_use", "assistant") => {
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(tool_call(&str_of("id")?, &str_of("name")?, input));
            }
            ("thinking", "assistant") => {
                reasoning.get_or_insert_with(String::new).push_str(&str_of("thinking")?)
            }
            ("redacted_thinking", "assistant") => {}
            ("tool_result", "user") => {
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(&format!("{bf}.content"), c)?,
                };
                let is_error = b.get("is_error").and_then(Value::as_bool) == Some(true);
                let mut msg = ChatMessage::text(
                    "tool",
                    if is_error { format!("Error: {content}") } else { content },
                );
                msg.tool_call_id = Some(str_of("tool_use_id")?);
                out.push(msg);
            }
            _ => {
                return Err(ApiError::param(
                    &format!("{bf}.type"),
                    format!("content block type {kind:?} is not supported in a {} message (text, tool_use, tool_result, thinking)", m.role),
                )
                .with_code("unsupported_parameter"))
            }
        }
    }
    if m.role == "assistant" || !text.is_empty() || out.is_empty() {
        let mut msg = ChatMessage::text(&m.role, text);
        msg.tool_calls = (!calls.is_empty()).then_some(calls);
        msg.reasoning_content = reasoning;
        out.push(msg);
    }
    Ok(out)
}

/// Anthropic's `tools` as OpenAI's.
fn translate_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("custom");
            if kind != "custom" {
                return Err(ApiError::param(
                    &format!("tools[{i}].type"),
                    format!("tool type {kind:?} is not supported: only client tools (`name`, `description`, `input_schema`)"),
                )
                .with_code("unsupported_parameter"));
            }
            if let Some(k) = t.as_object().and_then(|o| {
                o.keys()
                    .find(|k| !matches!(k.as_str(), "type" | "name" | "description" | "input_schema" | "cache_control"))
            }) {
                return Err(ApiError::param(
                    &format!("tools[{i}].{k}"),
                    format!("unknown tool field `{k}`"),
                )
                .with_code("unknown_field"));
            }
            let mut f = Map::new();
            f.insert("name".into(), t.get("name").cloned().unwrap_or(Value::Null));
            if let Some(d) = t.get("description") {
                f.insert("description".into(), d.clone());
            }
            match t.get("input_schema") {
                Some(s @ Value::Object(_)) => {
                    f.insert("parameters".into(), s.clone());
                }
                _ => {
                    return Err(ApiError::param(
                        &format!("tools[{i}].input_schema"),
                        "a tool needs its `input_schema` (a JSON Schema object)",
                    ))
                }
            }
            Ok(json!({"type": "function", "function": f}))
        })
        .collect()
}

/// Anthropic's `tool_choice` as OpenAI's `tool_choice` and `parallel_tool_calls`.
fn translate_tool_choice(v: &Value) -> Result<(Value, Option<Value>), ApiError> {
    let bad = || {
        ApiError::param(
            "tool_choice",
            "`tool_choice` must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}, with `name` for \"tool\"",
        )
    };
    let o = v.as_object().ok_or_else(bad)?;
    let parallel = match o.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(Value::Bool(!b)),
        Some(_) => {
            return Err(ApiError::param(
                "tool_choice.disable_parallel_tool_use",
                "must be a boolean",
            ))
        }
    };
    let choice = match o.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = o.get("name").and_then(Value::as_str).ok_or_else(bad)?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(bad()),
    };
    Ok((choice, parallel))
}

/// `thinking` as the template's `enable_thinking`.
fn thinking(v: &Value, reasons: bool) -> Result<Option<bool>, ApiError> {
    let enabled = match v.get("type").and_then(Value::as_str) {
        _ if v.is_null() => return Ok(None),
        Some("enabled") => true,
        Some("disabled") => false,
        _ => {
            return Err(ApiError::param(
                "thinking",
                "`thinking` must be {\"type\": \"enabled\", \"budget_tokens\": n} or {\"type\": \"disabled\"}",
            ))
        }
    };
    if enabled && !reasons {
        return Err(ApiError::param(
            "thinking",
            "`thinking` is not supported by this server: this model has no reasoning mode",
        )
        .with_code("unsupported_parameter"));
    }
    Ok(Some(enabled))
}

impl MessagesRequest {
    /// The chat completions request this one means; `generating`: `max_tokens` is required
    /// (not for `count_tokens`); `reasons`: the model has a reasoning mode.
    pub fn to_chat(&self, generating: bool, reasons: bool) -> Result<ApiRequest, ApiError> {
        if generating && self.max_tokens.is_none() {
            return Err(ApiError::param("max_tokens", "`max_tokens` is required"));
        }
        if self.messages.is_empty() {
            return Err(ApiError::param("messages", "`messages` must not be empty"));
        }
        let mut messages = Vec::new();
        if let Some(s) = self.system.as_ref().filter(|s| !s.is_null()) {
            messages.push(ChatMessage::text("system", text_of("system", s)?));
        }
        for (i, m) in self.messages.iter().enumerate() {
            messages.extend(translate_message(i, m)?);
        }
        let (tool_choice, parallel) = match &self.tool_choice {
            None | Some(Value::Null) => (None, None),
            Some(v) => {
                let (c, p) = translate_tool_choice(v)?;
                (Some(c), p)
            }
        };
        let tools = match &self.tools {
            None => None,
            Some(t) => Some(Value::Array(translate_tools(t)?)),
        };
        let mut kwargs = Map::new();
        if let Some(on) = thinking(self.thinking.as_ref().unwrap_or(&Value::Null), reasons)? {
            kwargs.insert("enable_thinking".into(), Value::Bool(on));
        }
        Ok(ApiRequest {
            model: self.model.clone(),
            messages: Some(messages),
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop_sequences.clone().map(StopField::Many),
            stream: self.stream,
            tools,
            tool_choice,
            parallel_tool_calls: parallel,
            chat_template_kwargs: (!kwargs.is_empty()).then_some(kwargs),
            ..Default::default()
        })
    }
}
