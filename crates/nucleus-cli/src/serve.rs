//! `nucleus serve`: the OpenAI-compatible HTTP server over the continuous-batching engine.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use nucleus::engine::scheduler::{DraftModel, Engine, EngineConfig, SpecConfig};
use nucleus_server::AppState;

use crate::catalog::{self, DEFAULT_MODEL};
use crate::speculate::{Method, SpeculateArgs};

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Model: a catalog name (see `nucleus list`) or a path to a GGUF file.
    pub model: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Threads for the forward pass (0 = all cores; at most 512).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
    /// Context window of one sequence (default: the model's, capped at 4096). Above the
    /// model's training context only with --allow-long-context.
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Accept a --ctx above the model's training context (`context_length`): positions it was
    /// never trained on, where the output degrades (no RoPE scaling is applied).
    #[arg(long)]
    pub allow_long_context: bool,
    /// Sequences decoded together at most (1 to 1024).
    #[arg(long, default_value_t = 16)]
    pub max_running: usize,
    /// Requests waiting for admission at most (beyond: 429; 0 to 65536).
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Tokens the shared KV cache holds (default: max_running × ctx, capped at 32768; at
    /// least ctx). Checked against the memory available before it is allocated.
    #[arg(long)]
    pub kv_tokens: Option<usize>,
    /// Tokens per KV block (1 to 256).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Tokens per forward pass at most (decode tokens first, then prefill chunks; 1 to 65536).
    #[arg(long, default_value_t = 256)]
    pub step_tokens: usize,
    /// Request bodies larger than this are refused with 413 (1 KiB to 1 GiB).
    #[arg(long, default_value_t = nucleus_server::DEFAULT_MAX_BODY)]
    pub max_body_bytes: usize,
    /// Require `Authorization: Bearer KEY` on /v1 routes (also read from NUCLEUS_API_KEY).
    #[arg(long, env = "NUCLEUS_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Let browser pages on this origin call the API (CORS), e.g. `http://localhost:3000`;
    /// repeatable; `*` allows any origin.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Put /metrics behind the API key too (needs --api-key).
    #[arg(long)]
    pub metrics_require_key: bool,
    /// Model id reported by /v1/models (default: the catalog name or file stem).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Do not keep prompts' KV blocks for later requests (automatic prefix caching is on by
    /// default: a request whose prompt starts like an earlier one computes only the rest).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// What a request that does not fit the context window gets, unless it sets
    /// `context_policy`: `error` (HTTP 400, context_length_exceeded), `truncate` (the prompt's
    /// oldest tokens after the system message or the first few are dropped) or `stream` (the
    /// window slides: attention sinks plus recent tokens).
    #[arg(long, default_value = "error")]
    pub context_policy: nucleus::engine::ContextPolicy,
    /// How the KV cache stores keys and values: `f16`, `q8_0` or `q4_0`.
    #[arg(long, default_value = "f16")]
    pub kv_type: nucleus::kv_cache::KvType,
    /// Let special-token text inside chat messages (e.g. `<|im_end|><|im_start|>system`)
    /// become control tokens, as llama.cpp does; by default message contents are plain text
    /// and only the chat template's own text can become special tokens.
    #[arg(long)]
    pub parse_special_in_messages: bool,
    /// New tokens one request may generate at most, whatever its `max_tokens` asks (a larger
    /// value is lowered to it; a request without one gets it), as llama-server's `--n-predict`
    /// caps requests: with --queue and --max-running it bounds how long a request can live,
    /// which a drain (`--drain-secs`) must cover. Default: no cap (up to the context window,
    /// or without end under the `stream` context policy).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,
    /// Prompt tokens one request may send at most: a longer prompt gets a 400
    /// (`context_length_exceeded`, naming this flag) before any work, whatever the context
    /// policy. With --max-tokens, --queue and --max-running it bounds the work a replica can
    /// hold, which a drain (`--drain-secs`) must cover. Default: the context window.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_prompt_tokens: Option<u32>,
    /// Seconds after Ctrl-C / SIGTERM during which `/health` answers 503 (so a readiness probe
    /// takes the replica out of its load balancer) while new requests are still accepted and
    /// served; the drain (`--drain-secs`) starts after it.
    #[arg(long, default_value_t = 0)]
    pub unready_secs: u64,
    /// Seconds to let in-flight requests finish once the server stops accepting (after
    /// `--unready-secs`) before cancelling them (connections still open 2 s after that are
    /// dropped, and the server exits).
    #[arg(long, default_value_t = 10)]
    pub drain_secs: u64,
    /// Publish the prefix cache's KV events (blocks stored and removed) on a ZeroMQ PUB socket
    /// bound at this endpoint (e.g. `tcp://*:5557`), in vLLM's format, for llm-d's precise
    /// prefix-cache scorer.
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events: Option<String>,
    /// Connect the KV events socket to `--kv-events` (a subscriber that binds) instead of
    /// binding it.
    #[arg(long, requires = "kv_events")]
    pub kv_events_connect: bool,
    /// The pod name in the KV events' topic `kv@POD@MODEL` (default: $POD_NAME, else the host
    /// name).
    #[arg(long, requires = "kv_events")]
    pub kv_events_pod: Option<String>,
    #[command(flatten)]
    pub speculate: SpeculateArgs,
}

