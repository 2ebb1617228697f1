//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API over the
//! chat machinery. The request is translated into a chat completions request
//! ([`super::messages_input`]); the answer is split into thinking, text and `tool_use` blocks
//! ([`crate::output`]) and sent as Anthropic's message, or as its event stream:
//! `message_start`, `ping`, per block `content_block_start` / `content_block_delta`
//! (`thinking_delta`, `text_delta`, `input_json_delta`) / `content_block_stop`, then
//! `message_delta` (stop reason, usage) and `message_stop`. Errors have Anthropic's shape.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use nucleus::engine::scheduler::{Event, Finished};
use nucleus::sampling::FinishReason;

use super::messages_input::MessagesRequest;
use crate::api;
use crate::generate::{check_fit, collect_single, submit, Tally};
use crate::output::{OutputParser, Piece};
use crate::prompt::{chat_prompt, Prompt};
use crate::respond::typed_sse;
use crate::routes::{body_bytes, chat_request};
use crate::{ApiError, AppState};

/// Anthropic's error type for an HTTP status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}`; the message names the parameter.
pub(crate) fn error_body(e: &ApiError) -> Value {
    let message = match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": error_type(e.status), "message": message}})
}

pub(crate) fn error_response(e: ApiError) -> Response {
    (e.status, Json(error_body(&e))).into_response()
}

fn finish(st: &AppState, r: Result<Response, ApiError>) -> Response {
    let resp = r.unwrap_or_else(error_response);
    st.metrics.count_status(resp.status().as_u16());
    resp
}

/// What the answer's formatting needs to know.
struct Ctx {
    id: String,
    reasoning: Option<bool>,
    tools: Option<Vec<String>>,
    stops: Vec<String>,
    prompt_tokens: usize,
}

/// The request, validated, its prompt and settings.
fn prepare(st: &AppState, body: &[u8]) -> Result<(Prompt, api::GenSettings, Ctx), ApiError> {
    let req: MessagesRequest = api::parse_json(body)?;
    let reasons = crate::reasoning::model_reasons(st.template.as_ref());
    let chat = req.to_chat(true, reasons)?;
    let (prompt, settings) = chat_request(st, &chat)?;
    let ctx = Ctx {
        id: st.new_id("msg"),
        reasoning: settings.reasoning,
        tools: settings.tools.as_ref().map(|t| t.names.clone()),
        stops: req.stop_sequences.clone().unwrap_or_default(),
        prompt_tokens: prompt.tokens.len(),
    };
    Ok((prompt, settings, ctx))
}

pub(crate) async fn messages(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let t0 = Instant::now();
    let r: Result<Response, ApiError> = async {
        let body = body_bytes(body, st.max_body)?;
        let (prompt, settings, ctx) = prepare(&st, &body)?;
        let policy = check_fit(&st, &prompt, &settings)?;
        let rx = submit(&st, &prompt, &settings, policy, t0)?;
        if settings.stream {
            return Ok(stream(st.clone(), ctx, rx));
        }
        let one = collect_single(&st, rx).await?;
        Ok(Json(whole(&st, &ctx, &one.text, &one.done, &one.tally)).into_response())
    }
    .await;
    finish(&st, r)
}

pub(crate) async fn count_tokens(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r: Result<Response, ApiError> = async {
        let body = body_bytes(body, st.max_body)?;
        let req: MessagesRequest = api::parse_json(&body)?;
        let reasons = crate::reasoning::model_reasons(st.template.as_ref());
        let chat = req.to_chat(false, reasons)?;
        let tools = crate::tools::tool_settings(&chat)?;
        let r = crate::reasoning::settings(&chat, st.template.as_ref())?;
        let (prompt, _) = chat_prompt(&st, &chat, tools.as_ref(), r.kwargs.as_ref())?;
        Ok(Json(json!({"input_tokens": prompt.tokens.len()})).into_response())
    }
    .await;
    finish(&st, r)
}

/// Anthropic's `stop_reason` and `stop_sequence`.
fn stop_reason(
    st: &AppState,
    ctx: &Ctx,
    f: &Finished,
    tally: &Tally,
    calls: usize,
) -> (&'static str, Value) {
    if f.finish_reason == FinishReason::Length {
        return ("max_tokens", Value::Null);
    }
    if calls > 0 {
        return ("tool_use", Value::Null);
    }
    match tally.stop_string(&st.tokenizer, f, &ctx.stops) {
        Some(s) => ("stop_sequence", json!(s)),
        None => ("end_turn", Value::Null),
    }
}

fn usage(ctx: &Ctx, f: &Finished) -> Value {
    json!({
        "input_tokens": ctx.prompt_tokens,
        "output_tokens": f.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": f.cached_tokens,
    })
}

/// A call's arguments as the `input` object (`{}` for text that is not JSON).
fn input_of(args: &str) -> Value {
    serde_json::from_str(args).unwrap_or_else(|_| json!({}))
}

