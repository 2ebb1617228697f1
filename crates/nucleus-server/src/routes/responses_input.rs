//! OpenAI's Responses request, translated into a chat completions request ([`ApiRequest`]);
//! and the bounded in-memory store of past conversations behind `previous_response_id`.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::api::{tool_call, ApiRequest, ChatMessage};
use crate::ApiError;

/// The body of `POST /v1/responses`. Any other field is a 400 naming it.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Option<Value>,
    pub instructions: Option<String>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", ...}}`.
    pub text: Option<Value>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub stream: Option<bool>,
    /// `{"effort": ..., "summary": ...}`.
    pub reasoning: Option<Value>,
    pub previous_response_id: Option<String>,
    /// Keep the conversation for `previous_response_id` (default true, as OpenAI's).
    pub store: Option<bool>,
    /// Accepted and echoed.
    pub metadata: Option<Value>,
    /// Accepted and unused.
    #[allow(dead_code)]
    pub user: Option<String>,
    #[allow(dead_code)]
    pub safety_identifier: Option<String>,
    #[allow(dead_code)]
    pub prompt_cache_key: Option<String>,
    #[allow(dead_code)]
    pub service_tier: Option<String>,
    /// Only `"disabled"` (the default).
    pub truncation: Option<String>,
    /// Only an empty list.
    pub include: Option<Vec<Value>>,
}

/// A message item's content: a string or a list of text parts.
fn content_text(field: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut s = String::new();
            for (k, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, p.get("text")) {
                    ("input_text" | "output_text" | "text", Some(Value::String(t))) => {
                        s.push_str(t)
                    }
                    _ => {
                        return Err(ApiError::param(
                            &format!("{field}[{k}]"),
                            format!(
                            "content part type {kind:?} is not supported (input_text, output_text)"
                        ),
                        )
                        .with_code("unsupported_parameter"))
                    }
                }
            }
            Ok(s)
        }
        _ => Err(ApiError::param(
            field,
            "`content` must be a string or a list of parts",
        )),
    }
}

/// The input items as chat messages. Function calls join the assistant message before them
/// (or start one); a reasoning item goes to the next assistant message.
pub(crate) fn input_messages(input: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![ChatMessage::text("user", s.clone())]),
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::param(
                "input",
                "`input` must be a string or a list of items",
            ))
        }
    };
    let mut out: Vec<ChatMessage> = Vec::new();
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let f = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        let str_of = |key: &str| -> Result<String, ApiError> {
            item.get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| {
                    ApiError::param(
                        &format!("{f}.{key}"),
                        format!("a {kind} item needs `{key}` (a string)"),
                    )
                })
        };
        match kind {
            "message" => {
                let role = str_of("role")?;
                if !matches!(role.as_str(), "user" | "assistant" | "system" | "developer") {
                    return Err(ApiError::param(&format!("{f}.role"), format!("unknown role {role:?}")));
                }
                let content = content_text(&format!("{f}.content"), item.get("content").unwrap_or(&Value::Null))?;
                let mut m = ChatMessage::text(&role, content);
                if role == "assistant" {
                    m.reasoning_content = reasoning.take();
                }
                out.push(m);
            }
            "function_call" => {
                let call = tool_call(&str_of("call_id")?, &str_of("name")?, str_of("arguments")?);
                let joins = out.last().is_some_and(|m| m.role == "assistant");
                if !joins {
                    let mut m = ChatMessage::text("assistant", String::new());
                    m.reasoning_content = reasoning.take();
                    out.push(m);
                }
                let last = out.last_mut().expect("an assistant message");
                last.tool_calls.get_or_insert_with(Vec::new).push(call);
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(&format!("{f}.output"), v)?,
                    _ => return Err(ApiError::param(&format!("{f}.output"), "`output` must be a string")),
                };
                let mut m = ChatMessage::text("tool", output);
                m.tool_call_id = Some(str_of("call_id")?);
                out.push(m);
            }
            "reasoning" => {
                let mut text = String::new();
                for part in item.get("content").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(t) = part.get("text").and_then(Value::as_str) {
                        text.push_str(t);
                    }
                }
                reasoning = Some(text);
            }
            other => {
                return Err(ApiError::param(
                    &format!("{f}.type"),
                    format!("input item type {other:?} is not supported (message, function_call, function_call_output, reasoning)"),
                )
                .with_code("unsupported_parameter"))
            }
        }
    }
    Ok(out)
}

