//! Hostile conversations through the real chat templates (qwen2.5's own, gemma-3's with its
//! `bos_token`): rendering never panics; message contents never add, remove or change a
//! control token (the prompt has the control tokens of a harmless conversation of the same
//! shape); and the prompt decodes to the rendered text, with BOS once.
//!
//! Input: byte 0 picks the model (bit 0) and `add_generation_prompt` (bit 1); the rest,
//! split at 0xFF bytes, is the messages: each one's first byte picks the role, the rest is its
//! content (lossily UTF-8).
#![no_main]

use nucleus::chat::Message;
use nucleus::tokenizer::Tokenizer;

const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

fn controls(tok: &Tokenizer, ids: &[u32]) -> Vec<u32> {
    ids.iter().copied().filter(|&t| tok.is_control(t)).collect()
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (tok, template) = if flags & 1 == 0 {
        (nucleus_fuzz::qwen(), nucleus_fuzz::qwen_template())
    } else {
        (nucleus_fuzz::gemma(), nucleus_fuzz::gemma_template())
    };
    let gen = flags & 2 != 0;
    let messages: Vec<Message> = rest
        .split(|&b| b == 0xFF)
        .filter_map(|m| m.split_first())
        .map(|(&role, content)| {
            Message::new(
                ROLES[role as usize % ROLES.len()],
                &String::from_utf8_lossy(content),
            )
        })
        .collect();
    let _ = template.encode(tok, &messages, gen, true);
    let Ok(ids) = template.encode(tok, &messages, gen, false) else {
        return;
    };
    // The same conversation with harmless contents (as empty, as blank, or not).
    let harmless: Vec<Message> = messages
        .iter()
        .map(|m| {
            let c = if m.content.is_empty() || m.content.trim().is_empty() {
                m.content.as_str()
            } else {
                "a"
            };
            Message::new(&m.role, c)
        })
        .collect();
    let base = template
        .encode(tok, &harmless, gen, false)
        .expect("the harmless conversation renders too");
    assert_eq!(
        controls(tok, &ids),
        controls(tok, &base),
        "a message's content changed the prompt's control tokens"
    );
    // The prompt is the rendered text, BOS once (added unless the template wrote it).
    let rendered = template
        .render(&messages, gen)
        .expect("rendered once already");
    let mut want = String::new();
    let bos = tok.bos().and_then(|b| tok.token_text(b)).unwrap_or("");
    if tok.add_bos() && !rendered.starts_with(bos) {
        want.push_str(bos);
    }
    want.push_str(&rendered);
    if tok.add_eos() {
        want.push_str(tok.eos().and_then(|e| tok.token_text(e)).unwrap_or(""));
    }
    assert_eq!(tok.decode(&ids, false), want);
});
