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

use crate::ApiError;

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
