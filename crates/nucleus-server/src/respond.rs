//! The OpenAI response bodies: a whole response, or SSE chunks as tokens arrive; usage,
//! logprobs in each endpoint's format.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc::{Sender, UnboundedReceiver};

use nucleus::engine::scheduler::{Event, Finished, TokenEvent};
use nucleus::engine::ContextPolicy;
use nucleus::sampling::{Explain, FinishReason};
use nucleus::tokenizer::{TokenId, Tokenizer};

use crate::api::Endpoint;
use crate::tools::ToolStream;
use crate::{unix_now, ApiError, AppState};

pub(crate) fn token_string(tok: &Tokenizer, id: TokenId) -> (String, Vec<u8>) {
    let bytes = tok.piece(id, false).to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Logprobs of one token in the endpoint's format (chat: one `content` entry; completions:
/// `(token, logprob, {token: logprob})`).
pub(crate) fn chat_logprob(tok: &Tokenizer, id: TokenId, lp: f32, top: &[(TokenId, f32)]) -> Value {
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
pub(crate) struct CompletionLogprobs {
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

/// What a response looks like, whatever produced its events.
#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub ep: Endpoint,
    pub id: String,
    /// Choices returned.
    pub n: usize,
    pub policy: ContextPolicy,
    pub want_logprobs: bool,
    pub want_explain: bool,
    pub include_usage: bool,
    /// Chat with tools (their names): the output's calls become `tool_calls`.
    pub tools: Option<Vec<String>>,
    /// Chat splitting a thinking block into `reasoning_content` (`Some(opened)`: see
    /// [`crate::api::GenSettings::reasoning`]).
    pub reasoning: Option<bool>,
}

/// One token's [`Explain`] record: the candidates left after each stage of the sampler chain,
/// the entropy (nats) of the distribution it was drawn from and its probability there.
pub(crate) fn explain_json(tok: &Tokenizer, id: TokenId, ex: &Explain) -> Value {
    let stages: Vec<Value> = ex
        .stages
        .iter()
        .map(|(stage, n)| json!({"stage": stage.name(), "candidates": n}))
        .collect();
    json!({
        "token": token_string(tok, id).0,
        "id": id,
        "chosen_prob": ex.chosen_prob,
        "entropy": ex.entropy.abs(), // never -0
        "stages": stages,
    })
}

#[derive(Default)]
pub(crate) struct Choice {
    text: String,
    finish: Option<FinishReason>,
    completion_tokens: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
    dropped_tokens: usize,
    chat_lp: Vec<Value>,
    cmpl_lp: CompletionLogprobs,
    explain: Vec<Value>,
    /// Sum and count of the tokens' logprobs (for `best_of`).
    sum_logprob: f64,
    n_logprobs: usize,
    error: Option<String>,
}

impl Choice {
    /// Mean logprob per token: how `best_of` ranks the choices (OpenAI's rule).
    fn mean_logprob(&self) -> f64 {
        if self.n_logprobs == 0 {
            f64::NEG_INFINITY
        } else {
            self.sum_logprob / self.n_logprobs as f64
        }
    }

    /// Adds one of this choice's events.
    fn take(&mut self, ev: Event, st: &AppState, shape: &Shape) {
        match ev {
            Event::Token(t) => {
                if let Some(lp) = t.logprob {
                    self.sum_logprob += f64::from(lp);
                    self.n_logprobs += 1;
                }
                if let Some(lp) = t.logprob.filter(|_| shape.want_logprobs) {
                    let (tok, top) = (&st.tokenizer, &t.top_logprobs);
                    match shape.ep {
                        Endpoint::Chat => self.chat_lp.push(chat_logprob(tok, t.token, lp, top)),
                        Endpoint::Completions => {
                            self.cmpl_lp.push(tok, t.token, lp, top, self.text.len())
                        }
                    }
                }
                if let Some(ex) = t.explain.as_ref().filter(|_| shape.want_explain) {
                    self.explain.push(explain_json(&st.tokenizer, t.token, ex));
                }
                self.text.push_str(&t.text);
            }
            Event::Done(f) => {
                self.text.push_str(&f.text);
                self.finish = Some(f.finish_reason);
                self.completion_tokens = f.completion_tokens;
                self.prompt_tokens = f.prompt_tokens;
                self.cached_tokens = f.cached_tokens;
                self.dropped_tokens = f.dropped_tokens;
            }
            Event::Error(e) => self.error = Some(e),
        }
    }

    /// The choice as the response lists it, at `index`.
    fn to_json(&self, index: usize, shape: &Shape, new_id: &mut dyn FnMut() -> String) -> Value {
        let finish = self.finish.map(FinishReason::as_str);
        let mut v = match shape.ep {
            Endpoint::Chat => {
                let (message, reason) = if shape.tools.is_some() || shape.reasoning.is_some() {
                    let (m, calls) = crate::tools::message_with(
                        &self.text,
                        shape.reasoning,
                        shape.tools.as_deref(),
                        new_id,
                    );
                    (m, tool_finish(self.finish, calls))
                } else {
                    (json!({"role": "assistant", "content": self.text}), finish)
                };
                let logprobs = if shape.want_logprobs {
                    json!({"content": self.chat_lp})
                } else {
                    Value::Null
                };
                json!({
                    "index": index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": reason,
                })
            }
            Endpoint::Completions => json!({
                "index": index,
                "text": self.text,
                "logprobs": if shape.want_logprobs { self.cmpl_lp.to_json() } else { Value::Null },
                "finish_reason": finish,
            }),
        };
        if shape.want_explain {
            v["explain"] = json!(self.explain);
        }
        v
    }
}

/// OpenAI's usage object; `cached` is the prompt tokens taken from the prefix cache (for
/// `n > 1`, the fewest of any choice: the prompt is counted once).
pub(crate) fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// Waits for every choice's events (`sampled` of them, ids `0..sampled`) and answers with the
/// `shape.n` best of them (all when `sampled == n`; else by mean logprob per token, which the
/// events then carry).
pub(crate) async fn collect_response(
    st: Arc<AppState>,
    shape: Shape,
    sampled: usize,
    mut rx: UnboundedReceiver<(usize, Event)>,
) -> Result<Response, ApiError> {
    let mut choices: Vec<Choice> = (0..sampled).map(|_| Choice::default()).collect();
    while let Some((i, ev)) = rx.recv().await {
        choices[i].take(ev, &st, &shape);
    }
    if let Some(e) = choices.iter().find_map(|c| c.error.clone()) {
        return Err(crate::generate::event_error(&st, e));
    }
    // Usage counts every sampled choice.
    let completion: usize = choices.iter().map(|c| c.completion_tokens).sum();
    let cached = choices.iter().map(|c| c.cached_tokens).min().unwrap_or(0);
    // Every choice has the same prompt (truncated alike).
    let n_prompt = choices.iter().map(|c| c.prompt_tokens).min().unwrap_or(0);
    let dropped = choices.iter().map(|c| c.dropped_tokens).max();
    if sampled > shape.n {
        // Stable: ties keep the sampling order.
        choices.sort_by(|a, b| b.mean_logprob().total_cmp(&a.mean_logprob()));
        choices.truncate(shape.n);
    }
    let mut new_id = || st.new_id("call");
    let out: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| c.to_json(i, &shape, &mut new_id))
        .collect();
    let Shape { ep, id, policy, .. } = shape;
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
        body["dropped_tokens"] = json!(dropped);
    }
    Ok(Json(body).into_response())
}

