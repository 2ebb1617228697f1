//! What happens when a sequence does not fit its context window ([`ContextPolicy`]):
//!
//! - `error`: the request is refused before any work, with the counts.
//! - `truncate`: the prompt loses its oldest tokens after the first few (the attention sinks,
//!   or a chat's system message when it fits), so that it fits with room to answer.
//! - `stream`: the sequence runs past the window without end. Its KV cache keeps the first
//!   block (the attention sinks) and the most recent tokens, evicting the oldest block after
//!   the sinks whenever the window is full, and re-rotating the keys that move down so that
//!   positions stay consistent inside the cache (StreamingLLM: Xiao et al. 2023, "Efficient
//!   Streaming Language Models with Attention Sinks"; llama.cpp's context shift). Memory stays
//!   bounded by the window. The paper keeps 4 sink tokens; the cache moves whole blocks, so the
//!   sinks here are the first block (16 tokens): no knob, they and the window follow from the
//!   context size and the block size.

use std::fmt;
use std::str::FromStr;

use crate::chat::Message;
use crate::kv_cache::{KvCache, SeqId};
use crate::model::{Model, ModelError};
use crate::tokenizer::TokenId;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextPolicy {
    #[default]
    Error,
    Truncate,
    Stream,
}

impl ContextPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ContextPolicy::Error => "error",
            ContextPolicy::Truncate => "truncate",
            ContextPolicy::Stream => "stream",
        }
    }
}

impl fmt::Display for ContextPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ContextPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "error" => Ok(ContextPolicy::Error),
            "truncate" => Ok(ContextPolicy::Truncate),
            "stream" => Ok(ContextPolicy::Stream),
            _ => Err(format!(
                "unknown context policy {s:?} (expected error, truncate or stream)"
            )),
        }
    }
}

/// Tokens `truncate` keeps at the start of a prompt when it is given nothing else to keep:
/// StreamingLLM's four attention sinks.
pub const SINK_TOKENS: usize = 4;

/// Blocks a streamed sequence keeps at its start (its attention sinks).
pub const SINK_BLOCKS: usize = 1;

// The sliding-window layers keep the sinks whatever their window, for after the middle is
// evicted (see `kv_cache::sliding`).
const _: () = assert!(SINK_BLOCKS <= crate::kv_cache::PINNED_BLOCKS);

/// The smallest window, in blocks, that `stream` accepts: the sinks and room for a few recent
/// blocks.
pub const MIN_STREAM_BLOCKS: usize = 4;

/// Why a context policy cannot apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    #[error("--context-policy stream needs a window of at least {min} tokens (the attention sinks and recent blocks); the window is {n_ctx}")]
    WindowTooSmall { n_ctx: usize, min: usize },
}

/// `truncate`: the prompt cut to at most `limit` tokens by dropping the oldest ones after the
/// first `keep` (after [`SINK_TOKENS`] when `keep` leaves too little room: more than half the
/// limit). Returns the prompt and how many tokens were dropped.
pub fn truncate_prompt(prompt: &[TokenId], keep: usize, limit: usize) -> (Vec<TokenId>, usize) {
    if prompt.len() <= limit {
        return (prompt.to_vec(), 0);
    }
    let keep = if keep <= limit / 2 { keep } else { SINK_TOKENS };
    let keep = keep.min(limit);
    let dropped = prompt.len() - limit;
    let mut out = prompt[..keep].to_vec();
    out.extend_from_slice(&prompt[keep + dropped..]);
    (out, dropped)
}

/// `truncate` for a window of `n_ctx` tokens: a prompt that fills it loses its oldest tokens
/// after the first `keep` (see [`truncate_prompt`]), leaving room for `max_tokens` of answer
/// (at least one, at most a quarter of the window). Returns the prompt and the tokens dropped.
pub fn truncate_to_window(
    prompt: &[TokenId],
    keep: usize,
    n_ctx: usize,
    max_tokens: usize,
) -> (Vec<TokenId>, usize) {
    if prompt.len() < n_ctx {
        return (prompt.to_vec(), 0);
    }
    let room = max_tokens.clamp(1, (n_ctx / 4).max(1));
    truncate_prompt(prompt, keep, n_ctx - room)
}

/// What `truncate` keeps at the start of a chat prompt (`tokens`, rendered from `messages`):
/// the system message's tokens when the conversation opens with one and the prompt starts with
/// its rendering alone (`encode(messages, add_generation_prompt)`), else the sinks.
pub fn chat_keep_tokens<E>(
    messages: &[Message],
    tokens: &[TokenId],
    encode: impl Fn(&[Message], bool) -> Result<Vec<TokenId>, E>,
) -> Result<usize, E> {
    if messages.len() > 1 && messages[0].role == "system" {
        let system = encode(&messages[..1], false)?;
        if tokens.starts_with(&system) {
            return Ok(system.len());
        }
    }
    Ok(SINK_TOKENS)
}

