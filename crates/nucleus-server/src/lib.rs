//! nucleus's OpenAI-compatible HTTP server (axum + tokio) over the continuous-batching engine.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `POST /infill` (llama-server's
//! fill-in-the-middle), `POST /v1/embeddings`, `POST /v1/messages` and
//! `/v1/messages/count_tokens` (Anthropic's), `POST /v1/responses`,
//! `GET /v1/models`, `POST /tokenize`, `POST /detokenize` (behind the optional API key),
//! `GET /` (the chat page), `GET /health`, `GET /metrics` (Prometheus text; behind the key too with
//! [`AppState::metrics_require_key`]). With [`AppState::set_cors_origins`], browsers on those
//! origins may call every route (CORS, preflight included). The forward pass runs on
//! the engine's scheduler thread, never on the async runtime; handlers only tokenize, submit and
//! relay events.

mod access;
pub mod api;
mod beams;
pub mod editor;
pub mod error;
mod generate;
pub mod infill;
pub mod kv_events;
pub mod metrics;
mod output;
pub mod prompt;
pub mod reasoning;
mod respond;
mod routes;
pub mod samplers;
mod settings;
pub mod structured;
pub mod tools;
mod unsupported;

use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;
use tower_http::cors::CorsLayer;

use nucleus::chat::ChatTemplate;
use nucleus::engine::scheduler::EngineHandle;
use nucleus::engine::ContextPolicy;
use nucleus::model::Model;
use nucleus::tokenizer::{TokenId, Tokenizer};

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
    /// `/metrics` needs the API key too (when one is set).
    pub metrics_require_key: bool,
    /// Set by [`set_cors_origins`](Self::set_cors_origins).
    cors: Option<CorsLayer>,
    /// Request bodies larger than this are refused (413).
    pub max_body: usize,
    /// Parse special-token text inside chat messages (by default only the chat template's own
    /// text can become special tokens; see [`nucleus::chat::ChatTemplate::encode`]).
    pub parse_special_in_messages: bool,
    /// What a request that does not fit its window gets, unless it says (`context_policy`).
    pub context_policy: ContextPolicy,
    /// New tokens one request may generate at most, whatever it asks (`None`: up to the
    /// window, or without end under the `stream` policy). A larger `max_tokens` is lowered
    /// to it, as llama-server's `--n-predict` caps `n_predict`.
    pub max_tokens_cap: Option<usize>,
    /// Prompt tokens one request may send at most (`serve --max-prompt-tokens`).
    pub max_prompt_tokens: Option<usize>,
    pub metrics: Metrics,
    /// The model, for `/v1/embeddings` (which answers 501 without it).
    pub model: Option<Arc<Model>>,
    /// One embedding request computes at a time.
    embed_lock: tokio::sync::Mutex<()>,
    /// One beam search runs at a time.
    beam_lock: tokio::sync::Mutex<()>,
    /// Conversations of past `/v1/responses` answers, for `previous_response_id`.
    responses: routes::responses_input::Store,
    pub created: u64,
    /// The shutdown signal came: `/health` answers 503 (requests are still served until
    /// [`draining`](Self::draining)).
    pub shutting_down: AtomicBool,
    /// The unready window is over: new generation requests are refused with 503 while those in
    /// flight finish.
    pub draining: AtomicBool,
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
            parse_special_in_messages: false,
            context_policy: ContextPolicy::Error,
            max_tokens_cap: None,
            max_prompt_tokens: None,
            metrics: Metrics::default(),
            model: None,
            embed_lock: tokio::sync::Mutex::new(()),
            beam_lock: tokio::sync::Mutex::new(()),
            responses: Default::default(),
            created: unix_now(),
            shutting_down: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            tokenizer,
        }
    }

    /// Lets browsers on `origins` (`scheme://host[:port]`, or `*` for any) call the API: CORS
    /// headers on every response and answers to preflight requests, for GET and POST with the
    /// `Authorization` and `Content-Type` headers. An empty list turns CORS off. Fails on a
    /// value that cannot be an origin header.
    pub fn set_cors_origins(&mut self, origins: &[String]) -> Result<(), String> {
        self.cors = access::cors_layer(origins)?;
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
    use routes::{completions, embeddings, infill, info, messages, page, responses, tokens};
    let auth = || middleware::from_fn_with_state(state.clone(), access::auth);
    let v1 = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(completions::chat_completions))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/responses", post(responses::responses))
        .route("/infill", post(infill::infill))
        .route("/v1/models", get(info::models))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/kv_blocks", get(info::kv_blocks))
        .route_layer(auth());
    let mut metrics = Router::new().route("/metrics", get(info::metrics_route));
    if state.metrics_require_key {
        metrics = metrics.route_layer(auth());
    }
    let mut app = Router::new()
        .merge(v1)
        .merge(metrics)
        .route("/health", get(info::health))
        .route("/", get(page::chat_page))
        .fallback(info::not_found)
        .method_not_allowed_fallback(info::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body));
    if let Some(cors) = &state.cors {
        app = app.layer(cors.clone());
    }
    app.with_state(state)
}