/// OpenAI's `tool_calls` finish reason when the output ended (not by length) with calls.
fn tool_finish(f: Option<FinishReason>, calls: usize) -> Option<&'static str> {
    match f {
        Some(FinishReason::Stop) if calls > 0 => Some("tool_calls"),
        other => other.map(FinishReason::as_str),
    }
}

pub(crate) fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// A server-sent event named by the value's `type` (Anthropic's and Responses' streams).
pub(crate) fn typed_sse(v: &Value) -> Bytes {
    let kind = v["type"].as_str().unwrap_or("message");
    Bytes::from(format!("event: {kind}\ndata: {v}\n\n"))
}

/// A `text/event-stream` response and the sender of its bytes; the stream ends when the
/// sender is dropped.
pub(crate) fn event_stream() -> (Sender<Result<Bytes, Infallible>>, Response) {
    let (btx, brx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    let resp = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(brx),
        ))
        .expect("valid response");
    (btx, resp)
}

/// The end of an OpenAI stream.
const DONE: &[u8] = b"data: [DONE]\n\n";

/// The fields every chunk of a stream carries.
struct Chunks {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    include_usage: bool,
}

impl Chunks {
    fn new(st: &AppState, shape: Shape) -> Chunks {
        Chunks {
            id: shape.id,
            object: match shape.ep {
                Endpoint::Chat => "chat.completion.chunk",
                Endpoint::Completions => "text_completion",
            },
            created: unix_now(),
            model: st.model_id.clone(),
            include_usage: shape.include_usage,
        }
    }

