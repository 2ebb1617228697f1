//! `POST /infill`: llama-server's fill-in-the-middle endpoint with its request fields
//! (`input_prefix`, `input_suffix`, `input_extra`, `prompt`, `n_predict`, and the completions
//! sampling fields) and its (non-OpenAI) response: `content`, `stop_type`, `tokens_cached`,
//! `timings`, ...; streamed as `data: {"content": ..., "stop": false}` events and a final one
//! with `"stop": true`, without `[DONE]` (as llama-server). Editor plugins' fields (`n_indent`,
//! `t_max_predict_ms`, `response_fields`, ...): [`crate::editor`].

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use nucleus::engine::context::SINK_TOKENS;
use nucleus::engine::scheduler::{Event, Finished, GenRequest, SubmitError};
use nucleus::sampling::FinishReason;
use nucleus::tokenizer::TokenId;

use crate::api::{self, Endpoint, GenSettings};
use crate::editor::{self, EditorLimits};
use crate::generate::{
    capped_max_tokens, check_fits, event_error, relay, request_submit_error, submit_error,
};
use crate::infill::{self, Infill};
use crate::respond::sse;
use crate::routes::{body_bytes, finish_response};
use crate::{ApiError, AppState};

pub(crate) async fn infill(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let t0 = Instant::now();
    let r = async {
        let body = body_bytes(body, st.max_body)?;
        let (settings, prompt, editor) = parse(&st, &body)?;
        run(st.clone(), settings, prompt, editor, t0).await
    }
    .await;
    finish_response(&st, r)
}

/// A field of the completions body that `/infill` has no place for in its answer.
fn refuse(field: &str, unused: bool) -> Result<(), ApiError> {
    if unused {
        return Ok(());
    }
    Err(ApiError::param(
        field,
        format!("`{field}` is not supported by /infill: use /v1/completions with `suffix`"),
    )
    .with_code("unsupported_parameter"))
}

/// What `/infill` adds to the completions fields: `return_tokens` and the editors' fields.
struct Extras {
    return_tokens: bool,
    limits: EditorLimits,
    response_fields: Option<Vec<String>>,
}

/// The settings, the prompt tokens and the extra fields of an `/infill` body.
fn parse(st: &AppState, body: &[u8]) -> Result<(GenSettings, Vec<TokenId>, Extras), ApiError> {
    let mut map: Map<String, Value> = api::parse_json(body)?;
    let limits = EditorLimits::take(&mut map)?;
    let response_fields = editor::response_fields(&mut map)?;
    let tok = &st.tokenizer;
    // As llama-server: the model is checked first.
    infill::required_tokens(tok, "input_suffix")?;
    let mut required = |k: &str| {
        map.remove(k)
            .ok_or_else(|| ApiError::param(k, format!("`{k}` is required")))
    };
    let prefix = infill::mixed_tokens(tok, &required("input_prefix")?, "input_prefix")?;
    let suffix = infill::mixed_tokens(tok, &required("input_suffix")?, "input_suffix")?;
    let extra = infill::extra_files(map.remove("input_extra").as_ref())?;
    let prompt = match map.remove("prompt") {
        None | Some(Value::Null) => Vec::new(),
        // llama-server: special-token text in `prompt` is parsed, no BOS.
        Some(Value::String(s)) => tok
            .encode(&s, false, true)
            .map_err(|e| ApiError::param("prompt", format!("cannot tokenize `prompt`: {e}")))?,
        Some(_) => return Err(ApiError::param("prompt", "`prompt` must be a string")),
    };
    let n_predict = match map.remove("n_predict") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(n) if n < 0 => None,
            Some(n) if n > 0 => Some(n),
            _ => {
                return Err(ApiError::param(
                    "n_predict",
                    "`n_predict` must be a positive integer, or -1 for no limit",
                ))
            }
        },
    };
    if map.get("suffix").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::param(
            "suffix",
            "/infill takes `input_suffix` (and `input_prefix`); `suffix` belongs to /v1/completions",
        ));
    }
    let return_tokens = map.remove("return_tokens").and_then(|v| v.as_bool()) == Some(true);
    let rest = serde_json::to_vec(&map).map_err(|e| ApiError::invalid(e.to_string()))?;
    let req = api::parse(&rest)?;
    if n_predict.is_some() && (req.max_tokens.is_some() || req.max_completion_tokens.is_some()) {
        return Err(ApiError::param(
            "n_predict",
            "send one of `n_predict` and `max_tokens`",
        ));
    }
    let mut s = req.settings(Endpoint::Completions, tok.vocab_size())?;
    refuse("n", s.n == 1)?;
    refuse("best_of", s.best_of == 1)?;
    refuse("use_beam_search", s.beams.is_none())?;
    refuse("logprobs", s.sampling.logprobs.is_none())?;
    refuse("explain", !s.explain)?;
    // llama-server's default `n_predict` is -1: up to an end of generation or the window's end.
    s.max_tokens = match n_predict {
        Some(n) => Some(n as usize),
        None => req
            .max_completion_tokens
            .or(req.max_tokens)
            .map(|m| m as usize),
    };
    let n_ctx = st.engine.config().n_ctx;
    let input = Infill {
        prefix,
        suffix,
        extra: &extra,
        prompt,
    };
    let tokens = infill::format_infill(tok, input, infill::N_BATCH, infill::N_PREDICT, n_ctx)?;
    let extras = Extras {
        return_tokens,
        limits,
        response_fields,
    };
    Ok((s, tokens, extras))
}

