//! Submitting a request's choices to the engine and relaying their events.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use axum::response::Response;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use nucleus::engine::scheduler::{Event, GenRequest, SubmitError};
use nucleus::engine::ContextPolicy;

use crate::api::{Endpoint, GenSettings};
use crate::prompt::Prompt;
use crate::respond::{collect_response, stream_response, Shape};
use crate::{ApiError, AppState};

pub(crate) fn submit_error(e: SubmitError) -> ApiError {
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

/// Under the `error` policy: the 400 for a prompt (from `param`) that, with `max_tokens`, does
/// not fit the context window.
pub(crate) fn check_fits(
    st: &AppState,
    n_prompt: usize,
    max_tokens: Option<usize>,
    policy: ContextPolicy,
    param: &str,
) -> Result<(), ApiError> {
    let n_ctx = st.engine.config().n_ctx;
    if policy != ContextPolicy::Error {
        return Ok(());
    }
    if n_prompt >= n_ctx {
        return Err(ApiError::param(
            param,
            format!("the prompt is {n_prompt} tokens; the context window is {n_ctx}"),
        )
        .with_code("context_length_exceeded"));
    }
    if let Some(m) = max_tokens.filter(|&m| n_prompt + m > n_ctx) {
        return Err(ApiError::param(
            "max_tokens",
            format!(
                "the prompt ({n_prompt} tokens) plus max_tokens ({m}) exceeds the context window of {n_ctx} tokens"
            ),
        )
        .with_code("context_length_exceeded"));
    }
    Ok(())
}

pub(crate) async fn generate(
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
    let policy = s.context_policy.unwrap_or(st.context_policy);
    check_fits(&st, prompt.len(), s.max_tokens, policy, prompt_param)?;
    let id = st.new_id(match ep {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    });
    let shape = Shape {
        ep,
        id,
        n: s.n,
        policy,
        want_logprobs: s.sampling.logprobs.is_some(),
        want_explain: s.explain,
        include_usage: s.include_usage,
        tools: s.tools.as_ref().map(|t| t.names.clone()),
    };
    if let Some(beams) = s.beams {
        let prompt = Prompt {
            tokens: prompt,
            keep,
            param: prompt_param,
        };
        return crate::beams::beam_response(st, shape, prompt, &s, beams).await;
    }
    // `best_of` ranks the choices by their logprobs: have them computed.
    let mut sampling = s.sampling.clone();
    if s.best_of > s.n && sampling.logprobs.is_none() {
        sampling.logprobs = Some(0);
    }
    let mut rxs = Vec::with_capacity(s.best_of);
    for i in 0..s.best_of {
        // Each choice draws from its own stream of the seed (independent of every other
        // request's and choice's).
        let req = GenRequest {
            prompt_tokens: prompt.clone(),
            sampling: sampling.for_choice(i),
            stop: s.stop.clone(),
            max_tokens: s.max_tokens,
            ignore_eos: s.ignore_eos,
            context_policy: policy,
            keep_tokens: keep,
            explain: s.explain,
        };
        // On failure the receivers already made are dropped, which cancels them.
        let rx = st.engine.submit(req).map_err(|e| match &e {
            SubmitError::Sampling(se) => s
                .grammar_field
                .and_then(|f| crate::structured::field_error(f, se))
                .unwrap_or_else(|| submit_error(e)),
            _ => submit_error(e),
        })?;
        rxs.push(rx);
    }
    let (mtx, mrx) = unbounded_channel();
    for (i, rx) in rxs.into_iter().enumerate() {
        tokio::spawn(relay(i, rx, mtx.clone(), st.clone(), t0));
    }
    drop(mtx);
    if s.stream {
        Ok(stream_response(st, shape, mrx))
    } else {
        collect_response(st, shape, s.best_of, mrx).await
    }
}

/// Moves one choice's events to the merged channel, timing them; stops when the merged channel
/// is gone (the client left), which drops the engine receiver and so cancels the sequence.
pub(crate) async fn relay(
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
