//! Reasoning over HTTP: `reasoning_format` (llama-server's: `deepseek`, the default, splits a
//! thinking block into `reasoning_content`; `none` leaves it in `content`),
//! `chat_template_kwargs` (variables for the chat template, such as Qwen3's `enable_thinking`)
//! and `reasoning_effort` (OpenAI's; accepted only by models with a reasoning mode, and given
//! to their template; `"none"` also turns thinking off through `enable_thinking`).

use serde_json::{Map, Value};

use nucleus::chat::ChatTemplate;

use crate::api::ApiRequest;
use crate::ApiError;

/// OpenAI's `reasoning_effort` values.
pub const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high"];

/// How a chat request treats reasoning.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReasoningSettings {
    /// Split a thinking block off the answer.
    pub split: bool,
    /// Extra variables for the chat template.
    pub kwargs: Option<Map<String, Value>>,
}

/// Whether the model has a reasoning mode.
pub fn model_reasons(template: Option<&ChatTemplate>) -> bool {
    template.is_some_and(ChatTemplate::reasons)
}

/// Checks `effort` (a 400 naming `field` for a bad value, or for a model with no reasoning
/// mode) and adds it to `kwargs`.
pub fn add_effort(
    field: &str,
    effort: Option<&Value>,
    reasons: bool,
    kwargs: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let e = match effort {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => e,
        Some(v) => {
            return Err(ApiError::param(
                field,
                format!("`{field}` = {v} must be one of {}", EFFORTS.join(", ")),
            ))
        }
    };
    if !reasons {
        return Err(ApiError::param(
            field,
            format!("`{field}` is not supported by this server: this model has no reasoning mode"),
        )
        .with_code("unsupported_parameter"));
    }
    kwargs.insert("reasoning_effort".into(), Value::String(e.clone()));
    if e == "none" && !kwargs.contains_key("enable_thinking") {
        kwargs.insert("enable_thinking".into(), Value::Bool(false));
    }
    Ok(())
}

/// Parses `reasoning_format` (`None`: the default, split).
pub fn split_format(format: Option<&str>) -> Result<bool, ApiError> {
    match format {
        None | Some("deepseek") | Some("auto") => Ok(true),
        Some("none") => Ok(false),
        Some(f) => Err(ApiError::param(
            "reasoning_format",
            format!("`reasoning_format` {f:?} must be \"deepseek\" (split, the default), \"auto\" or \"none\" (raw text)"),
        )),
    }
}

/// A chat completions request's reasoning settings.
pub fn settings(
    req: &ApiRequest,
    template: Option<&ChatTemplate>,
) -> Result<ReasoningSettings, ApiError> {
    let reasons = model_reasons(template);
    let split = split_format(req.reasoning_format.as_deref())? && reasons;
    let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    add_effort(
        "reasoning_effort",
        req.reasoning_effort.as_ref(),
        reasons,
        &mut kwargs,
    )?;
    Ok(ReasoningSettings {
        split,
        kwargs: (!kwargs.is_empty()).then_some(kwargs),
    })
}

/// Refuses the reasoning fields on `/v1/completions`, which has no template.
pub fn refuse_on_completions(req: &ApiRequest) -> Result<(), ApiError> {
    for (field, set) in [
        ("reasoning_effort", req.reasoning_effort.is_some()),
        ("reasoning_format", req.reasoning_format.is_some()),
        ("chat_template_kwargs", req.chat_template_kwargs.is_some()),
    ] {
        if set {
            return Err(ApiError::param(
                field,
                format!("`{field}` belongs to /v1/chat/completions"),
            )
            .with_code("unsupported_parameter"));
        }
    }
    Ok(())
}
