//! `POST /v1/responses`: OpenAI's Responses API over the chat machinery, stateless but for
//! `previous_response_id`, which continues a conversation kept in a bounded in-memory store
//! (the last [`Store::CAPACITY`] responses; an unknown id is a 400). The request is translated
//! into a chat completions request ([`super::responses_input`]); the answer becomes `reasoning`,
//! `message` and `function_call` output items, whole or as Responses' event stream
//! (`response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`, `...done`,
//! `response.function_call_arguments.delta`, `...done`, `response.completed`).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use nucleus::engine::scheduler::{Event, Finished};
use nucleus::sampling::FinishReason;

use super::responses_input::{answer_message, ResponsesRequest, Store};
use crate::api::{self, ChatMessage};
use crate::generate::{check_fit, collect_single, submit};
use crate::output::{text_beside_calls, OutputParser, Piece};
use crate::respond::typed_sse;
use crate::routes::{body_bytes, chat_request, finish_response};
use crate::{unix_now, ApiError, AppState};

/// What the answer's formatting needs to know.
struct Ctx {
    id: String,
    created: u64,
    reasoning: Option<bool>,
    tools: Option<Vec<String>>,
    req: ResponsesRequest,
    /// The conversation so far (without the instructions), kept when `store`.
    conversation: Vec<ChatMessage>,
    prompt_tokens: usize,
}

impl Ctx {
    /// The response object with `output`, `status` and `usage`.
    fn object(
        &self,
        st: &AppState,
        status: &str,
        output: Vec<Value>,
        f: Option<&Finished>,
    ) -> Value {
        let r = &self.req;
        let usage = f.map(|f| {
            json!({
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": f.cached_tokens},
                "output_tokens": f.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + f.completion_tokens,
            })
        });
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": st.model_id,
            "output": output,
            "parallel_tool_calls": r.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": r.previous_response_id,
            "reasoning": r.reasoning.clone().unwrap_or(json!({"effort": null, "summary": null})),
            "store": r.store.unwrap_or(true),
            "temperature": r.temperature.unwrap_or(1.0),
            "text": r.text.clone().unwrap_or(json!({"format": {"type": "text"}})),
            "tool_choice": r.tool_choice.clone().unwrap_or(json!("auto")),
            "tools": r.tools.clone().unwrap_or_default(),
            "top_p": r.top_p.unwrap_or(1.0),
            "truncation": "disabled",
            "usage": usage,
            "metadata": r.metadata.clone().unwrap_or(json!({})),
        })
    }

    /// Keeps the conversation and this answer for `previous_response_id`.
    fn store(
        &self,
        st: &AppState,
        reasoning: Option<String>,
        text: String,
        calls: &[(String, String, String)],
    ) {
        if self.req.store != Some(false) {
            let mut c = self.conversation.clone();
            c.push(answer_message(reasoning, text, calls));
            st.responses.put(self.id.clone(), c);
        }
    }
}

fn status_of(f: &Finished) -> &'static str {
    if f.finish_reason == FinishReason::Length {
        "incomplete"
    } else {
        "completed"
    }
}

fn prepare(
    st: &AppState,
    body: &[u8],
) -> Result<(crate::prompt::Prompt, api::GenSettings, Ctx), ApiError> {
    let req: ResponsesRequest = api::parse_json(body)?;
    let history = match &req.previous_response_id {
        None => Vec::new(),
        Some(id) => st.responses.get(id).ok_or_else(|| {
            ApiError::param(
                "previous_response_id",
                format!("`previous_response_id` {id:?} is not stored: this server keeps the last {} responses in memory (not across restarts), and only those with `store` true", Store::CAPACITY),
            )
            .with_code("previous_response_not_found")
        })?,
    };
    let reasons = crate::reasoning::model_reasons(st.template.as_ref());
    let (chat, conversation) = req.to_chat(history, reasons)?;
    let (prompt, settings) = chat_request(st, &chat)?;
    let ctx = Ctx {
        id: st.new_id("resp"),
        created: unix_now(),
        reasoning: settings.reasoning,
        tools: settings.tools.as_ref().map(|t| t.names.clone()),
        req,
        conversation,
        prompt_tokens: prompt.tokens.len(),
    };
    Ok((prompt, settings, ctx))
}

pub(crate) async fn responses(
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
        Ok(Json(whole(&st, &ctx, &one.text, &one.done)).into_response())
    }
    .await;
    finish_response(&st, r)
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "status": status, "summary": [],
        "content": [{"type": "reasoning_text", "text": text}]})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(text_part).into_iter().collect();
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, call_id: &str, name: &str, args: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": args, "status": status})
}

/// The whole response.
fn whole(st: &AppState, ctx: &Ctx, text: &str, f: &Finished) -> Value {
    let a = OutputParser::new(ctx.reasoning, ctx.tools.clone()).whole(text);
    let mut output = Vec::new();
    if let Some(r) = &a.reasoning {
        output.push(reasoning_item(&st.new_id("rs"), r, "completed"));
    }
    let body = a.body();
    if !body.is_empty() || a.calls.is_empty() {
        output.push(message_item(&st.new_id("msg"), Some(&body), "completed"));
    }
    let calls: Vec<(String, String, String)> = a
        .calls
        .iter()
        .map(|(name, args)| (st.new_id("call"), name.clone(), args.clone()))
        .collect();
    for (call_id, name, args) in &calls {
        output.push(call_item(
            &st.new_id("fc"),
            call_id,
            name,
            args,
            "completed",
        ));
    }
    ctx.store(st, a.reasoning.clone(), body, &calls);
    ctx.object(st, status_of(f), output, Some(f))
}