/// How long connections still open when the drain ends (and the engine has stopped) get to
/// deliver their last bytes before [`serve`] returns anyway.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// What [`serve`] does after its shutdown signal, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drain {
    /// First, `/health` answers 503 while the server still accepts and serves new requests:
    /// time for a load balancer's readiness probe to take the replica out before connections
    /// are refused (Kubernetes keeps routing to a pod until its endpoints are updated).
    pub unready: Duration,
    /// Then the server stops accepting, and in-flight requests get this long to finish before
    /// they are cancelled (streams end with an error event).
    pub finish: Duration,
}

impl Drain {
    /// No unready window: stop accepting at once and let in-flight requests finish for `finish`.
    pub fn finishing(finish: Duration) -> Drain {
        Drain {
            unready: Duration::ZERO,
            finish,
        }
    }

    /// The most time [`serve`] takes after the signal: both windows and [`CLOSE_GRACE`].
    pub fn longest(&self) -> Duration {
        self.unready + self.finish + CLOSE_GRACE
    }
}

/// How [`serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// Some connections were still open [`Drain::longest`] after the shutdown signal (a client
    /// stalled mid-request, or stopped reading its answer) and were dropped.
    pub connections_dropped: bool,
}

/// Serves until `shutdown` resolves, then drains as [`Drain`] says: unready but serving for
/// `drain.unready`, then no new connections while in-flight requests finish for up to
/// `drain.finish`; what is still running after that is cancelled. The engine is shut down before
/// returning. Returns at most [`Drain::longest`] after the signal, whatever the clients do: a
/// client that sent half a request and went silent would otherwise keep the server from ever
/// stopping (axum waits for every connection to close).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Drain,
) -> std::io::Result<Stopped> {
    let st = state.clone();
    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let graceful = async move {
        shutdown.await;
        st.shutting_down.store(true, Ordering::SeqCst);
        let _ = signalled_tx.send(());
        tokio::time::sleep(drain.unready).await;
        st.draining.store(true, Ordering::SeqCst);
        let engine = st.engine.clone();
        tokio::spawn(async move {
            tokio::time::sleep(drain.finish).await;
            let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
        });
    };
    let server = axum::serve(listener, router(state.clone())).with_graceful_shutdown(graceful);
    let deadline = async move {
        match signalled_rx.await {
            Ok(()) => tokio::time::sleep(drain.longest()).await,
            // The server ended without a signal (an accept error): the other branch has it.
            Err(_) => std::future::pending().await,
        }
    };
    let connections_dropped = tokio::select! {
        r = server.into_future() => {
            r?;
            false
        }
        () = deadline => true,
    };
    let engine = state.engine.clone();
    let _ = tokio::task::spawn_blocking(move || engine.shutdown()).await;
    Ok(Stopped {
        connections_dropped,
    })
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
