//! nucleus's OpenAI-compatible HTTP server (axum + tokio) over the continuous-batching engine.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models` (behind the
//! optional API key), `GET /health`, `GET /metrics` (Prometheus text). The forward pass runs on
//! the engine's scheduler thread, never on the async runtime; handlers only tokenize, submit and
//! relay events.

pub mod api;
pub mod error;
pub mod metrics;

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use nucleus::chat::{ChatTemplate, Message};
use nucleus::engine::context::SINK_TOKENS;
use nucleus::engine::scheduler::{EngineHandle, Event, GenRequest, SubmitError};
use nucleus::engine::ContextPolicy;
use nucleus::sampling::FinishReason;
use nucleus::tokenizer::{TokenId, Tokenizer};

use api::{ApiRequest, Content, Endpoint, GenSettings};
pub use error::ApiError;
use metrics::Metrics;

/// Default request body limit: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

/// Everything the handlers share.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub model_id: String,
    pub api_key: Option<String>,
    pub max_body: usize,
    /// What a request that does not fit its window gets, unless it says (`context_policy`).
    pub context_policy: ContextPolicy,
    pub metrics: Metrics,
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
            max_body: DEFAULT_MAX_BODY,
            context_policy: ContextPolicy::Error,
            metrics: Metrics::default(),
            created: unix_now(),
            shutting_down: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            tokenizer,
        }
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
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics_route))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body))
        .with_state(state)
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
            "meta": {"n_ctx": st.engine.config().n_ctx, "n_vocab": st.tokenizer.vocab_size()},
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

fn completion_prompt(st: &AppState, req: &ApiRequest) -> Result<Vec<TokenId>, ApiError> {
    let bad = || {
        ApiError::param(
            "prompt",
            "`prompt` must be a non-empty string, a list of one string, or a list of token ids",
        )
    };
    let encode = |s: &str| -> Result<Vec<TokenId>, ApiError> {
        if s.is_empty() {
            return Err(ApiError::param("prompt", "`prompt` must not be empty"));
        }
        st.tokenizer
            .encode(s, true, true)
            .map_err(|e| ApiError::param("prompt", format!("cannot tokenize the prompt: {e}")))
    };
    let ids = |v: &[Value]| -> Result<Vec<TokenId>, ApiError> {
        v.iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&t| (t as usize) < st.tokenizer.vocab_size())
                    .map(|t| t as TokenId)
                    .ok_or_else(|| ApiError::param("prompt", "token id out of range"))
            })
            .collect()
    };
    let tokens = match &req.prompt {
        None | Some(Value::Null) => {
            return Err(ApiError::param("prompt", "`prompt` is required"))
        }
        Some(Value::String(s)) => encode(s)?,
        Some(Value::Array(items)) => match items.as_slice() {
            [] => return Err(ApiError::param("prompt", "`prompt` must not be empty")),
            [Value::String(s)] => encode(s)?,
            [Value::Array(inner)] => ids(inner)?,
            xs if xs.iter().all(Value::is_number) => ids(xs)?,
            xs if xs.len() > 1 && xs.iter().all(Value::is_string) => {
                return Err(ApiError::param(
                    "prompt",
                    "batched prompts are not supported; send one prompt per request (use `n` for several choices)",
                ))
            }
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    };
    if tokens.is_empty() {
        return Err(ApiError::param("prompt", "`prompt` must not be empty"));
    }
    Ok(tokens)
}

/// A request's prompt: its tokens, how many of them `truncate` keeps at the start, and the
/// request field it came from (for errors).
struct Prompt {
    tokens: Vec<TokenId>,
    keep: usize,
    param: &'static str,
}

fn chat_prompt(st: &AppState, req: &ApiRequest) -> Result<Prompt, ApiError> {
    let msgs = match &req.messages {
        Some(m) if !m.is_empty() => m,
        Some(_) => return Err(ApiError::param("messages", "`messages` must not be empty")),
        None => return Err(ApiError::param("messages", "`messages` is required")),
    };
    let template = st.template.as_ref().ok_or_else(|| {
        ApiError::invalid("this model has no chat template; use /v1/completions")
            .with_code("no_chat_template")
    })?;
    let mut messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "developer" | "tool"
        ) {
            return Err(ApiError::param(
                &format!("messages[{i}].role"),
                format!("unknown role {:?}", m.role),
            ));
        }
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(ApiError::param(
                            &format!("messages[{i}].content"),
                            format!("content part type {:?} is not supported", p.kind),
                        ));
                    }
                    s.push_str(p.text.as_deref().unwrap_or(""));
                }
                s
            }
        };
        let role = if m.role == "developer" {
            "system"
        } else {
            &m.role
        };
        messages.push(Message::new(role, &content));
    }
    let encode = |msgs: &[Message], gen: bool| -> Result<Vec<TokenId>, ApiError> {
        let text = template
            .render(msgs, gen)
            .map_err(|e| ApiError::param("messages", e.to_string()))?;
        st.tokenizer
            .encode(&text, true, true)
            .map_err(|e| ApiError::param("messages", format!("cannot tokenize: {e}")))
    };
    let tokens = encode(&messages, true)?;
    // `truncate` keeps the system message when it is the start of the prompt.
    let mut keep = SINK_TOKENS;
    if messages.len() > 1 && messages[0].role == "system" {
        let system = encode(&messages[..1], false)?;
        if tokens.starts_with(&system) {
            keep = system.len();
        }
    }
    Ok(Prompt {
        tokens,
        keep,
        param: "messages",
    })
}

fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull(_) => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("{e}"),
        )
        .with_code("queue_full"),
        SubmitError::ShuttingDown => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is shutting down",
        ),
        SubmitError::TooLong { .. } | SubmitError::KvTooSmall { .. } => {
            ApiError::param("max_tokens", e.to_string()).with_code("context_length_exceeded")
        }
        SubmitError::EmptyPrompt => ApiError::param("prompt", e.to_string()),
        SubmitError::BadToken { .. } => ApiError::param("prompt", e.to_string()),
        SubmitError::Sampling(se) => ApiError::invalid(se.to_string()),
        SubmitError::Context(ce) => ApiError::param("context_policy", ce.to_string()),
    }
}

async fn generate(
    st: Arc<AppState>,
    ep: Endpoint,
    prompt: Prompt,
    s: GenSettings,
    t0: Instant,
) -> Result<Response, ApiError> {
    if st.shutting_down.load(Ordering::SeqCst) {
        return Err(submit_error(SubmitError::ShuttingDown));
    }
    let Prompt {
        tokens: prompt,
        keep,
        param: prompt_param,
    } = prompt;
    let n_ctx = st.engine.config().n_ctx;
    let policy = s.context_policy.unwrap_or(st.context_policy);
    if policy == ContextPolicy::Error && prompt.len() >= n_ctx {
        return Err(ApiError::param(
            prompt_param,
            format!(
                "the prompt is {} tokens; the context window is {n_ctx}",
                prompt.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    if let Some(m) = s.max_tokens.filter(|_| policy == ContextPolicy::Error) {
        if prompt.len() + m > n_ctx {
            return Err(ApiError::param(
                "max_tokens",
                format!(
                    "the prompt ({} tokens) plus max_tokens ({m}) exceeds the context window of {n_ctx} tokens",
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
    }
    let mut rxs = Vec::with_capacity(s.n);
    for i in 0..s.n {
        // Each choice draws from its own stream of the seed (independent of every other
        // request's and choice's).
        let sampling = s.sampling.for_choice(i);
        let req = GenRequest {
            prompt_tokens: prompt.clone(),
            sampling,
            stop: s.stop.clone(),
            max_tokens: s.max_tokens,
            ignore_eos: s.ignore_eos,
            context_policy: policy,
            keep_tokens: keep,
        };
        // On failure the receivers already made are dropped, which cancels them.
        rxs.push(st.engine.submit(req).map_err(submit_error)?);
    }
    let (mtx, mrx) = unbounded_channel();
    for (i, rx) in rxs.into_iter().enumerate() {
        tokio::spawn(relay(i, rx, mtx.clone(), st.clone(), t0));
    }
    drop(mtx);
    let want_logprobs = s.sampling.logprobs.is_some();
    let id = st.new_id(match ep {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    });
    if s.stream {
        Ok(stream_response(
            st,
            ep,
            id,
            s.n,
            policy,
            want_logprobs,
            s.include_usage,
            mrx,
        ))
    } else {
        collect_response(st, ep, id, s.n, policy, want_logprobs, mrx).await
    }
}

/// Moves one choice's events to the merged channel, timing them; stops when the merged channel
/// is gone (the client left), which drops the engine receiver and so cancels the sequence.
async fn relay(
    i: usize,
    mut rx: UnboundedReceiver<Event>,
    out: UnboundedSender<(usize, Event)>,
    st: Arc<AppState>,
    t0: Instant,
) {
    let mut last: Option<Instant> = None;
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let ev = ev.unwrap_or_else(|| Event::Error("the engine stopped".into()));
                let end = !matches!(ev, Event::Token(_));
                if matches!(ev, Event::Token(_)) {
                    let now = Instant::now();
                    match last {
                        None => st.metrics.ttft.observe((now - t0).as_secs_f64()),
                        Some(l) => st.metrics.itl.observe((now - l).as_secs_f64()),
                    }
                    last = Some(now);
                }
                if out.send((i, ev)).is_err() || end {
                    break;
                }
            }
            _ = out.closed() => break,
        }
    }
}

fn token_string(tok: &Tokenizer, id: TokenId) -> (String, Vec<u8>) {
    let bytes = tok.piece(id, false).to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Logprobs of one token in the endpoint's format (chat: one `content` entry; completions:
/// `(token, logprob, {token: logprob})`).
fn chat_logprob(tok: &Tokenizer, id: TokenId, lp: f32, top: &[(TokenId, f32)]) -> Value {
    let (t, b) = token_string(tok, id);
    let tops: Vec<Value> = top
        .iter()
        .map(|&(tid, l)| {
            let (tt, tb) = token_string(tok, tid);
            json!({"token": tt, "logprob": l, "bytes": tb})
        })
        .collect();
    json!({"token": t, "logprob": lp, "bytes": b, "top_logprobs": tops})
}

#[derive(Default)]
struct CompletionLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top_logprobs: Vec<serde_json::Map<String, Value>>,
    text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    fn push(
        &mut self,
        tok: &Tokenizer,
        id: TokenId,
        lp: f32,
        top: &[(TokenId, f32)],
        offset: usize,
    ) {
        self.tokens.push(token_string(tok, id).0);
        self.token_logprobs.push(lp);
        let mut m = serde_json::Map::new();
        for &(tid, l) in top {
            m.insert(token_string(tok, tid).0, json!(l));
        }
        self.top_logprobs.push(m);
        self.text_offset.push(offset);
    }

    fn to_json(&self) -> Value {
        json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        })
    }
}

#[derive(Default)]
struct Choice {
    text: String,
    finish: Option<FinishReason>,
    completion_tokens: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
    dropped_tokens: usize,
    chat_lp: Vec<Value>,
    cmpl_lp: CompletionLogprobs,
    error: Option<String>,
}

/// OpenAI's usage object; `cached` is the prompt tokens taken from the prefix cache (for
/// `n > 1`, the fewest of any choice: the prompt is counted once).
fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

async fn collect_response(
    st: Arc<AppState>,
    ep: Endpoint,
    id: String,
    n: usize,
    policy: ContextPolicy,
    want_logprobs: bool,
    mut rx: UnboundedReceiver<(usize, Event)>,
) -> Result<Response, ApiError> {
    let mut choices: Vec<Choice> = (0..n).map(|_| Choice::default()).collect();
    while let Some((i, ev)) = rx.recv().await {
        let c = &mut choices[i];
        match ev {
            Event::Token(t) => {
                if let Some(lp) = t.logprob.filter(|_| want_logprobs) {
                    match ep {
                        Endpoint::Chat => c.chat_lp.push(chat_logprob(
                            &st.tokenizer,
                            t.token,
                            lp,
                            &t.top_logprobs,
                        )),
                        Endpoint::Completions => c.cmpl_lp.push(
                            &st.tokenizer,
                            t.token,
                            lp,
                            &t.top_logprobs,
                            c.text.len(),
                        ),
                    }
                }
                c.text.push_str(&t.text);
            }
            Event::Done(f) => {
                c.text.push_str(&f.text);
                c.finish = Some(f.finish_reason);
                c.completion_tokens = f.completion_tokens;
                c.prompt_tokens = f.prompt_tokens;
                c.cached_tokens = f.cached_tokens;
                c.dropped_tokens = f.dropped_tokens;
            }
            Event::Error(e) => c.error = Some(e),
        }
    }
    if let Some(e) = choices.iter().find_map(|c| c.error.clone()) {
        let status = if st.engine.is_shut_down() {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        return Err(ApiError::new(status, "server_error", e));
    }
    let completion: usize = choices.iter().map(|c| c.completion_tokens).sum();
    let cached = choices.iter().map(|c| c.cached_tokens).min().unwrap_or(0);
    // Every choice has the same prompt (truncated alike).
    let n_prompt = choices.iter().map(|c| c.prompt_tokens).min().unwrap_or(0);
    let finish = |c: &Choice| c.finish.map(FinishReason::as_str);
    let out: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| match ep {
            Endpoint::Chat => json!({
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": if want_logprobs { json!({"content": c.chat_lp}) } else { Value::Null },
                "finish_reason": finish(c),
            }),
            Endpoint::Completions => json!({
                "index": i,
                "text": c.text,
                "logprobs": if want_logprobs { c.cmpl_lp.to_json() } else { Value::Null },
                "finish_reason": finish(c),
            }),
        })
        .collect();
    let object = match ep {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completions => "text_completion",
    };
    let mut body = json!({
        "id": id,
        "object": object,
        "created": unix_now(),
        "model": st.model_id,
        "choices": out,
        "usage": usage(n_prompt, completion, cached),
        "system_fingerprint": "nucleus",
    });
    if policy != ContextPolicy::Error {
        // Tokens dropped from the context (the most of any choice): the prompt's, by
        // `truncate`; those the window evicted, by `stream`.
        body["dropped_tokens"] = json!(choices.iter().map(|c| c.dropped_tokens).max());
    }
    Ok(Json(body).into_response())
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

#[allow(clippy::too_many_arguments)]
fn stream_response(
    st: Arc<AppState>,
    ep: Endpoint,
    id: String,
    n: usize,
    policy: ContextPolicy,
    want_logprobs: bool,
    include_usage: bool,
    mut rx: UnboundedReceiver<(usize, Event)>,
) -> Response {
    let (btx, brx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    let created = unix_now();
    let object = match ep {
        Endpoint::Chat => "chat.completion.chunk",
        Endpoint::Completions => "text_completion",
    };
    let model = st.model_id.clone();
    let chunk = move |choice: Value, usage: Option<Value>| {
        let mut v = json!({
            "id": id,
            "object": object,
            "created": created,
            "model": model,
            "system_fingerprint": "nucleus",
            "choices": if choice.is_null() { json!([]) } else { json!([choice]) },
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        sse(&v)
    };
    tokio::spawn(async move {
        let mut offsets = vec![0usize; n];
        let mut completion = 0;
        let mut cached = usize::MAX;
        let mut n_prompt = usize::MAX;
        if ep == Endpoint::Chat {
            for i in 0..n {
                let c = chunk(
                    json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": Value::Null, "finish_reason": Value::Null}),
                    None,
                );
                if btx.send(Ok(c)).await.is_err() {
                    return;
                }
            }
        }
        while let Some((i, ev)) = rx.recv().await {
            let piece = match ev {
                Event::Token(t) => {
                    let lp = t.logprob.filter(|_| want_logprobs);
                    if t.text.is_empty() && lp.is_none() {
                        continue;
                    }
                    let logprobs = match (lp, ep) {
                        (None, _) => Value::Null,
                        (Some(l), Endpoint::Chat) => {
                            json!({"content": [chat_logprob(&st.tokenizer, t.token, l, &t.top_logprobs)]})
                        }
                        (Some(l), Endpoint::Completions) => {
                            let mut c = CompletionLogprobs::default();
                            c.push(&st.tokenizer, t.token, l, &t.top_logprobs, offsets[i]);
                            c.to_json()
                        }
                    };
                    offsets[i] += t.text.len();
                    match ep {
                        Endpoint::Chat => {
                            json!({"index": i, "delta": {"content": t.text}, "logprobs": logprobs, "finish_reason": Value::Null})
                        }
                        Endpoint::Completions => {
                            json!({"index": i, "text": t.text, "logprobs": logprobs, "finish_reason": Value::Null})
                        }
                    }
                }
                Event::Done(f) => {
                    completion += f.completion_tokens;
                    cached = cached.min(f.cached_tokens);
                    n_prompt = n_prompt.min(f.prompt_tokens);
                    let reason = f.finish_reason.as_str();
                    let mut choice = match ep {
                        Endpoint::Chat => {
                            let delta = if f.text.is_empty() {
                                json!({})
                            } else {
                                json!({"content": f.text})
                            };
                            json!({"index": i, "delta": delta, "logprobs": Value::Null, "finish_reason": reason})
                        }
                        Endpoint::Completions => {
                            json!({"index": i, "text": f.text, "logprobs": Value::Null, "finish_reason": reason})
                        }
                    };
                    if policy != ContextPolicy::Error {
                        choice["dropped_tokens"] = json!(f.dropped_tokens);
                    }
                    choice
                }
                Event::Error(e) => {
                    let err = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e);
                    let _ = btx.send(Ok(sse(&err.body()))).await;
                    let _ = btx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
                    return;
                }
            };
            if btx.send(Ok(chunk(piece, None))).await.is_err() {
                return;
            }
        }
        if include_usage {
            let _ = btx
                .send(Ok(chunk(
                    Value::Null,
                    Some(usage(n_prompt, completion, cached.min(n_prompt))),
                )))
                .await;
        }
        let _ = btx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(brx),
        ))
        .expect("valid response")
}