/// The whole message.
fn whole(st: &AppState, ctx: &Ctx, text: &str, f: &Finished, tally: &Tally) -> Value {
    let a = OutputParser::new(ctx.reasoning, ctx.tools.clone()).whole(text);
    let mut content = Vec::new();
    if let Some(r) = &a.reasoning {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    let body = a.body();
    if !body.is_empty() || (a.calls.is_empty() && content.is_empty()) {
        content.push(json!({"type": "text", "text": body}));
    }
    for (name, args) in &a.calls {
        content.push(json!({"type": "tool_use", "id": st.new_id("toolu"), "name": name, "input": input_of(args)}));
    }
    let (reason, seq) = stop_reason(st, ctx, f, tally, a.calls.len());
    json!({
        "id": ctx.id,
        "type": "message",
        "role": "assistant",
        "model": st.model_id,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(ctx, f),
    })
}

/// The open content block: its index and kind.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    Tool,
}

/// Turns pieces into block events, opening and closing blocks as the kind changes.
struct Blocks {
    open: Option<(usize, Block)>,
    next: usize,
}

impl Blocks {
    fn close(&mut self, out: &mut Vec<Value>) {
        if let Some((i, _)) = self.open.take() {
            out.push(json!({"type": "content_block_stop", "index": i}));
        }
    }

    fn start(&mut self, kind: Block, block: Value, out: &mut Vec<Value>) -> usize {
        self.close(out);
        let i = self.next;
        self.next += 1;
        self.open = Some((i, kind));
        out.push(json!({"type": "content_block_start", "index": i, "content_block": block}));
        i
    }

    fn events(&mut self, st: &AppState, pieces: Vec<Piece>) -> Vec<Value> {
        let mut out = Vec::new();
        for p in pieces {
            let (kind, delta) = match p {
                Piece::Reasoning(r) => (
                    Block::Thinking,
                    json!({"type": "thinking_delta", "thinking": r}),
                ),
                Piece::Text(t) => (Block::Text, json!({"type": "text_delta", "text": t})),
                Piece::CallStart { name, .. } => {
                    let block = json!({"type": "tool_use", "id": st.new_id("toolu"), "name": name, "input": {}});
                    self.start(Block::Tool, block, &mut out);
                    continue;
                }
                Piece::CallArgs { text, .. } => (
                    Block::Tool,
                    json!({"type": "input_json_delta", "partial_json": text}),
                ),
            };
            let i = match self.open {
                Some((i, k)) if k == kind => i,
                _ => {
                    let block = match kind {
                        Block::Thinking => {
                            json!({"type": "thinking", "thinking": "", "signature": ""})
                        }
                        _ => json!({"type": "text", "text": ""}),
                    };
                    self.start(kind, block, &mut out)
                }
            };
            out.push(json!({"type": "content_block_delta", "index": i, "delta": delta}));
        }
        out
    }
}

/// The event stream.
fn stream(st: Arc<AppState>, ctx: Ctx, mut rx: UnboundedReceiver<(usize, Event)>) -> Response {
    let (btx, resp) = crate::respond::event_stream();
    tokio::spawn(async move {
        let start = json!({"type": "message_start", "message": {
            "id": ctx.id, "type": "message", "role": "assistant", "model": st.model_id,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": ctx.prompt_tokens, "output_tokens": 0},
        }});
        for v in [start, json!({"type": "ping"})] {
            if btx.send(Ok(typed_sse(&v))).await.is_err() {
                return;
            }
        }
        let mut parser = OutputParser::new(ctx.reasoning, ctx.tools.clone());
        let mut blocks = Blocks {
            open: None,
            next: 0,
        };
        let mut tally = Tally::default();
        while let Some((_, ev)) = rx.recv().await {
            let mut out = match ev {
                Event::Token(t) => {
                    tally.saw(&t);
                    let pieces = parser.push(&t.text);
                    blocks.events(&st, pieces)
                }
                Event::Done(f) => {
                    let mut pieces = parser.push(&f.text);
                    pieces.extend(parser.finish());
                    let mut out = blocks.events(&st, pieces);
                    if blocks.next == 0 {
                        blocks.start(Block::Text, json!({"type": "text", "text": ""}), &mut out);
                    }
                    blocks.close(&mut out);
                    let (reason, seq) = stop_reason(&st, &ctx, &f, &tally, parser.calls());
                    out.push(json!({"type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": seq},
                        "usage": {"output_tokens": f.completion_tokens}}));
                    out.push(json!({"type": "message_stop"}));
                    out
                }
                Event::Error(e) => {
                    let err = crate::generate::event_error(&st, e);
                    vec![error_body(&err)]
                }
            };
            let end = out
                .last()
                .is_some_and(|v| v["type"] == "message_stop" || v["type"] == "error");
            for v in out.drain(..) {
                if btx.send(Ok(typed_sse(&v))).await.is_err() {
                    return;
                }
            }
            if end {
                return;
            }
        }
    });
    resp
}
