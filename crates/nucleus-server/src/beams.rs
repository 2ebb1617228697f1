//! Beam search over HTTP: `use_beam_search` (vLLM's extension, as it had it), with `best_of`
//! beams (default `n`) and `length_penalty`; the `n` best hypotheses are the choices, best
//! first.
//!
//! The search runs outside the continuous batcher, one request at a time, on a blocking thread
//! with a KV cache of its own (its beams share the prompt's blocks; see
//! [`nucleus::engine::Session::beam_choices`]); it shares the model's thread pool with the
//! scheduler. Its choices arrive when the search ends: a streamed response gets each choice's
//! text in one chunk then. Without `max_tokens`, a hypothesis has at most
//! [`DEFAULT_MAX_TOKENS`] tokens; the cache it needs must fit in the server's KV budget
//! (`kv_tokens`). Stop strings cut a hypothesis's text; they do not steer the search.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use tokio::sync::mpsc::unbounded_channel;

use nucleus::engine::context::truncate_to_window;
use nucleus::engine::scheduler::{Event, Finished, TokenEvent};
use nucleus::engine::{ContextPolicy, GenerateRequest, Session};
use nucleus::sampling::SamplingParams;

use crate::api::{BeamSettings, GenSettings};
use crate::prompt::Prompt;
use crate::respond::{collect_response, stream_response, Shape};
use crate::{ApiError, AppState};

/// A hypothesis's tokens at most when the request gives no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: usize = 256;

pub(crate) async fn beam_response(
    st: Arc<AppState>,
    shape: Shape,
    prompt: Prompt,
    s: &GenSettings,
    beams: BeamSettings,
) -> Result<Response, ApiError> {
    let model = st.model.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "invalid_request_error",
            "this server was started without beam search",
        )
    })?;
    let plan = BeamPlan::new(&st, &shape, prompt, s, &beams)?;
    let req = GenerateRequest {
        sampling: SamplingParams::greedy(),
        stop: s.stop.clone(),
        max_tokens: plan.max_tokens,
        ignore_eos: s.ignore_eos,
        beams: beams.width,
        length_penalty: beams.length_penalty,
        ..GenerateRequest::default()
    };
    let n = shape.n;
    let (tx, rx) = unbounded_channel();
    let state = st.clone();
    tokio::spawn(async move {
        // One search at a time: each takes the whole thread pool for its forwards anyway.
        let _one = state.beam_lock.lock().await;
        let tok = state.tokenizer.clone();
        let BeamPlan {
            tokens,
            dropped,
            ctx,
            kv_tokens,
            ..
        } = plan;
        let n_prompt = tokens.len();
        let found = tokio::task::spawn_blocking(move || {
            // An error (not enough memory for the beams' cache) rather than a panic.
            let mut session =
                Session::with_kv_type(&model, ctx, kv_tokens, nucleus::kv_cache::KvType::F16)
                    .map_err(|e| e.to_string())?;
            session
                .beam_choices(&tok, &tokens, &req, n)
                .map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        match found {
            Ok(choices) => send_choices(&tx, choices, n_prompt, dropped),
            Err(e) => {
                let _ = tx.send((0, Event::Error(format!("beam search failed: {e}"))));
            }
        }
    });
    if s.stream {
        Ok(stream_response(st, shape, rx))
    } else {
        collect_response(st, shape, n, rx).await
    }
}

/// What a beam search will hold: its prompt (cut to the window with `truncate`), its tokens,
/// its window and the KV cache its beams need, checked against the server's.
struct BeamPlan {
    tokens: Vec<nucleus::tokenizer::TokenId>,
    dropped: usize,
    max_tokens: usize,
    ctx: usize,
    kv_tokens: usize,
}

impl BeamPlan {
    fn new(
        st: &AppState,
        shape: &Shape,
        prompt: Prompt,
        s: &GenSettings,
        beams: &BeamSettings,
    ) -> Result<BeamPlan, ApiError> {
        let n_ctx = st.engine.config().n_ctx;
        let asked = s
            .max_tokens
            .unwrap_or(DEFAULT_MAX_TOKENS)
            .min(st.max_tokens_cap.unwrap_or(usize::MAX));
        let (tokens, dropped) = match shape.policy {
            ContextPolicy::Truncate => {
                truncate_to_window(&prompt.tokens, prompt.keep, n_ctx, asked)
            }
            _ => (prompt.tokens, 0),
        };
        let room = n_ctx.saturating_sub(tokens.len());
        if room == 0 {
            return Err(ApiError::param(
                prompt.param,
                format!(
                    "the prompt is {} tokens; the context window is {n_ctx}",
                    tokens.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
        let max_tokens = asked.min(room);
        let ctx = tokens.len() + max_tokens;
        let kv_tokens = Session::kv_tokens_for_beams(ctx, beams.width, max_tokens);
        let budget = st.engine.config().kv_tokens;
        if kv_tokens > budget {
            return Err(ApiError::param(
                "max_tokens",
                format!(
                    "beam search of {} beams of {max_tokens} tokens after a {}-token prompt needs a KV cache of {kv_tokens} tokens; this server's holds {budget}: ask for fewer beams or tokens",
                    beams.width,
                    tokens.len()
                ),
            ));
        }
        Ok(BeamPlan {
            tokens,
            dropped,
            max_tokens,
            ctx,
            kv_tokens,
        })
    }
}

/// Each finished hypothesis as one token event and its end, on its choice index.
fn send_choices(
    tx: &tokio::sync::mpsc::UnboundedSender<(usize, Event)>,
    choices: Vec<nucleus::engine::BeamChoice>,
    n_prompt: usize,
    dropped: usize,
) {
    for (i, c) in choices.into_iter().enumerate() {
        let token = TokenEvent {
            token: c.tokens.last().copied().unwrap_or(0),
            text: c.text,
            logprob: None,
            top_logprobs: Vec::new(),
            explain: None,
        };
        let done = Finished {
            text: String::new(),
            finish_reason: c.finish_reason,
            prompt_tokens: n_prompt,
            completion_tokens: c.tokens.len(),
            preemptions: 0,
            cached_tokens: 0,
            dropped_tokens: dropped,
            speculation: Default::default(),
        };
        let _ = tx.send((i, Event::Token(token)));
        let _ = tx.send((i, Event::Done(done)));
    }
}