    /// A chunk of `choice` (of none when it is null), with `usage` on the last one.
    fn chunk(&self, choice: Value, usage: Option<Value>) -> Bytes {
        let mut v = json!({
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "nucleus",
            "choices": if choice.is_null() { json!([]) } else { json!([choice]) },
        });
        // With `include_usage`, OpenAI's chunks carry `usage: null` until the last.
        if let Some(u) = usage {
            v["usage"] = u;
        } else if self.include_usage {
            v["usage"] = Value::Null;
        }
        sse(&v)
    }
}

/// The streamed choices: what their next chunks need, and the totals for `usage`.
struct StreamedChoices {
    ep: Endpoint,
    policy: ContextPolicy,
    want_logprobs: bool,
    want_explain: bool,
    /// Per choice: its text's length so far (completions' `text_offset`).
    offsets: Vec<usize>,
    /// Per choice, with tools or a thinking block: the parser of its text into deltas.
    parsers: Vec<Option<ToolStream>>,
    completion: usize,
    cached: usize,
    n_prompt: usize,
}

impl StreamedChoices {
    fn new(st: &Arc<AppState>, shape: &Shape) -> StreamedChoices {
        let parsers = (0..shape.n)
            .map(|_| {
                (shape.tools.is_some() || shape.reasoning.is_some()).then(|| {
                    let st = st.clone();
                    ToolStream::with(
                        shape.reasoning,
                        shape.tools.clone(),
                        Box::new(move || st.new_id("call")),
                    )
                })
            })
            .collect();
        StreamedChoices {
            ep: shape.ep,
            policy: shape.policy,
            want_logprobs: shape.want_logprobs,
            want_explain: shape.want_explain,
            offsets: vec![0; shape.n],
            parsers,
            completion: 0,
            cached: usize::MAX,
            n_prompt: usize::MAX,
        }
    }

    /// A token's choice objects: none for an empty token without logprobs or explain; with a
    /// parser, one per delta (the first with the token's logprobs and explain).
    fn token(&mut self, tok: &Tokenizer, i: usize, t: &TokenEvent) -> Vec<Value> {
        let lp = t.logprob.filter(|_| self.want_logprobs);
        let ex = t.explain.as_ref().filter(|_| self.want_explain);
        if t.text.is_empty() && lp.is_none() && ex.is_none() {
            return Vec::new();
        }
        let logprobs = match (lp, self.ep) {
            (None, _) => Value::Null,
            (Some(l), Endpoint::Chat) => {
                json!({"content": [chat_logprob(tok, t.token, l, &t.top_logprobs)]})
            }
            (Some(l), Endpoint::Completions) => {
                let mut c = CompletionLogprobs::default();
                c.push(tok, t.token, l, &t.top_logprobs, self.offsets[i]);
                c.to_json()
            }
        };
        self.offsets[i] += t.text.len();
        let explain = ex.map(|ex| json!([explain_json(tok, t.token, ex)]));
        if let Some(parser) = self.parsers[i].as_mut() {
            let mut deltas = parser.push(&t.text);
            if deltas.is_empty() && (lp.is_some() || ex.is_some()) {
                deltas.push(json!({}));
            }
            let mut out = Vec::with_capacity(deltas.len());
            for (k, delta) in deltas.into_iter().enumerate() {
                let lp = if k == 0 {
                    logprobs.clone()
                } else {
                    Value::Null
                };
                let mut choice = json!({"index": i, "delta": delta, "logprobs": lp, "finish_reason": Value::Null});
                if let (Some(ex), 0) = (&explain, k) {
                    choice["explain"] = ex.clone();
                }
                out.push(choice);
            }
            return out;
        }
        let mut choice = match self.ep {
            Endpoint::Chat => {
                json!({"index": i, "delta": {"content": t.text}, "logprobs": logprobs, "finish_reason": Value::Null})
            }
            Endpoint::Completions => {
                json!({"index": i, "text": t.text, "logprobs": logprobs, "finish_reason": Value::Null})
            }
        };
        if let Some(ex) = explain {
            choice["explain"] = ex;
        }
        vec![choice]
    }

