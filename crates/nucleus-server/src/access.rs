//! Who may call the server: the API key (`Authorization: Bearer KEY`, compared in constant
//! time) and CORS for pages on other origins (`--cors-origin`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::{ApiError, AppState};

/// The CORS layer letting pages on `origins` (`scheme://host[:port]`, or `*` for any) call
/// the API: CORS headers on every response and answers to preflight requests, for GET and POST
/// with the `Authorization` and `Content-Type` headers. `None` for an empty list. Fails on a
/// value that is not such an origin.
pub(crate) fn cors_layer(origins: &[String]) -> Result<Option<CorsLayer>, String> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let mut list = Vec::with_capacity(origins.len());
        for o in origins {
            let o = o.trim_end_matches('/');
            let host = o
                .strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
                .unwrap_or("");
            let host_ok = !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._:[]".contains(c));
            if !host_ok {
                return Err(format!(
                    "CORS origin {o:?} must be `*` or scheme://host[:port] (http or https)"
                ));
            }
            list.push(
                HeaderValue::from_str(o)
                    .map_err(|_| format!("CORS origin {o:?} is not a valid header value"))?,
            );
        }
        AllowOrigin::list(list)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::HeaderName::from_static("x-api-key"),
                header::HeaderName::from_static("anthropic-version"),
            ]),
    ))
}

/// Constant-time comparison (the length is not secret).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| acc | std::hint::black_box(x ^ y));
    diff == 0
}

pub(crate) async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        // Anthropic's clients send the key as `x-api-key`.
        let x_api_key = req
            .headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim);
        let ok = |g: Option<&str>| g.is_some_and(|g| ct_eq(g.as_bytes(), key.as_bytes()));
        if !(ok(bearer) || ok(x_api_key)) {
            let err = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid or missing API key (send `Authorization: Bearer <key>` or `x-api-key: <key>`)",
            )
            .with_code("invalid_api_key");
            if req.uri().path().starts_with("/v1/messages") {
                return crate::routes::messages::error_response(err);
            }
            return err.into_response();
        }
    }
    next.run(req).await
}