/// The open output item.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        args: String,
    },
}

/// Turns pieces into events, adding and finishing output items as the kind changes.
#[derive(Default)]
struct Items {
    open: Option<Open>,
    /// The finished items.
    done: Vec<Value>,
    events: Vec<Value>,
    /// The answer so far, for the store.
    reasoning: Option<String>,
    text: String,
    calls: Vec<(String, String, String)>,
}

impl Items {
    fn emit(&mut self, kind: &str, mut v: Value) {
        v["type"] = json!(kind);
        self.events.push(v);
    }

    fn close(&mut self) {
        let index = self.done.len();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { id, text }) => {
                self.emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                self.reasoning
                    .get_or_insert_with(String::new)
                    .push_str(&text);
                reasoning_item(&id, &text, "completed")
            }
            Some(Open::Message { id, text }) => {
                self.emit("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
                self.emit("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part(&text)}));
                self.text.push_str(&text);
                message_item(&id, Some(&text), "completed")
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                args,
            }) => {
                self.emit(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": name, "arguments": args}),
                );
                let item = call_item(&id, &call_id, &name, &args, "completed");
                self.calls.push((call_id, name, args));
                item
            }
        };
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.done.push(item);
    }

    fn add(&mut self, open: Open) {
        self.close();
        let index = self.done.len();
        let item = match &open {
            Open::Reasoning { id, .. } => {
                json!({"type": "reasoning", "id": id, "status": "in_progress", "summary": [], "content": []})
            }
            Open::Message { id, .. } => message_item(id, None, "in_progress"),
            Open::Call {
                id, call_id, name, ..
            } => call_item(id, call_id, name, "", "in_progress"),
        };
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        if let Open::Message { id, .. } = &open {
            self.emit("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part("")}));
        }
        self.open = Some(open);
    }

    fn push(&mut self, st: &AppState, pieces: Vec<Piece>) {
        for p in pieces {
            let index = self.done.len();
            match p {
                Piece::Reasoning(r) => {
                    if !matches!(self.open, Some(Open::Reasoning { .. })) {
                        self.add(Open::Reasoning {
                            id: st.new_id("rs"),
                            text: String::new(),
                        });
                    }
                    let index = self.done.len();
                    if let Some(Open::Reasoning { id, text }) = self.open.as_mut() {
                        text.push_str(&r);
                        let v = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": r});
                        self.emit("response.reasoning_text.delta", v);
                    }
                }
                Piece::Text(t) => {
                    if !matches!(self.open, Some(Open::Message { .. })) {
                        self.add(Open::Message {
                            id: st.new_id("msg"),
                            text: String::new(),
                        });
                    }
                    let index = self.done.len();
                    if let Some(Open::Message { id, text }) = self.open.as_mut() {
                        text.push_str(&t);
                        let v = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []});
                        self.emit("response.output_text.delta", v);
                    }
                }
                Piece::CallStart { name, .. } => {
                    let open = Open::Call {
                        id: st.new_id("fc"),
                        call_id: st.new_id("call"),
                        name,
                        args: String::new(),
                    };
                    self.add(open);
                }
                Piece::CallArgs { text: delta, .. } => {
                    if let Some(Open::Call { id, args, .. }) = self.open.as_mut() {
                        args.push_str(&delta);
                        let v = json!({"item_id": id, "output_index": index, "delta": delta});
                        self.emit("response.function_call_arguments.delta", v);
                    }
                }
            }
        }
    }
}

/// The event stream.
fn stream(st: Arc<AppState>, ctx: Ctx, mut rx: UnboundedReceiver<(usize, Event)>) -> Response {
    let (btx, resp) = crate::respond::event_stream();
    tokio::spawn(async move {
        let mut seq = 0u64;
        let mut items = Items::default();
        let begun = ctx.object(&st, "in_progress", Vec::new(), None);
        items.emit("response.created", json!({"response": begun}));
        items.emit("response.in_progress", json!({"response": begun}));
        let mut parser = OutputParser::new(ctx.reasoning, ctx.tools.clone());
        loop {
            let ev = rx.recv().await;
            let mut end = true;
            match ev {
                Some((_, Event::Token(t))) => {
                    end = false;
                    let pieces = parser.push(&t.text);
                    items.push(&st, pieces);
                }
                Some((_, Event::Done(f))) => {
                    let mut pieces = parser.push(&f.text);
                    pieces.extend(parser.finish());
                    items.push(&st, pieces);
                    if items.open.is_none() && items.done.is_empty() {
                        items.add(Open::Message {
                            id: st.new_id("msg"),
                            text: String::new(),
                        });
                    }
                    items.close();
                    let text = text_beside_calls(&items.text, !items.calls.is_empty());
                    ctx.store(&st, items.reasoning.clone(), text, &items.calls);
                    let status = status_of(&f);
                    let done = ctx.object(&st, status, items.done.clone(), Some(&f));
                    let kind = if status == "completed" {
                        "response.completed"
                    } else {
                        "response.incomplete"
                    };
                    items.emit(kind, json!({"response": done}));
                }
                Some((_, Event::Error(e))) => {
                    let err = crate::generate::event_error(&st, e);
                    items.emit(
                        "error",
                        json!({"code": err.kind, "message": err.message, "param": null}),
                    );
                }
                None => {
                    let err = crate::generate::event_error(&st, "the engine stopped".into());
                    items.emit(
                        "error",
                        json!({"code": err.kind, "message": err.message, "param": null}),
                    );
                }
            }
            for mut v in items.events.drain(..) {
                v["sequence_number"] = json!(seq);
                seq += 1;
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
