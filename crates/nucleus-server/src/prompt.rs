//! A request's prompt: the completions prompt (text or token ids) or the chat messages
//! rendered through the model's template, tokenized, with what `truncate` keeps.

use serde_json::{Map, Value};

use nucleus::chat::{ChatTemplate, Message, ToolCall};
use nucleus::engine::context::chat_keep_tokens;
use nucleus::tokenizer::{TokenId, Tokenizer};

use crate::api::{ApiRequest, ChatMessage, Content};
use crate::tools::ToolSettings;
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

/// An assistant message's `tool_calls`, with their `arguments` (a JSON string) as JSON values
/// for the template (a string that is not JSON stays a string).
fn tool_calls(i: usize, m: &ChatMessage) -> Result<Vec<ToolCall>, ApiError> {
    let Some(calls) = &m.tool_calls else {
        return Ok(Vec::new());
    };
    if m.role != "assistant" && !calls.is_empty() {
        return Err(ApiError::param(
            &format!("messages[{i}].tool_calls"),
            "only assistant messages have `tool_calls`",
        ));
    }
    calls
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let field = format!("messages[{i}].tool_calls[{j}]");
            let bad = || {
                ApiError::param(
                    &field,
                    "a tool call is {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
                )
            };
            let f = c.get("function").ok_or_else(bad)?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(bad)?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => Value::Object(Default::default()),
                Some(Value::String(s)) => {
                    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
                }
                Some(v) => v.clone(),
            };
            Ok(ToolCall {
                id: c.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                kind: "function".into(),
                function: nucleus::chat::tools::FunctionCall {
                    name: name.to_string(),
                    arguments,
                },
            })
        })
        .collect()
}

/// A chat request's prompt, and whether it leaves a thinking block open (the output then
/// starts inside it); `kwargs` are extra variables for the template.
pub(crate) fn chat_prompt(
    st: &AppState,
    req: &ApiRequest,
    tools: Option<&ToolSettings>,
    kwargs: Option<&Map<String, Value>>,
) -> Result<(Prompt, bool), ApiError> {
    chat_tokens_with(
        &st.tokenizer,
        st.template.as_ref(),
        st.parse_special_in_messages,
        req,
        tools,
        kwargs,
    )
}

/// A chat request's prompt: its messages (and `tools`) through `template`, their contents
/// plain text unless `parse_special_in_messages` (see [`ChatTemplate::encode_with_tools`]).
pub fn chat_tokens(
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    parse_special_in_messages: bool,
    req: &ApiRequest,
    tools: Option<&ToolSettings>,
) -> Result<Prompt, ApiError> {
    chat_tokens_with(
        tokenizer,
        template,
        parse_special_in_messages,
        req,
        tools,
        None,
    )
    .map(|(p, _)| p)
}

/// [`chat_tokens`] with extra template variables; also says whether the prompt leaves a
/// thinking block open.
pub fn chat_tokens_with(
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    parse_special_in_messages: bool,
    req: &ApiRequest,
    tools: Option<&ToolSettings>,
    kwargs: Option<&Map<String, Value>>,
) -> Result<(Prompt, bool), ApiError> {
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
        let mut msg = Message::new(role, &content);
        msg.tool_calls = tool_calls(i, m)?;
        if m.role == "tool" {
            msg.tool_call_id = Some(m.tool_call_id.clone().ok_or_else(|| {
                ApiError::param(
                    &format!("messages[{i}].tool_call_id"),
                    "a `tool` message needs the `tool_call_id` it answers",
                )
            })?);
        }
        msg.name = m.name.clone();
        msg.reasoning_content = m.reasoning_content.clone();
        messages.push(msg);
    }
    let tools = tools.map(|t| t.tools.as_slice());
    if tools.is_some() && !template.renders_tools() {
        return Err(ApiError::param(
            "tools",
            "this model's chat template does not render tools",
        ));
    }
    let encode_full = |msgs: &[Message], gen: bool| {
        template
            .encode_with_kwargs(
                tokenizer,
                msgs,
                tools,
                gen,
                parse_special_in_messages,
                kwargs,
            )
            .map_err(|e| ApiError::param("messages", e.to_string()))
    };
    let encode = |msgs: &[Message], gen: bool| encode_full(msgs, gen).map(|(ids, _)| ids);
    let (tokens, opens) = encode_full(&messages, true)?;
    let keep = chat_keep_tokens(&messages, &tokens, encode)?;
    Ok((
        Prompt {
            tokens,
            keep,
            param: "messages",
        },
        opens,
    ))
}

/// A completions request with `suffix`: its `prompt` (text or token ids) before the insertion
/// point, `suffix` after it, laid out with the model's FIM tokens as llama-server's `/infill`
/// lays out `input_prefix` and `input_suffix` (see [`crate::infill`]). A model without FIM
/// tokens takes an empty `suffix` as no suffix and refuses any other (naming `suffix`).
pub(crate) fn fim_prompt(
    st: &AppState,
    req: &ApiRequest,
    suffix: &str,
) -> Result<Vec<TokenId>, ApiError> {
    let tok = &st.tokenizer;
    if suffix.is_empty() && crate::infill::required_tokens(tok, "suffix").is_err() {
        return completion_prompt(st, req);
    }
    crate::infill::required_tokens(tok, "suffix")?;
    let prefix = match &req.prompt {
        None | Some(Value::Null) => return Err(ApiError::param("prompt", "`prompt` is required")),
        Some(Value::Array(items)) => match items.as_slice() {
            [one @ Value::String(_)] | [one @ Value::Array(_)] => {
                crate::infill::mixed_tokens(tok, one, "prompt")?
            }
            xs if xs.len() > 1 && xs.iter().all(Value::is_string) => {
                return Err(ApiError::param(
                    "prompt",
                    "batched prompts are not supported; send one prompt per request",
                ))
            }
            _ => crate::infill::mixed_tokens(tok, &Value::Array(items.clone()), "prompt")?,
        },
        Some(v) => crate::infill::mixed_tokens(tok, v, "prompt")?,
    };
    let suffix = tok
        .encode(suffix, false, false)
        .map_err(|e| ApiError::param("suffix", format!("cannot tokenize `suffix`: {e}")))?;
    let input = crate::infill::Infill {
        prefix,
        suffix,
        extra: &[],
        prompt: Vec::new(),
    };
    crate::infill::format_infill(
        tok,
        input,
        crate::infill::N_BATCH,
        crate::infill::N_PREDICT,
        st.engine.config().n_ctx,
    )
}
