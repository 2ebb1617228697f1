//! `GET /`: the chat page, one static HTML file with its CSS and JavaScript, compiled into the
//! binary (no build step, nothing fetched from elsewhere). It calls `/v1/models` and
//! `/v1/chat/completions` (streamed, with `logprobs`, `top_logprobs` and `explain`) with the
//! API key the user types in, so the page itself needs none.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page (`crates/nucleus-server/page/index.html`).
pub const CHAT_PAGE: &str = include_str!("../../page/index.html");

pub(crate) async fn chat_page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            // The page loads nothing from elsewhere and may not be framed.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; frame-ancestors 'none'",
            ),
        ],
        CHAT_PAGE,
    )
        .into_response()
}
