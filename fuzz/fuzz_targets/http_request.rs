//! Request bodies from raw bytes, as the server reads them: `/v1/completions` and
//! `/v1/chat/completions` bodies parsed (unsupported fields refused), their settings validated,
//! and the prompt built (the completions prompt tokenized, the chat messages through qwen's
//! template, with their tools). Errors are expected (each becomes a 4xx); a panic is a bug.
//!
//! Input: byte 0 picks the endpoint (bit 0: chat) and the message parsing (bit 1:
//! `--parse-special-in-messages`); the rest is the body.
#![no_main]

use nucleus_server::api::{self, Endpoint};
use nucleus_server::prompt::{chat_tokens, completion_tokens};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let tok = nucleus_fuzz::qwen();
    let Ok(req) = api::parse(body) else {
        return;
    };
    let chat = flags & 1 != 0;
    let ep = if chat {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let _ = req.settings(ep, tok.vocab_size());
    if chat {
        // The tools too, as the chat route reads them (a bad `tools` is a 4xx).
        let Ok(tools) = nucleus_server::tools::tool_settings(&req) else {
            return;
        };
        if let Ok(p) = chat_tokens(
            tok,
            Some(nucleus_fuzz::qwen_template()),
            flags & 2 != 0,
            &req,
            tools.as_ref(),
        ) {
            assert!(p.keep <= p.tokens.len());
            assert!(p.tokens.iter().all(|&t| (t as usize) < tok.vocab_size()));
        }
    } else if let Ok(ids) = completion_tokens(tok, &req) {
        assert!(ids.iter().all(|&t| (t as usize) < tok.vocab_size()));
    }
});