/// Submits the prompt and answers in llama-server's shape.
async fn run(
    st: Arc<AppState>,
    s: GenSettings,
    prompt: Vec<TokenId>,
    extras: Extras,
    t0: Instant,
) -> Result<Response, ApiError> {
    if st.draining.load(Ordering::SeqCst) {
        return Err(submit_error(SubmitError::ShuttingDown));
    }
    let policy = s.context_policy.unwrap_or(st.context_policy);
    let max_tokens = capped_max_tokens(&st, s.max_tokens, prompt.len(), policy);
    check_fits(&st, prompt.len(), max_tokens, policy, "input_prefix")?;
    let req = GenRequest {
        prompt_tokens: prompt.clone(),
        sampling: s.sampling.for_choice(0),
        stop: s.stop.clone(),
        max_tokens,
        ignore_eos: s.ignore_eos,
        context_policy: policy,
        keep_tokens: SINK_TOKENS,
        explain: false,
    };
    let rx = st
        .engine
        .submit(req)
        .map_err(|e| request_submit_error(&s, e))?;
    let t_submit = Instant::now();
    let (mtx, mut mrx) = unbounded_channel();
    tokio::spawn(relay(0, rx, mtx, st.clone(), t0));
    let mut out = Answer::new(&st, &s, &prompt, t_submit, extras);
    if !s.stream {
        // An editor's limit ends the answer early: dropping `mrx` cancels the request.
        while !out.cut {
            let Some((_, ev)) = mrx.recv().await else {
                break;
            };
            out.push(&st, ev)?;
        }
        return Ok(Json(out.final_json(&st, true)).into_response());
    }
    let (btx, resp) = crate::respond::event_stream();
    tokio::spawn(async move { stream(st, out, mrx, btx).await });
    Ok(resp)
}

async fn stream(
    st: Arc<AppState>,
    mut out: Answer,
    mut rx: UnboundedReceiver<(usize, Event)>,
    btx: tokio::sync::mpsc::Sender<Result<Bytes, Infallible>>,
) {
    let return_tokens = out.extras.return_tokens;
    while !out.cut {
        let Some((_, ev)) = rx.recv().await else {
            break;
        };
        let id = match &ev {
            Event::Token(t) => Some(t.token),
            _ => None,
        };
        let kept = match out.push(&st, ev) {
            Ok(kept) => kept,
            Err(err) => {
                let _ = btx.send(Ok(sse(&err.body()))).await;
                return;
            }
        };
        if let (Some(text), Some(id)) = (kept, id) {
            if text.is_empty() && !return_tokens {
                continue;
            }
            let tokens: Vec<TokenId> = if return_tokens { vec![id] } else { vec![] };
            let v = json!({
                "index": 0,
                "content": text,
                "tokens": tokens,
                "stop": false,
                "id_slot": 0,
                "tokens_predicted": out.predicted,
                "tokens_evaluated": out.n_prompt,
            });
            if btx.send(Ok(sse(&v))).await.is_err() {
                return;
            }
        }
    }
    let _ = btx.send(Ok(sse(&out.final_json(&st, false)))).await;
}

/// What llama-server reports of one infill, gathered from the events.
struct Answer {
    content: String,
    /// The text not yet streamed (released at the end).
    tail: String,
    tokens: Vec<TokenId>,
    last_token: Option<TokenId>,
    predicted: usize,
    n_prompt: usize,
    prompt_text: String,
    done: Option<Finished>,
    stop: Vec<String>,
    settings: Value,
    t_submit: Instant,
    t_first: Option<Instant>,
    t_done: Option<Instant>,
    extras: Extras,
    /// An editor's limit (`n_indent`, `t_max_predict_ms`) ended the answer.
    cut: bool,
}

impl Answer {
    fn new(
        st: &AppState,
        s: &GenSettings,
        prompt: &[TokenId],
        t_submit: Instant,
        extras: Extras,
    ) -> Answer {
        let p = &s.sampling;
        Answer {
            content: String::new(),
            tail: String::new(),
            tokens: Vec::new(),
            last_token: None,
            predicted: 0,
            n_prompt: prompt.len(),
            prompt_text: st.tokenizer.decode(prompt, false),
            done: None,
            stop: s.stop.clone(),
            settings: json!({
                "n_predict": s.max_tokens.map_or(-1, |m| m as i64),
                "seed": p.seed,
                "temperature": p.temperature,
                "top_k": p.top_k,
                "top_p": p.top_p,
                "min_p": p.min_p,
                "typical_p": p.typical_p,
                "repeat_penalty": p.repeat_penalty,
                "presence_penalty": p.presence_penalty,
                "frequency_penalty": p.frequency_penalty,
                "stop": s.stop,
                "stream": s.stream,
                "n_indent": extras.limits.n_indent,
                "t_max_predict_ms": extras.limits.t_max_predict_ms,
                "samplers": nucleus::sampling::order::display(p.order()).split(';').collect::<Vec<_>>(),
            }),
            t_submit,
            t_first: None,
            t_done: None,
            extras,
            cut: false,
        }
    }