pub fn serve(args: ServeArgs) -> Result<()> {
    let method = check_flags(&args)?;
    let spec = args.model.as_deref().unwrap_or(DEFAULT_MODEL);
    let path = crate::commands::resolve_model(Some(spec))?;
    // A server loads once and decodes for long: its packed weights in huge pages
    // (`NUCLEUS_HUGE_PAGES=0` declines them).
    nucleus::kernels::interleaved::huge_pages::set_default(true);
    let crate::commands::Loaded { model, tokenizer } =
        crate::commands::load_path(&path, args.threads)?;
    // Packed now, not by the first request (a one-shot command's first pass packs as it goes).
    model.finish_packing();
    let n_ctx = crate::limits::context(args.ctx, args.allow_long_context, &model)?;
    let draft = match args.speculate.load_draft(method, args.threads)? {
        Some(d) => Some(
            DraftModel::new(Arc::new(packed(d.model)), &d.tokenizer, &tokenizer)
                .map_err(anyhow::Error::msg)
                .context("cannot use the draft model")?,
        ),
        None => None,
    };
    let cfg = engine_config(&args, method, n_ctx)?;
    // The KV type against the model (and the draft), and the KV caches and scratch against
    // the memory available, before anything is allocated.
    match &draft {
        Some(d) => cfg.check_with_draft(&model, d.model()),
        None => cfg.check(&model),
    }
    .map_err(anyhow::Error::msg)?;
    let model_id = args.model_id.clone().unwrap_or_else(|| {
        if catalog::find(spec).is_some() {
            spec.to_string()
        } else {
            path.file_stem()
                .map_or(spec.to_string(), |s| s.to_string_lossy().into_owned())
        }
    });
    let threads = model.n_threads();
    let tokenizer = Arc::new(tokenizer);
    let model = Arc::new(model);
    let engine = Engine::start_with_draft(model.clone(), tokenizer.clone(), cfg.clone(), draft);
    let n_ctx = engine.config().n_ctx;
    let mut state = AppState::new(engine, tokenizer, model_id.clone(), args.api_key.clone());
    state.context_policy = args.context_policy;
    state.max_tokens_cap = args.max_tokens.map(|m| m as usize);
    state.max_prompt_tokens = args.max_prompt_tokens.map(|m| m as usize);
    state.parse_special_in_messages = args.parse_special_in_messages;
    state.max_body = args.max_body_bytes;
    state.model = Some(model);
    state.metrics_require_key = args.metrics_require_key;
    state
        .set_cors_origins(&args.cors_origins)
        .map_err(anyhow::Error::msg)?;
    // What the start line says after the address.
    let setup = format!(
        "({threads} threads, ctx {n_ctx}, {} running at most, KV {} tokens{}{}, queue {}){}",
        cfg.max_running,
        cfg.kv_tokens,
        if cfg.prefix_caching {
            ", prefix cache on"
        } else {
            ""
        },
        match (&cfg.speculation, &args.speculate.draft_model) {
            (Some(s), Some(d)) => format!(", draft speculation ({d}) up to {}", s.max_draft),
            (Some(s), None) => format!(", ngram speculation up to {}", s.max_draft),
            (None, _) => String::new(),
        },
        cfg.queue_capacity,
        if state.api_key.is_some() {
            ", API key required"
        } else {
            ""
        }
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(listen(
        args,
        Arc::new(state),
        model_id,
        cfg.block_size,
        setup,
    ))
}

/// The flags' combinations and ranges, before the model loads; the speculation asked for.
fn check_flags(args: &ServeArgs) -> Result<Option<Method>> {
    if args.metrics_require_key && args.api_key.as_deref().is_none_or(str::is_empty) {
        anyhow::bail!("--metrics-require-key needs --api-key (or NUCLEUS_API_KEY)");
    }
    let method = args.speculate.method(1)?;
    use crate::limits::{self, in_range};
    in_range("max-running", args.max_running, 1, limits::MAX_RUNNING)?;
    in_range("queue", args.queue, 0, limits::MAX_QUEUE)?;
    in_range("block-size", args.block_size, 1, limits::MAX_BLOCK_SIZE)?;
    in_range("step-tokens", args.step_tokens, 1, limits::MAX_STEP_TOKENS)?;
    in_range(
        "max-body-bytes",
        args.max_body_bytes,
        limits::MIN_BODY_BYTES,
        limits::MAX_BODY_BYTES,
    )?;
    limits::threads(args.threads)?;
    Ok(method)
}

/// The engine's configuration for a window of `n_ctx` tokens.
fn engine_config(args: &ServeArgs, method: Option<Method>, n_ctx: usize) -> Result<EngineConfig> {
    let kv_tokens = match args.kv_tokens {
        Some(k) if k < n_ctx => anyhow::bail!(
            "--kv-tokens {k} is less than the context window ({n_ctx}): a sequence could not \
             fill its window; raise --kv-tokens or lower --ctx"
        ),
        Some(k) => k,
        None => args.max_running.saturating_mul(n_ctx).clamp(n_ctx, 32768),
    };
    let cfg = EngineConfig {
        max_running: args.max_running,
        queue_capacity: args.queue,
        kv_tokens,
        block_size: args.block_size,
        step_token_budget: args.step_tokens,
        n_ctx,
        headroom_blocks: 1,
        prefix_caching: !args.no_prefix_cache,
        kv_type: args.kv_type,
        speculation: match method {
            None | Some(Method::Off) => None,
            Some(Method::Ngram | Method::Draft) => Some(SpecConfig {
                max_draft: args.speculate.draft_max,
            }),
        },
        allow_long_context: args.allow_long_context,
        kv_events: args.kv_events.is_some(),
    };
    if cfg.kv_events && !cfg.prefix_caching {
        anyhow::bail!("--kv-events needs the prefix cache (drop --no-prefix-cache)");
    }
    Ok(cfg)
}

/// Listens on the flags' address and serves until a signal, then drains.
async fn listen(
    args: ServeArgs,
    state: Arc<AppState>,
    model_id: String,
    block_size: usize,
    setup: String,
) -> Result<()> {
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    eprintln!(
        "nucleus serve: {model_id} on http://{} {setup}",
        listener.local_addr()?
    );
    if let Some(events) = kv_events_config(&args, &model_id, block_size) {
        publish_kv_events(events, &state).await?;
    }
    let stopped = nucleus_server::serve(
        listener,
        state,
        nucleus_server::shutdown_signal(),
        nucleus_server::Drain {
            unready: Duration::from_secs(args.unready_secs),
            finish: Duration::from_secs(args.drain_secs),
        },
    )
    .await
    .context("server error")?;
    if stopped.connections_dropped {
        eprintln!(
            "nucleus serve: stopped (connections still open {} s after the drain were dropped)",
            nucleus_server::CLOSE_GRACE.as_secs()
        );
    } else {
        eprintln!("nucleus serve: stopped");
    }
    Ok(())
}

/// Opens the KV events' socket and publishes the engine's events on it from a task.
async fn publish_kv_events(
    events: nucleus_server::kv_events::KvEventsConfig,
    state: &AppState,
) -> Result<()> {
    let socket = nucleus_server::kv_events::open(&events)
        .await
        .map_err(anyhow::Error::msg)?;
    if let Some(rx) = state.engine.take_kv_events() {
        eprintln!(
            "nucleus serve: KV events on {} (topic {})",
            events.endpoint, events.topic
        );
        tokio::spawn(nucleus_server::kv_events::publish(socket, events, rx));
    }
    Ok(())
}

/// Where the KV events go, with `--kv-events`.
fn kv_events_config(
    args: &ServeArgs,
    model_id: &str,
    block_size: usize,
) -> Option<nucleus_server::kv_events::KvEventsConfig> {
    let endpoint = args.kv_events.clone()?;
    let pod = args
        .kv_events_pod
        .clone()
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "nucleus".to_string());
    Some(nucleus_server::kv_events::KvEventsConfig {
        endpoint,
        connect: args.kv_events_connect,
        topic: format!("kv@{pod}@{model_id}"),
        block_size,
    })
}

/// `model` with every repacked matrix packed ([`nucleus::model::Model::finish_packing`]).
fn packed(model: nucleus::model::Model) -> nucleus::model::Model {
    model.finish_packing();
    model
}
