//! The routes, one family per file, and what they share.

pub(crate) mod completions;
pub(crate) mod embeddings;
pub(crate) mod infill;
pub(crate) mod info;
pub(crate) mod messages;
mod messages_input;
pub(crate) mod page;
pub(crate) mod responses;
pub(crate) mod responses_input;
pub(crate) mod tokens;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::api::{ApiRequest, Endpoint, GenSettings};
use crate::prompt::{chat_prompt, Prompt};
use crate::{ApiError, AppState};

/// The request body, or the error for a body that could not be read (larger than `limit`
/// bytes, ...).
pub(crate) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|rej| {
        let status = rej.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                "invalid_request_error",
                format!(
                    "request body too large (limit {limit} bytes; see `serve --max-body-bytes`)"
                ),
            )
            .with_code("body_too_large")
        } else {
            ApiError::new(status, "invalid_request_error", rej.body_text())
        }
    })
}

/// The answer, or the error's; counted by its status.
pub(crate) fn finish_response(st: &AppState, r: Result<Response, ApiError>) -> Response {
    let resp = r.unwrap_or_else(IntoResponse::into_response);
    st.metrics.count_status(resp.status().as_u16());
    resp
}

/// A chat request's settings and prompt, with `reasoning` set where the request and the
/// template split a thinking block off the answer (chat completions, Messages, Responses).
pub(crate) fn chat_request(
    st: &AppState,
    req: &ApiRequest,
) -> Result<(Prompt, GenSettings), ApiError> {
    let mut settings = req.settings(Endpoint::Chat, st.tokenizer.vocab_size())?;
    let r = crate::reasoning::settings(req, st.template.as_ref())?;
    let (prompt, opened) = chat_prompt(st, req, settings.tools.as_ref(), r.kwargs.as_ref())?;
    settings.reasoning = r.split.then_some(opened);
    Ok((prompt, settings))
}
