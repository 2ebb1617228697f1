//! `GET /health`, `GET /metrics`, `GET /v1/models`, and the answers to unknown routes and
//! methods.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::routes::embeddings;
use crate::{ApiError, AppState};

pub(crate) async fn not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such route",
    )
    .into_response()
}

pub(crate) async fn method_not_allowed() -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method not allowed on this route",
    )
    .into_response()
}

pub(crate) async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.shutting_down.load(Ordering::SeqCst) || st.engine.is_shut_down() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting_down"})),
        )
            .into_response();
    }
    Json(json!({"status": "ok", "model": st.model_id})).into_response()
}

pub(crate) async fn metrics_route(State(st): State<Arc<AppState>>) -> Response {
    let body = st
        .metrics
        .render(&st.engine.stats(), st.engine.config().block_size);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

pub(crate) async fn models(State(st): State<Arc<AppState>>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id,
            "object": "model",
            "created": st.created,
            "owned_by": "nucleus",
            "meta": {
                "n_ctx": st.engine.config().n_ctx,
                "n_vocab": st.tokenizer.vocab_size(),
                "n_embd": st.model.as_ref().map(|m| m.hp.n_embd),
                "embeddings": st.model.as_ref().map(|_| embeddings::POOLING),
            },
        }],
    }))
    .into_response()
}

/// `GET /kv_blocks`: the prefix cache's blocks as the KV events describe them (with
/// `--kv-events`): `{"block_size", "hashes"}`, each hash as the events send it. What a
/// subscriber that replayed every event must hold: a check for routers and tests.
pub(crate) async fn kv_blocks(State(st): State<Arc<AppState>>) -> Response {
    if !st.engine.config().kv_events {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "KV-cache events are off (start the server with --kv-events)",
        )
        .into_response();
    }
    let mut hashes: Vec<u64> = st
        .engine
        .cached_block_hashes()
        .into_iter()
        .map(crate::kv_events::wire_hash)
        .collect();
    hashes.sort_unstable();
    Json(json!({
        "block_size": st.engine.config().block_size,
        "hashes": hashes,
    }))
    .into_response()
}
