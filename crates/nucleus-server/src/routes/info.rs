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