/// Checks that a window of `n_ctx` tokens in blocks of `block_size` can stream.
pub fn check_stream_window(n_ctx: usize, block_size: usize) -> Result<(), ContextError> {
    let min = MIN_STREAM_BLOCKS * block_size;
    if n_ctx < min {
        return Err(ContextError::WindowTooSmall { n_ctx, min });
    }
    Ok(())
}

/// `stream`: makes room for `need` more tokens of `seq` in a window of `n_ctx` tokens by
/// evicting the oldest whole blocks after the first `sink_blocks` and moving the keys after
/// them down. Returns the tokens evicted (0 when they fit already).
pub fn slide_window(
    model: &Model,
    kv: &mut KvCache,
    seq: SeqId,
    sink_blocks: usize,
    n_ctx: usize,
    need: usize,
) -> Result<usize, ModelError> {
    let bs = kv.config().block_size;
    let len = kv.seq_len(seq)?;
    // The window holds whole blocks: tokens may not go past its last full block.
    let capacity = n_ctx / bs * bs;
    if len + need <= capacity {
        return Ok(0);
    }
    let full_blocks = len / bs;
    let blocks = (len + need - capacity).div_ceil(bs);
    if sink_blocks + blocks > full_blocks {
        return Err(ModelError::BadBatch(format!(
            "{need} tokens do not fit a streamed window of {n_ctx} tokens"
        )));
    }
    kv.evict_blocks(seq, sink_blocks, blocks)?;
    kv.make_private(seq, sink_blocks)?;
    let moved = (blocks * bs) as i64;
    model.shift_keys(kv, seq, sink_blocks, -moved)?;
    Ok(blocks * bs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_the_start_and_the_end() {
        let p: Vec<TokenId> = (0..20).collect();
        assert_eq!(truncate_prompt(&p, 4, 30), (p.clone(), 0));
        let (t, d) = truncate_prompt(&p, 4, 10);
        assert_eq!(d, 10);
        assert_eq!(t, [0, 1, 2, 3, 14, 15, 16, 17, 18, 19]);
        // A system message that fits in half the room is kept whole.
        let (t, _) = truncate_prompt(&p, 5, 10);
        assert_eq!(t, [0, 1, 2, 3, 4, 15, 16, 17, 18, 19]);
        // One that does not falls back to the sinks.
        let (t, _) = truncate_prompt(&p, 8, 10);
        assert_eq!(t, [0, 1, 2, 3, 14, 15, 16, 17, 18, 19]);
    }

    #[test]
    fn truncation_to_a_window_leaves_room_to_answer() {
        let p: Vec<TokenId> = (0..100).collect();
        assert_eq!(truncate_to_window(&p, 4, 101, 50), (p.clone(), 0));
        // A window of 64: room for 8 tokens asked; 16 at most (a quarter).
        let (t, d) = truncate_to_window(&p, 4, 64, 8);
        assert_eq!((t.len(), d), (56, 44));
        assert_eq!(&t[..5], &[0, 1, 2, 3, 48]);
        assert_eq!(truncate_to_window(&p, 4, 64, 1000).0.len(), 48);
        assert_eq!(truncate_to_window(&p, 4, 64, 0).0.len(), 63);
    }

    #[test]
    fn a_chat_keeps_its_system_message_when_the_prompt_starts_with_it() {
        let msgs = [
            Message::new("system", "be brief"),
            Message::new("user", "hi"),
        ];
        // A stand-in template: a message is its content's bytes.
        let encode = |m: &[Message], _: bool| -> Result<Vec<TokenId>, ()> {
            Ok(m.iter()
                .flat_map(|m| m.content.bytes().map(TokenId::from))
                .collect())
        };
        let tokens = encode(&msgs, true).unwrap();
        assert_eq!(chat_keep_tokens(&msgs, &tokens, encode), Ok(8));
        assert_eq!(
            chat_keep_tokens(&msgs[1..], &tokens, encode),
            Ok(SINK_TOKENS)
        );
        assert_eq!(
            chat_keep_tokens(&msgs, &tokens[1..], encode),
            Ok(SINK_TOKENS)
        );
    }

    #[test]
    fn policies_parse_and_unknown_names_are_errors() {
        for p in [
            ContextPolicy::Error,
            ContextPolicy::Truncate,
            ContextPolicy::Stream,
        ] {
            assert_eq!(p.as_str().parse::<ContextPolicy>(), Ok(p));
        }
        let e = "rolling".parse::<ContextPolicy>().unwrap_err();
        assert!(e.contains("rolling") && e.contains("stream"), "{e}");
        assert!(check_stream_window(48, 16).is_err());
        assert!(check_stream_window(64, 16).is_ok());
    }
}