fn translate_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(ApiError::param(
                    &format!("tools[{i}].type"),
                    format!("tool type {kind:?} is not supported: only \"function\""),
                )
                .with_code("unsupported_parameter"));
            }
            let mut f: Map<String, Value> = t.as_object().cloned().unwrap_or_default();
            f.remove("type");
            Ok(json!({"type": "function", "function": f}))
        })
        .collect()
}

fn translate_tool_choice(v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::String(_) => Ok(v.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").cloned().unwrap_or(Value::Null);
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(ApiError::param(
            "tool_choice",
            "`tool_choice` must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
        )),
    }
}

/// `text.format` as chat's `response_format`.
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut js = format.as_object().cloned().unwrap_or_default();
            js.remove("type");
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        _ => Err(ApiError::param(
            "text.format",
            "`text.format.type` must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

impl ResponsesRequest {
    /// The chat request this one means, after `history` (a stored conversation);
    /// `reasons`: the model has a reasoning mode. Also the conversation without the
    /// instructions (what `previous_response_id` carries on).
    pub fn to_chat(
        &self,
        history: Vec<ChatMessage>,
        reasons: bool,
    ) -> Result<(ApiRequest, Vec<ChatMessage>), ApiError> {
        if let Some(t) = self.truncation.as_deref().filter(|t| *t != "disabled") {
            return Err(ApiError::param(
                "truncation",
                format!("`truncation` {t:?} is not supported: only \"disabled\""),
            )
            .with_code("unsupported_parameter"));
        }
        if self.include.as_ref().is_some_and(|i| !i.is_empty()) {
            return Err(ApiError::param("include", "`include` is not supported")
                .with_code("unsupported_parameter"));
        }
        let input = self
            .input
            .as_ref()
            .ok_or_else(|| ApiError::param("input", "`input` is required"))?;
        let mut conversation = history;
        conversation.extend(input_messages(input)?);
        let mut messages = Vec::new();
        if let Some(i) = &self.instructions {
            messages.push(ChatMessage::text("system", i.clone()));
        }
        messages.extend(conversation.iter().cloned());
        let mut kwargs = Map::new();
        if let Some(r) = self.reasoning.as_ref().filter(|r| !r.is_null()) {
            crate::reasoning::add_effort(
                "reasoning.effort",
                r.get("effort"),
                reasons,
                &mut kwargs,
            )?;
        }
        let tools = match &self.tools {
            None => None,
            Some(t) => Some(Value::Array(translate_tools(t)?)),
        };
        let req = ApiRequest {
            model: self.model.clone(),
            messages: Some(messages),
            max_tokens: self.max_output_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            stream: self.stream,
            tools,
            tool_choice: self
                .tool_choice
                .as_ref()
                .map(translate_tool_choice)
                .transpose()?,
            parallel_tool_calls: self.parallel_tool_calls.map(Value::Bool),
            response_format: match &self.text {
                None => None,
                Some(t) => response_format(t)?,
            },
            chat_template_kwargs: (!kwargs.is_empty()).then_some(kwargs),
            ..Default::default()
        };
        Ok((req, conversation))
    }
}

/// The conversations of the last [`Store::CAPACITY`] stored responses, by id.
#[derive(Default)]
pub(crate) struct Store {
    items: Mutex<VecDeque<(String, Vec<ChatMessage>)>>,
}

impl Store {
    pub const CAPACITY: usize = 256;

    pub fn get(&self, id: &str) -> Option<Vec<ChatMessage>> {
        let items = self.items.lock().ok()?;
        items.iter().find(|(k, _)| k == id).map(|(_, v)| v.clone())
    }

    pub fn put(&self, id: String, conversation: Vec<ChatMessage>) {
        if let Ok(mut items) = self.items.lock() {
            if items.len() == Self::CAPACITY {
                items.pop_front();
            }
            items.push_back((id, conversation));
        }
    }
}

/// The assistant message of an answer, for the store.
pub(crate) fn answer_message(
    reasoning: Option<String>,
    text: String,
    calls: &[(String, String, String)],
) -> ChatMessage {
    let mut m = ChatMessage::text("assistant", text);
    m.reasoning_content = reasoning;
    if !calls.is_empty() {
        m.tool_calls = Some(
            calls
                .iter()
                .map(|(id, name, args)| tool_call(id, name, args.as_str()))
                .collect(),
        );
    }
    m
}