    /// A choice's last objects: its parser's remaining deltas, then its finish reason (and
    /// `dropped_tokens` under a policy other than `error`).
    fn done(&mut self, i: usize, f: Finished) -> Vec<Value> {
        self.completion += f.completion_tokens;
        self.cached = self.cached.min(f.cached_tokens);
        self.n_prompt = self.n_prompt.min(f.prompt_tokens);
        let mut out = Vec::new();
        let mut reason = f.finish_reason.as_str();
        let mut text = f.text;
        if let Some(parser) = self.parsers[i].as_mut() {
            let mut deltas = parser.push(&text);
            deltas.extend(parser.finish());
            for delta in deltas {
                out.push(json!({"index": i, "delta": delta, "logprobs": Value::Null, "finish_reason": Value::Null}));
            }
            reason = tool_finish(Some(f.finish_reason), parser.calls()).unwrap_or(reason);
            text = String::new();
        }
        let mut choice = match self.ep {
            Endpoint::Chat => {
                let delta = if text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": i, "delta": delta, "logprobs": Value::Null, "finish_reason": reason})
            }
            Endpoint::Completions => {
                json!({"index": i, "text": text, "logprobs": Value::Null, "finish_reason": reason})
            }
        };
        if self.policy != ContextPolicy::Error {
            choice["dropped_tokens"] = json!(f.dropped_tokens);
        }
        out.push(choice);
        out
    }

    /// The stream's `usage`: prompt tokens and cached ones counted once, completion tokens
    /// summed over the choices.
    fn usage(&self) -> Value {
        usage(
            self.n_prompt,
            self.completion,
            self.cached.min(self.n_prompt),
        )
    }
}

/// Streams each choice's events as SSE chunks (`shape.n` choices, ids `0..n`).
pub(crate) fn stream_response(
    st: Arc<AppState>,
    shape: Shape,
    mut rx: UnboundedReceiver<(usize, Event)>,
) -> Response {
    let (ep, n) = (shape.ep, shape.n);
    let mut choices = StreamedChoices::new(&st, &shape);
    let chunks = Chunks::new(&st, shape);
    let (btx, resp) = event_stream();
    tokio::spawn(async move {
        if ep == Endpoint::Chat {
            for i in 0..n {
                let c = chunks.chunk(
                    json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": Value::Null, "finish_reason": Value::Null}),
                    None,
                );
                if btx.send(Ok(c)).await.is_err() {
                    return;
                }
            }
        }
        while let Some((i, ev)) = rx.recv().await {
            let out = match ev {
                Event::Token(t) => choices.token(&st.tokenizer, i, &t),
                Event::Done(f) => choices.done(i, f),
                Event::Error(e) => {
                    let err = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e);
                    let _ = btx.send(Ok(sse(&err.body()))).await;
                    let _ = btx.send(Ok(Bytes::from_static(DONE))).await;
                    return;
                }
            };
            for choice in out {
                if btx.send(Ok(chunks.chunk(choice, None))).await.is_err() {
                    return;
                }
            }
        }
        if chunks.include_usage {
            let _ = btx
                .send(Ok(chunks.chunk(Value::Null, Some(choices.usage()))))
                .await;
        }
        let _ = btx.send(Ok(Bytes::from_static(DONE))).await;
    });
    resp
}
