//! `POST /tokenize` and `POST /detokenize`, with llama-server's request and response shapes.
//!
//! - `/tokenize` `{"content": TEXT, "add_special": false, "parse_special": true,
//!   "with_pieces": false}` → `{"tokens": [ID, ...]}`, or with pieces
//!   `{"tokens": [{"id": ID, "piece": TEXT}, ...]}` (a piece that is not valid UTF-8 on its own,
//!   part of a multi-byte character, is given as its list of bytes);
//! - `/detokenize` `{"tokens": [ID, ...]}` → `{"content": TEXT}` (special tokens written out).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use nucleus::tokenizer::TokenId;

use crate::api::parse_json;
use crate::routes::body_bytes;
use crate::{ApiError, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default = "yes")]
    parse_special: bool,
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    tokens: Vec<Value>,
}

pub(crate) async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| -> Result<Response, ApiError> {
        let req: TokenizeRequest = parse_json(&body_bytes(body, st.max_body)?)?;
        let ids = st
            .tokenizer
            .encode(&req.content, req.add_special, req.parse_special)
            .map_err(|e| ApiError::param("content", format!("cannot tokenize: {e}")))?;
        let tokens: Vec<Value> = if req.with_pieces {
            ids.iter()
                .map(|&id| {
                    let bytes = st.tokenizer.piece(id, false);
                    let piece = match std::str::from_utf8(bytes) {
                        Ok(s) => json!(s),
                        Err(_) => json!(bytes),
                    };
                    json!({"id": id, "piece": piece})
                })
                .collect()
        } else {
            ids.iter().map(|&id| json!(id)).collect()
        };
        Ok(Json(json!({ "tokens": tokens })).into_response())
    })();
    r.unwrap_or_else(IntoResponse::into_response)
}

/// Token ids from JSON values: each an integer inside the vocabulary.
pub(crate) fn token_ids(
    values: &[Value],
    n_vocab: usize,
    param: &str,
) -> Result<Vec<TokenId>, ApiError> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(t) if (t as usize) < n_vocab => Ok(t as TokenId),
            _ => Err(ApiError::param(
                param,
                format!("`{param}[{i}]` = {v} is not a token id (an integer in [0, {n_vocab}))"),
            )),
        })
        .collect()
}

pub(crate) async fn detokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| -> Result<Response, ApiError> {
        let req: DetokenizeRequest = parse_json(&body_bytes(body, st.max_body)?)?;
        let ids = token_ids(&req.tokens, st.tokenizer.vocab_size(), "tokens")?;
        let content = st.tokenizer.decode(&ids, false);
        Ok(Json(json!({ "content": content })).into_response())
    })();
    r.unwrap_or_else(IntoResponse::into_response)
}