    /// Takes one event: for a token, the part of its text kept (an editor's limit may cut it
    /// and end the answer); an error event becomes the error to answer with.
    fn push(&mut self, st: &AppState, ev: Event) -> Result<Option<String>, ApiError> {
        match ev {
            Event::Token(t) => {
                let now = Instant::now();
                let t_first = *self.t_first.get_or_insert(now);
                self.predicted += 1;
                self.last_token = Some(t.token);
                if self.extras.return_tokens {
                    self.tokens.push(t.token);
                }
                let (kept, cut) = self
                    .extras
                    .limits
                    .check(&self.content, &t.text, t_first, now);
                let kept = kept.to_string();
                self.content.push_str(&kept);
                if cut {
                    self.cut = true;
                    self.t_done = Some(now);
                }
                return Ok(Some(kept));
            }
            Event::Done(f) => {
                self.t_done = Some(Instant::now());
                self.tail = f.text.clone();
                self.content.push_str(&f.text);
                self.predicted = f.completion_tokens;
                self.done = Some(f);
            }
            Event::Error(e) => return Err(event_error(st, e)),
        }
        Ok(None)
    }

    /// llama-server's final result (`to_json_non_oaicompat`); streamed, `content` is only the
    /// text not yet sent.
    fn final_json(&self, st: &AppState, whole: bool) -> Value {
        let mut v = self.result_json(st, whole);
        if self.cut {
            // Cancelled before the engine reported how much of the prompt came from the
            // prefix cache: those counts are left out rather than guessed.
            v.as_object_mut().map(|o| o.remove("tokens_cached"));
            if let Some(t) = v["timings"].as_object_mut() {
                for k in [
                    "cache_n",
                    "prompt_n",
                    "prompt_per_token_ms",
                    "prompt_per_second",
                ] {
                    t.remove(k);
                }
            }
        }
        match &self.extras.response_fields {
            Some(paths) => editor::pick_fields(paths, &v),
            None => v,
        }
    }

    fn result_json(&self, st: &AppState, whole: bool) -> Value {
        let f = self.done.as_ref();
        let cached = f.map_or(0, |f| f.cached_tokens);
        let n_prompt = f.map_or(self.n_prompt, |f| f.prompt_tokens);
        let eos = self.last_token.is_some_and(|t| st.tokenizer.is_eog(t));
        let (stop_type, word) = match f.map(|f| f.finish_reason) {
            Some(FinishReason::Stop) if eos => ("eos", ""),
            // The stop string that matched: known when there is one.
            Some(FinishReason::Stop) => ("word", self.stop.first().map_or("", |s| s.as_str())),
            Some(FinishReason::Length) => ("limit", ""),
            // Ended by `n_indent` or `t_max_predict_ms`, as llama-server reports it.
            None if self.cut => ("limit", ""),
            None => ("none", ""),
        };
        let ms = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => (b - a).as_secs_f64() * 1e3,
            _ => 0.0,
        };
        let prompt_ms = ms(Some(self.t_submit), self.t_first);
        let predicted_ms = ms(self.t_first, self.t_done);
        let n_eval = n_prompt.saturating_sub(cached);
        let per = |ms: f64, n: usize| if n == 0 { 0.0 } else { ms / n as f64 };
        let rate = |ms: f64, n: usize| if ms <= 0.0 { 0.0 } else { 1e3 * n as f64 / ms };
        json!({
            "index": 0,
            "content": if whole { &self.content } else { &self.tail },
            "tokens": self.tokens,
            "id_slot": 0,
            "stop": true,
            "model": st.model_id,
            "tokens_predicted": self.predicted,
            "tokens_evaluated": n_prompt,
            "generation_settings": self.settings,
            "prompt": self.prompt_text,
            "has_new_line": self.content.contains('\n'),
            "truncated": f.is_some_and(|f| f.dropped_tokens > 0),
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_cached": cached,
            "timings": {
                "cache_n": cached,
                "prompt_n": n_eval,
                "prompt_ms": prompt_ms,
                "prompt_per_token_ms": per(prompt_ms, n_eval),
                "prompt_per_second": rate(prompt_ms, n_eval),
                "predicted_n": self.predicted,
                "predicted_ms": predicted_ms,
                "predicted_per_token_ms": per(predicted_ms, self.predicted),
                "predicted_per_second": rate(predicted_ms, self.predicted),
            },
        })
    }
}
