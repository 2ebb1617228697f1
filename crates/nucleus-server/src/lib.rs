//! nucleus's OpenAI-compatible HTTP server (axum + tokio) over the continuous-batching engine.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `POST /v1/embeddings`,
//! `GET /v1/models`, `POST /tokenize`, `POST /detokenize` (behind the optional API key),
//! `GET /` (the chat page), `GET /health`, `GET /metrics` (Prometheus text; behind the key too with
//! [`AppState::metrics_require_key`]). With [`AppState::set_cors_origins`], browsers on those
//! origins may call every route (CORS, preflight included). The forward pass runs on
//! the engine's scheduler thread, never on the async runtime; handlers only tokenize, submit and
//! relay events.

pub mod api;
mod beams;
mod embeddings;
pub mod error;
mod generate;
pub mod metrics;
mod prompt;
mod respond;
mod routes;
mod tokens;
mod unsupported;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tower_http::cors::{AllowOrigin, CorsLayer};

use nucleus::chat::ChatTemplate;
use nucleus::engine::context::SINK_TOKENS;
use nucleus::engine::scheduler::EngineHandle;
use nucleus::engine::ContextPolicy;
use nucleus::model::Model;
use nucleus::tokenizer::{TokenId, Tokenizer};

use api::Endpoint;
pub use error::ApiError;
use generate::generate;
use metrics::Metrics;
use prompt::{chat_prompt, completion_prompt, Prompt};

/// Default request body limit: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// Everything the handlers share.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub model_id: String,
    pub api_key: Option<String>,
    /// `/metrics` needs the API key too (when one is set).
    pub metrics_require_key: bool,
    /// Set by [`set_cors_origins`](Self::set_cors_origins).
    cors: Option<CorsLayer>,
    pub max_body: usize,
    /// What a request that does not fit its window gets, unless it says (`context_policy`).
    pub context_policy: ContextPolicy,
    pub metrics: Metrics,
    /// The model, for `/v1/embeddings` (which answers 501 without it).
    pub model: Option<Arc<Model>>,
    /// One embedding request computes at a time.
    embed_lock: tokio::sync::Mutex<()>,
    /// One beam search runs at a time.
    beam_lock: tokio::sync::Mutex<()>,
    pub created: u64,
    pub shutting_down: AtomicBool,
    next_id: AtomicU64,
}

impl AppState {
    pub fn new(
        engine: EngineHandle,
        tokenizer: Arc<Tokenizer>,
        model_id: impl Into<String>,
        api_key: Option<String>,
    ) -> AppState {
        let text_of = |id: Option<TokenId>| {
            id.and_then(|i| tokenizer.token_text(i))
                .unwrap_or("")
                .to_string()
        };
        let template = tokenizer.chat_template().and_then(|src| {
            ChatTemplate::new(src, &text_of(tokenizer.bos()), &text_of(tokenizer.eos())).ok()
        });
        AppState {
            engine,
            template,
            model_id: model_id.into(),
            api_key: api_key.filter(|k| !k.is_empty()),
            metrics_require_key: false,
            cors: None,
            max_body: DEFAULT_MAX_BODY,
            context_policy: ContextPolicy::Error,
            metrics: Metrics::default(),
            model: None,
            embed_lock: tokio::sync::Mutex::new(()),
            beam_lock: tokio::sync::Mutex::new(()),
            created: unix_now(),
            shutting_down: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            tokenizer,
        }
    }

    /// Lets browsers on `origins` (`scheme://host[:port]`, or `*` for any) call the API: CORS
    /// headers on every response and answers to preflight requests, for GET and POST with the
    /// `Authorization` and `Content-Type` headers. An empty list turns CORS off. Fails on a
    /// value that cannot be an origin header.
    pub fn set_cors_origins(&mut self, origins: &[String]) -> Result<(), String> {
        if origins.is_empty() {
            self.cors = None;
            return Ok(());
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
        self.cors = Some(
            CorsLayer::new()
                .allow_origin(allow)
                .allow_methods([Method::GET, Method::POST])
                .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]),
        );
        Ok(())
    }

    fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The application's routes.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let mut metrics = Router::new().route("/metrics", get(metrics_route));
    if state.metrics_require_key {
        metrics = metrics.route_layer(middleware::from_fn_with_state(state.clone(), auth));
    }
    let mut app = Router::new()
        .merge(v1)
        .merge(metrics)
        .route("/health", get(health))
        .route("/", get(routes::page::chat_page))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body));
    if let Some(cors) = &state.cors {
        app = app.layer(cors.clone());
    }
    app.with_state(state)
}

/// Serves until `shutdown` resolves, then stops accepting connections and lets in-flight
/// requests finish for up to `drain`; what is still running after that is cancelled (streams end
/// with an error event). The engine is shut down before returning.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    let st = state.clone();
    let graceful = async move {
        shutdown.await;
        st.shutting_down.store(true, Ordering::SeqCst);
        let engine = st.engine.clone();
        tokio::spawn(async move {
            tokio::time::sleep(drain).await;
            let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
        });
    };
    axum::serve(listener, router(state.clone()))
        .with_graceful_shutdown(graceful)
        .await?;
    let engine = state.engine.clone();
    let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
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

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| ct_eq(g.as_bytes(), key.as_bytes())) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid or missing API key (send `Authorization: Bearer <key>`)",
            )
            .with_code("invalid_api_key")
            .into_response();
        }
    }
    next.run(req).await
}

async fn not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such route",
    )
    .into_response()
}

async fn method_not_allowed() -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method not allowed on this route",
    )
    .into_response()
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.shutting_down.load(Ordering::SeqCst) || st.engine.is_shut_down() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "shutting_down"})),
        )
            .into_response();
    }
    Json(json!({"status": "ok", "model": st.model_id})).into_response()
}

async fn metrics_route(State(st): State<Arc<AppState>>) -> Response {
    let body = st.metrics.render(&st.engine.stats());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
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

fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rej| {
        let status = rej.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                "invalid_request_error",
                "request body too large (limit 1 MiB)",
            )
            .with_code("body_too_large")
        } else {
            ApiError::new(status, "invalid_request_error", rej.body_text())
        }
    })
}

async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let t0 = Instant::now();
    let r = async {
        let body = body_bytes(body)?;
        let req = api::parse(&body)?;
        let settings = req.settings(Endpoint::Completions, st.tokenizer.vocab_size())?;
        let tokens = completion_prompt(&st, &req)?;
        let prompt = Prompt {
            tokens,
            keep: SINK_TOKENS,
            param: "prompt",
        };
        generate(st.clone(), Endpoint::Completions, prompt, settings, t0).await
    }
    .await;
    finish_response(&st, r)
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let t0 = Instant::now();
    let r = async {
        let body = body_bytes(body)?;
        let req = api::parse(&body)?;
        let settings = req.settings(Endpoint::Chat, st.tokenizer.vocab_size())?;
        let prompt = chat_prompt(&st, &req)?;
        generate(st.clone(), Endpoint::Chat, prompt, settings, t0).await
    }
    .await;
    finish_response(&st, r)
}

fn finish_response(st: &AppState, r: Result<Response, ApiError>) -> Response {
    let resp = r.unwrap_or_else(IntoResponse::into_response);
    st.metrics.count_status(resp.status().as_u16());
    resp
}
