//! `POST /v1/completions` and `POST /v1/chat/completions`: parse, validate, build the
//! prompt, then [`generate`](crate::generate::generate).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;

use nucleus::engine::context::SINK_TOKENS;

use crate::api::{self, Endpoint};
use crate::generate::generate;
use crate::prompt::{completion_prompt, fim_prompt, Prompt};
use crate::routes::{body_bytes, chat_request, finish_response};
use crate::AppState;

pub(crate) async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let t0 = Instant::now();
    let r = async {
        let body = body_bytes(body, st.max_body)?;
        let req = api::parse(&body)?;
        let settings = req.settings(Endpoint::Completions, st.tokenizer.vocab_size())?;
        let tokens = match req.suffix.as_deref() {
            Some(suffix) => fim_prompt(&st, &req, suffix)?,
            None => completion_prompt(&st, &req)?,
        };
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

pub(crate) async fn chat_completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let t0 = Instant::now();
    let r = async {
        let body = body_bytes(body, st.max_body)?;
        let req = api::parse(&body)?;
        let (prompt, settings) = chat_request(&st, &req)?;
        generate(st.clone(), Endpoint::Chat, prompt, settings, t0).await
    }
    .await;
    finish_response(&st, r)
}
