//! `POST /v1/embeddings` for the loaded model: each input's final hidden states (after the
//! output norm) averaged over its tokens and L2-normalized ([`nucleus::model::Model::embed`]).
//!
//! `input` is a string, a list of strings, a list of token ids, or a list of lists of token ids
//! (at most [`MAX_INPUTS`]); text is tokenized with the model's BOS token and without parsing
//! special-token text. `encoding_format` is `float` (the default) or `base64` (little-endian
//! f32, as the official client asks for). `dimensions`, when given, must be the model's width.
//! The forward runs on a blocking thread, one embedding request at a time, in a KV cache of its
//! own; it shares the model's thread pool with the scheduler.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use nucleus::model::EMBED_CHUNK;
use nucleus::tokenizer::TokenId;

use crate::api::parse_json;
use crate::routes::body_bytes;
use crate::routes::tokens::token_ids;
use crate::{ApiError, AppState};

/// Inputs in one request at most.
pub const MAX_INPUTS: usize = 256;

/// What `/v1/models` says about the embeddings.
pub const POOLING: &str = "mean of the final hidden states (after the output norm), L2-normalized";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingsRequest {
    input: Option<Value>,
    #[allow(dead_code)]
    model: Option<String>,
    encoding_format: Option<String>,
    dimensions: Option<i64>,
    #[allow(dead_code)]
    user: Option<String>,
}

fn inputs(st: &AppState, input: Option<&Value>) -> Result<Vec<Vec<TokenId>>, ApiError> {
    let bad = || {
        ApiError::param(
            "input",
            "`input` must be a string, a list of strings, a list of token ids or a list of lists of token ids",
        )
    };
    let n_vocab = st.tokenizer.vocab_size();
    let text = |s: &str| -> Result<Vec<TokenId>, ApiError> {
        if s.is_empty() {
            return Err(ApiError::param("input", "`input` must not be empty"));
        }
        st.tokenizer
            .encode(s, true, false)
            .map_err(|e| ApiError::param("input", format!("cannot tokenize: {e}")))
    };
    let all = match input {
        None | Some(Value::Null) => return Err(ApiError::param("input", "`input` is required")),
        Some(Value::String(s)) => vec![text(s)?],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::param("input", "`input` must not be empty"))
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
            .iter()
            .map(|s| text(s.as_str().unwrap_or_default()))
            .collect::<Result<_, _>>()?,
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            vec![token_ids(items, n_vocab, "input")?]
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|v| {
                token_ids(
                    v.as_array().map_or(&[][..], Vec::as_slice),
                    n_vocab,
                    "input",
                )
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if all.len() > MAX_INPUTS {
        return Err(ApiError::param(
            "input",
            format!("at most {MAX_INPUTS} inputs per request"),
        ));
    }
    let n_ctx = st.engine.config().n_ctx;
    for (i, ids) in all.iter().enumerate() {
        if ids.is_empty() {
            return Err(ApiError::param("input", format!("input {i} is empty")));
        }
        if ids.len() > n_ctx {
            return Err(ApiError::param(
                "input",
                format!(
                    "input {i} is {} tokens; the context window is {n_ctx}",
                    ids.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
    }
    Ok(all)
}

/// Standard base64 (RFC 4648, with padding).
pub(crate) fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= c.len() {
                out.push(A[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub(crate) async fn embeddings(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = async {
        let req: EmbeddingsRequest = parse_json(&body_bytes(body, st.max_body)?)?;
        let base64_out = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::param(
                    "encoding_format",
                    format!("`encoding_format` must be `float` or `base64`, not {other:?}"),
                ))
            }
        };
        let model = st.model.clone().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "invalid_request_error",
                "this server was started without embeddings",
            )
        })?;
        let width = model.hp.n_embd;
        if let Some(d) = req.dimensions.filter(|&d| d != width as i64) {
            return Err(ApiError::param(
                "dimensions",
                format!("`dimensions` = {d}: this model's embeddings have {width} (no truncation)"),
            ));
        }
        let inputs = inputs(&st, req.input.as_ref())?;
        let n_tokens: usize = inputs.iter().map(Vec::len).sum();
        // One embedding request at a time: each has a KV cache of its own.
        let _permit = st.embed_lock.lock().await;
        let vectors = tokio::task::spawn_blocking(move || {
            inputs
                .iter()
                .map(|ids| model.embed(ids, EMBED_CHUNK))
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                e.to_string(),
            )
        })?
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                e.to_string(),
            )
        })?;
        let data: Vec<Value> = vectors
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let embedding = if base64_out {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64(&bytes))
                } else {
                    json!(v)
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        Ok(Json(json!({
            "object": "list",
            "data": data,
            "model": st.model_id,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }))
        .into_response())
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), enc);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }
}
