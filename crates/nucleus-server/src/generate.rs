//! Submitting a request's choices to the engine and relaying their events.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use axum::response::Response;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use nucleus::engine::scheduler::{Event, Finished, GenRequest, SubmitError};
use nucleus::engine::ContextPolicy;
use nucleus::sampling::FinishReason;
use nucleus::tokenizer::{TokenId, Tokenizer};

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

/// [`submit_error`], with a grammar that does not compile named by the request field that
/// carried it (`response_format`, `grammar`, ...).
pub(crate) fn request_submit_error(s: &GenSettings, e: SubmitError) -> ApiError {
    match &e {
        SubmitError::Sampling(se) => s
            .grammar_field
            .and_then(|f| crate::structured::field_error(f, se))
            .unwrap_or_else(|| submit_error(e)),
        _ => submit_error(e),
    }
}

/// The 400 for a prompt (from `param`) longer than the server's `--max-prompt-tokens`; under
/// the `error` policy, also for one that, with `max_tokens`, does not fit the context window.
pub(crate) fn check_fits(
    st: &AppState,
    n_prompt: usize,
    max_tokens: Option<usize>,
    policy: ContextPolicy,
    param: &str,
) -> Result<(), ApiError> {
    let n_ctx = st.engine.config().n_ctx;
    if let Some(most) = st.max_prompt_tokens.filter(|&most| n_prompt > most) {
        return Err(ApiError::param(
            param,
            format!(
                "the prompt is {n_prompt} tokens; this server takes prompts of at most {most} tokens (--max-prompt-tokens)"
            ),
        )
        .with_code("context_length_exceeded"));
    }
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

/// The `max_tokens` a request of `n_prompt` tokens that asked for `asked` gets under the
/// server's `--max-tokens` cap: what it asked, lowered to the cap; without `max_tokens`, the
/// cap where it fits the window (or the window slides), else the rest of the window (which
/// is then shorter than the cap).
pub(crate) fn capped_max_tokens(
    st: &AppState,
    asked: Option<usize>,
    n_prompt: usize,
    policy: ContextPolicy,
) -> Option<usize> {
    let Some(cap) = st.max_tokens_cap else {
        return asked;
    };
    match asked {
        Some(m) => Some(m.min(cap)),
        None if policy == ContextPolicy::Stream => Some(cap),
        None => (n_prompt + cap <= st.engine.config().n_ctx).then_some(cap),
    }
}

/// Checks that `prompt` fits the window under the request's policy; the policy.
pub(crate) fn check_fit(
    st: &AppState,
    prompt: &Prompt,
    s: &GenSettings,
) -> Result<ContextPolicy, ApiError> {
    if st.draining.load(Ordering::SeqCst) {
        return Err(submit_error(SubmitError::ShuttingDown));
    }
    let policy = s.context_policy.unwrap_or(st.context_policy);
    let n = prompt.tokens.len();
    let max_tokens = capped_max_tokens(st, s.max_tokens, n, policy);
    check_fits(st, n, max_tokens, policy, prompt.param)?;
    Ok(policy)
}

/// Submits the request's `best_of` choices (sampled, not beams) and merges their events,
/// each tagged with its choice's index.
pub(crate) fn submit(
    st: &Arc<AppState>,
    prompt: &Prompt,
    s: &GenSettings,
    policy: ContextPolicy,
    t0: Instant,
) -> Result<UnboundedReceiver<(usize, Event)>, ApiError> {
    // `best_of` ranks the choices by their logprobs: have them computed.
    let mut sampling = s.sampling.clone();
    if s.best_of > s.n && sampling.logprobs.is_none() {
        sampling.logprobs = Some(0);
    }
    let max_tokens = capped_max_tokens(st, s.max_tokens, prompt.tokens.len(), policy);
    let mut rxs = Vec::with_capacity(s.best_of);
    for i in 0..s.best_of {
        // Each choice draws from its own stream of the seed (independent of every other
        // request's and choice's).
        let req = GenRequest {
            prompt_tokens: prompt.tokens.clone(),
            sampling: sampling.for_choice(i),
            stop: s.stop.clone(),
            max_tokens,
            ignore_eos: s.ignore_eos,
            context_policy: policy,
            keep_tokens: prompt.keep,
            explain: s.explain,
        };
        // On failure the receivers already made are dropped, which cancels them.
        let rx = st
            .engine
            .submit(req)
            .map_err(|e| request_submit_error(s, e))?;
        rxs.push(rx);
    }
    let (mtx, mrx) = unbounded_channel();
    for (i, rx) in rxs.into_iter().enumerate() {
        tokio::spawn(relay(i, rx, mtx.clone(), st.clone(), t0));
    }
    Ok(mrx)
}

pub(crate) async fn generate(
    st: Arc<AppState>,
    ep: Endpoint,
    prompt: Prompt,
    s: GenSettings,
    t0: Instant,
) -> Result<Response, ApiError> {
    let policy = check_fit(&st, &prompt, &s)?;
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
        reasoning: s.reasoning,
    };
    if let Some(beams) = s.beams {
        return crate::beams::beam_response(st, shape, prompt, &s, beams).await;
    }
    let mrx = submit(&st, &prompt, &s, policy, t0)?;
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

/// What one choice's events told so far (for the routes that answer one choice).
#[derive(Default, Debug)]
pub(crate) struct Tally {
    /// Token events seen (an ending EOS token has none).
    pub tokens: usize,
    pub last_token: Option<TokenId>,
}

impl Tally {
    pub fn saw(&mut self, t: &nucleus::engine::scheduler::TokenEvent) {
        self.tokens += 1;
        self.last_token = Some(t.token);
    }

    /// The stop string of `stops` that ended the output, if one did: the output ended by
    /// `Stop` without an end-of-generation token (which counts in `completion_tokens` but
    /// sends no token event), and the last token's text holds the end of that stop string.
    pub fn stop_string(&self, tok: &Tokenizer, f: &Finished, stops: &[String]) -> Option<String> {
        if f.finish_reason != FinishReason::Stop || f.completion_tokens > self.tokens {
            return None;
        }
        let piece = String::from_utf8_lossy(tok.piece(self.last_token?, false)).into_owned();
        // The stop string whose longest tail appears in the last token's text.
        let overlap = |s: &str| {
            (1..=s.len())
                .rev()
                .find(|&k| s.is_char_boundary(s.len() - k) && piece.contains(&s[s.len() - k..]))
                .unwrap_or(0)
        };
        stops
            .iter()
            .map(|s| (overlap(s), s))
            .filter(|(k, _)| *k > 0)
            .max_by_key(|(k, _)| *k)
            .map(|(_, s)| s.clone())
    }
}

/// One choice's whole output.
pub(crate) struct Single {
    pub text: String,
    pub done: Finished,
    pub tally: Tally,
}

/// Waits for the one choice of `rx`.
pub(crate) async fn collect_single(
    st: &AppState,
    mut rx: UnboundedReceiver<(usize, Event)>,
) -> Result<Single, ApiError> {
    let mut text = String::new();
    let mut tally = Tally::default();
    while let Some((_, ev)) = rx.recv().await {
        match ev {
            Event::Token(t) => {
                tally.saw(&t);
                text.push_str(&t.text);
            }
            Event::Done(f) => {
                text.push_str(&f.text);
                return Ok(Single {
                    text,
                    done: f,
                    tally,
                });
            }
            Event::Error(e) => return Err(event_error(st, e)),
        }
    }
    Err(event_error(st, "the engine stopped".into()))
}

/// The error of a failed sequence.
pub(crate) fn event_error(st: &AppState, e: String) -> ApiError {
    let status = if st.engine.is_shut_down() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    ApiError::new(status, "server_error", e)
}
