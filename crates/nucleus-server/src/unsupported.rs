//! Request fields that would change the output and that nucleus does not implement: a request
//! that sets one gets a 400 naming it instead of an answer that silently ignores it.
//!
//! Fields not listed here and not in [`crate::api::ApiRequest`] are ignored (clients send many
//! that change nothing: `store`, `service_tier`, `cache_prompt`, ...). A listed field is accepted
//! when its value asks for nothing: `null`, an empty list or object, `false`, and the few
//! field-specific defaults in [`is_neutral`].

use serde_json::{Map, Value};

use crate::ApiError;

/// (field, what to do instead).
const UNSUPPORTED: &[(&str, &str)] = &[
    // OpenAI
    (
        "functions",
        "the legacy `functions` are not supported: use `tools`",
    ),
    (
        "function_call",
        "the legacy `function_call` is not supported: use `tool_choice`",
    ),
    ("audio", "audio output is not supported"),
    ("modalities", "only text output is supported"),
    ("prediction", "predicted outputs are not supported"),
    ("web_search_options", "web search is not supported"),
    // vLLM's extensions
    ("guided_choice", "use `guided_regex` or `guided_grammar`"),
    (
        "structured_outputs",
        "use `response_format`, `guided_json`, `guided_regex` or `guided_grammar`",
    ),
    ("min_tokens", "`min_tokens` is not supported"),
    (
        "stop_token_ids",
        "`stop_token_ids` is not supported; use `stop` strings",
    ),
    (
        "bad_words",
        "`bad_words` is not supported; use `logit_bias`",
    ),
    (
        "include_stop_str_in_output",
        "stop strings are never part of the output",
    ),
    (
        "skip_special_tokens",
        "special tokens are always skipped in the text",
    ),
    ("prompt_logprobs", "prompt logprobs are not supported"),
    // llama-server's extensions
    ("n_predict", "use `max_tokens`"),
    ("n_probs", "use `logprobs`"),
    ("tfs_z", "tail-free sampling is not implemented"),
    (
        "n_indent",
        "the indentation stop is implemented on /infill only",
    ),
    (
        "t_max_predict_ms",
        "the time limit is implemented on /infill only",
    ),
];

/// A value that asks for nothing (the field's default).
fn is_neutral(field: &str, v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => field != "skip_special_tokens",
        Value::Bool(true) => field == "skip_special_tokens",
        Value::Array(a) if a.is_empty() => true,
        Value::Object(o) if o.is_empty() => true,
        Value::Array(a) if field == "modalities" => a == &[Value::from("text")],
        Value::Number(x) => match field {
            "min_tokens" | "n_probs" | "n_indent" | "t_max_predict_ms" => x.as_f64() == Some(0.0),
            // llama-server's "off" values.
            "n_predict" => x.as_i64() == Some(-1),
            "tfs_z" => x.as_f64() == Some(1.0),
            _ => false,
        },
        Value::String(s) if field == "function_call" => s == "none" || s == "auto",
        _ => false,
    }
}

/// Rejects a body that sets an unsupported field (the first one, in [`UNSUPPORTED`]'s order).
pub fn check(body: &Map<String, Value>) -> Result<(), ApiError> {
    for &(field, why) in UNSUPPORTED {
        if let Some(v) = body.get(field) {
            if !is_neutral(field, v) {
                return Err(ApiError::param(
                    field,
                    format!("`{field}` is not supported by this server: {why}"),
                )
                .with_code("unsupported_parameter"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::check;

    fn run(v: serde_json::Value) -> Result<(), String> {
        check(v.as_object().unwrap()).map_err(|e| e.param.unwrap_or_default())
    }

    #[test]
    fn fields_that_ask_for_something_are_named() {
        assert_eq!(
            run(json!({"functions": [{"name": "f"}]})),
            Err("functions".into())
        );
        assert_eq!(
            run(json!({"guided_choice": ["a"]})),
            Err("guided_choice".into())
        );
        assert_eq!(
            run(json!({"skip_special_tokens": false})),
            Err("skip_special_tokens".into())
        );
        assert_eq!(
            run(json!({"modalities": ["text", "audio"]})),
            Err("modalities".into())
        );
    }

    #[test]
    fn defaults_and_unknown_fields_pass() {
        for v in [
            json!({"functions": null, "function_call": "auto"}),
            json!({"function_call": "none", "skip_special_tokens": true, "min_tokens": 0}),
            json!({"top_n_sigma": -1, "dynatemp_range": 0, "n_predict": -1, "tfs_z": 1}),
            json!({"modalities": ["text"]}),
            json!({"store": true, "service_tier": "auto", "cache_prompt": true}),
        ] {
            assert_eq!(run(v.clone()), Ok(()), "{v}");
        }
    }
}
