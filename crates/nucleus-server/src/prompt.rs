//! A request's prompt: the completions prompt (text or token ids) or the chat messages
//! rendered through the model's template, tokenized, with what `truncate` keeps.

use serde_json::Value;

use nucleus::chat::{ChatTemplate, Message};
use nucleus::engine::context::chat_keep_tokens;
use nucleus::tokenizer::{TokenId, Tokenizer};

use crate::api::{ApiRequest, Content};
use crate::{ApiError, AppState};

pub(crate) fn completion_prompt(st: &AppState, req: &ApiRequest) -> Result<Vec<TokenId>, ApiError> {
    completion_tokens(&st.tokenizer, req)
}

/// The tokens of a completions request's `prompt`.
pub fn completion_tokens(
    tokenizer: &Tokenizer,
    req: &ApiRequest,
) -> Result<Vec<TokenId>, ApiError> {
    let bad = || {
        ApiError::param(
            "prompt",
            "`prompt` must be a non-empty string, a list of one string, or a list of token ids",
        )
    };
    let encode = |s: &str| -> Result<Vec<TokenId>, ApiError> {
        if s.is_empty() {
            return Err(ApiError::param("prompt", "`prompt` must not be empty"));
        }
        tokenizer
            .encode(s, true, true)
            .map_err(|e| ApiError::param("prompt", format!("cannot tokenize the prompt: {e}")))
    };
    let ids = |v: &[Value]| -> Result<Vec<TokenId>, ApiError> {
        v.iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&t| (t as usize) < tokenizer.vocab_size())
                    .map(|t| t as TokenId)
                    .ok_or_else(|| ApiError::param("prompt", "token id out of range"))
            })
            .collect()
    };
    let tokens = match &req.prompt {
        None | Some(Value::Null) => {
            return Err(ApiError::param("prompt", "`prompt` is required"))
        }
        Some(Value::String(s)) => encode(s)?,
        Some(Value::Array(items)) => match items.as_slice() {
            [] => return Err(ApiError::param("prompt", "`prompt` must not be empty")),
            [Value::String(s)] => encode(s)?,
            [Value::Array(inner)] => ids(inner)?,
            xs if xs.iter().all(Value::is_number) => ids(xs)?,
            xs if xs.len() > 1 && xs.iter().all(Value::is_string) => {
                return Err(ApiError::param(
                    "prompt",
                    "batched prompts are not supported; send one prompt per request (use `n` for several choices)",
                ))
            }
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    };
    if tokens.is_empty() {
        return Err(ApiError::param("prompt", "`prompt` must not be empty"));
    }
    Ok(tokens)
}

/// A request's prompt: its tokens, how many of them `truncate` keeps at the start, and the
/// request field it came from (for errors).
pub struct Prompt {
    pub tokens: Vec<TokenId>,
    pub keep: usize,
    pub param: &'static str,
}

pub(crate) fn chat_prompt(st: &AppState, req: &ApiRequest) -> Result<Prompt, ApiError> {
    chat_tokens(
        &st.tokenizer,
        st.template.as_ref(),
        st.parse_special_in_messages,
        req,
    )
}

/// A chat request's prompt: its messages through `template`, their contents plain text unless
/// `parse_special_in_messages` (see [`ChatTemplate::encode`]).
pub fn chat_tokens(
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    parse_special_in_messages: bool,
    req: &ApiRequest,
) -> Result<Prompt, ApiError> {
    let msgs = match &req.messages {
        Some(m) if !m.is_empty() => m,
        Some(_) => return Err(ApiError::param("messages", "`messages` must not be empty")),
        None => return Err(ApiError::param("messages", "`messages` is required")),
    };
    let template = template.ok_or_else(|| {
        ApiError::invalid("this model has no chat template; use /v1/completions")
            .with_code("no_chat_template")
    })?;
    let mut messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "developer" | "tool"
        ) {
            return Err(ApiError::param(
                &format!("messages[{i}].role"),
                format!("unknown role {:?}", m.role),
            ));
        }
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(ApiError::param(
                            &format!("messages[{i}].content"),
                            format!("content part type {:?} is not supported", p.kind),
                        ));
                    }
                    s.push_str(p.text.as_deref().unwrap_or(""));
                }
                s
            }
        };
        let role = if m.role == "developer" {
            "system"
        } else {
            &m.role
        };
        messages.push(Message::new(role, &content));
    }
    let encode = |msgs: &[Message], gen: bool| -> Result<Vec<TokenId>, ApiError> {
        template
            .encode(tokenizer, msgs, gen, parse_special_in_messages)
            .map_err(|e| ApiError::param("messages", e.to_string()))
    };
    let tokens = encode(&messages, true)?;
    let keep = chat_keep_tokens(&messages, &tokens, encode)?;
    Ok(Prompt {
        tokens,
        keep,
        param: "messages",
    })
}
