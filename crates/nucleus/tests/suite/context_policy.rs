//! Context policies on real models: `truncate` drops the prompt's oldest tokens after the
//! sinks and says how many; `stream` runs past the window with the KV cache bounded by it,
//! matches the unbounded run until the window fills, re-rotates moved keys to their new
//! positions, and gives the same tokens through the engine as through a session.
//!
//! Run in release: `cargo test --release -p nucleus --test suite context_policy::`.

use crate::common;

use std::sync::Arc;

use nucleus::engine::context::SINK_TOKENS;
use nucleus::engine::scheduler::{Engine, EngineConfig, Event, Finished, GenRequest, SubmitError};
use nucleus::engine::{ContextPolicy, GenerateRequest, Session};
use nucleus::model::Model;
use nucleus::sampling::SamplingParams;
use nucleus::tokenizer::{TokenId, Tokenizer};
use tokio::sync::mpsc::UnboundedReceiver;

fn corpus(tok: &Tokenizer) -> Vec<TokenId> {
    let text = std::fs::read_to_string(common::shared_dir().join("corpus/gpl-3.txt"))
        .expect("read the corpus");
    tok.encode(&text, true, false).unwrap()
}

/// A request's generated tokens and its end.
fn drain(rx: UnboundedReceiver<Event>) -> (Vec<TokenId>, Finished) {
    let (toks, _, f) = common::drain(rx);
    (toks, f)
}

fn greedy(prompt: &[TokenId], max_tokens: usize, policy: ContextPolicy) -> GenRequest {
    let mut r = GenRequest::new(prompt.to_vec(), SamplingParams::greedy());
    r.max_tokens = Some(max_tokens);
    r.ignore_eos = true;
    r.context_policy = policy;
    r
}

fn engine(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    n_ctx: usize,
) -> nucleus::engine::scheduler::EngineHandle {
    let cfg = EngineConfig {
        n_ctx,
        kv_tokens: 8 * n_ctx,
        ..Default::default()
    };
    Engine::start(model.clone(), tok.clone(), cfg)
}

#[test]
fn truncate_drops_the_oldest_prompt_tokens_after_the_sinks() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = common::pulled("qwen2.5-coder-0.5b-instruct-q4_k_m") else {
        return;
    };
    let text = corpus(&tok);
    let h = engine(&model, &tok, 128);
    let long = &text[..300];
    // `error` refuses it before any work.
    assert!(matches!(
        h.submit(greedy(long, 8, ContextPolicy::Error)),
        Err(SubmitError::TooLong { prompt: 300, .. })
    ));
    let (got, f) = drain(h.submit(greedy(long, 8, ContextPolicy::Truncate)).unwrap());
    // Room for the 8 tokens asked: the prompt keeps 120 tokens, the first four and the last 116.
    assert_eq!(f.dropped_tokens, 180);
    assert_eq!(f.prompt_tokens, 120);
    let kept = [&long[..SINK_TOKENS], &long[300 - 116..]].concat();
    let (want, _) = drain(h.submit(greedy(&kept, 8, ContextPolicy::Error)).unwrap());
    assert_eq!(got, want, "truncate runs the kept tokens");
    h.shutdown();
}

/// Streams `n_gen` greedy tokens past a window of 128 through the engine; checks the cache
/// stays within the window, the first tokens equal the unbounded run's, and a session with
/// the same policy gives the same tokens.
fn stream_past_the_window(name: &str) {
    let Some((model, tok)) = common::pulled(name) else {
        return;
    };
    let text = corpus(&tok);
    let prompt = &text[..40];
    let (n_ctx, n_gen) = (128, 300);
    let h = engine(&model, &tok, n_ctx);
    assert!(matches!(
        h.submit(greedy(prompt, n_gen, ContextPolicy::Error)),
        Err(SubmitError::TooLong { .. })
    ));
    let rx = h
        .submit(greedy(prompt, n_gen, ContextPolicy::Stream))
        .unwrap();
    let mut peak_blocks = 0;
    let mut toks = Vec::new();
    let mut rx = rx;
    let f = loop {
        match rx.blocking_recv().unwrap() {
            Event::Token(t) => {
                toks.push(t.token);
                peak_blocks = peak_blocks.max(h.stats().kv_used_blocks);
            }
            Event::Done(f) => break f,
            Event::Error(e) => panic!("{e}"),
        }
    };
    h.shutdown();
    assert_eq!(toks.len(), n_gen);
    assert_eq!(f.completion_tokens, n_gen);
    assert!(
        peak_blocks <= n_ctx / 16 + 1,
        "{peak_blocks} blocks used: the window is {} blocks",
        n_ctx / 16
    );
    // 40 + 300 tokens through a window of 128: everything but the window was evicted.
    assert!(f.dropped_tokens >= 40 + n_gen - n_ctx, "{f:?}");

    // Until the window is full, streaming changes nothing.
    let wide = engine(&model, &tok, 1024);
    let (unbounded, _) = drain(
        wide.submit(greedy(prompt, n_gen, ContextPolicy::Error))
            .unwrap(),
    );
    wide.shutdown();
    let before_full = n_ctx - prompt.len();
    assert_eq!(toks[..before_full], unbounded[..before_full]);

    // A session streaming the same request gives the same tokens.
    let mut session = Session::new(&model, n_ctx);
    session.set_context_policy(ContextPolicy::Stream).unwrap();
    let mut req = GenerateRequest::greedy(n_gen);
    req.ignore_eos = true;
    let gen = session.generate(&tok, prompt, &req, |_| {}).unwrap();
    assert_eq!(gen.tokens, toks, "engine and session stream alike");
    assert!(session.evicted_tokens() > 0);
    assert!(session.kv.used_blocks() <= n_ctx / 16);
}

#[test]
fn stream_past_the_window_qwen() {
    let _one = crate::common::one_at_a_time();
    stream_past_the_window("qwen2.5-coder-0.5b-instruct-q4_k_m");
}

#[test]
fn stream_past_the_window_gemma() {
    let _one = crate::common::one_at_a_time();
    stream_past_the_window("gemma-3-270m-q4_k_m");
}

/// After the window slides, the keys that moved hold what the model computes for their tokens
/// at their new positions. In layer 0 a key depends on its token and position only, so a fresh
/// session with the same tokens at those positions must agree, to f16 rounding.
#[test]
fn moved_keys_are_rotated_to_their_new_positions() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = common::pulled("qwen2.5-coder-0.5b-instruct-q4_k_m") else {
        return;
    };
    let text = corpus(&tok);
    let n_ctx = 64;
    let mut s = Session::new(&model, n_ctx);
    s.set_context_policy(ContextPolicy::Stream).unwrap();
    s.feed(&text[..60], 16, false).unwrap();
    s.feed(&text[60..70], 16, false).unwrap(); // slides: evicts one block after the sinks
    assert_eq!(s.evicted_tokens(), 16);
    // In the cache now: tokens 0..16 at positions 0..16, tokens 32..70 at positions 16..54.
    let kept: Vec<TokenId> = [&text[..16], &text[32..70]].concat();
    let mut fresh = Session::new(&model, n_ctx);
    fresh.set_prefix_caching(false);
    fresh.feed(&kept, 16, false).unwrap();
    let cfg = *s.kv.config();
    let (mut worst, mut scale) = (0f32, 0f32);
    for pos in 16..kept.len() {
        let (b1, slot1) = s.kv.slot(s.seq, pos).unwrap();
        let (b2, slot2) = fresh.kv.slot(fresh.seq, pos).unwrap();
        for h in 0..cfg.n_kv_heads {
            let d = cfg.head_dim_k;
            let a = &s.kv.block_keys(0, b1, h)[slot1 * d..(slot1 + 1) * d];
            let b = &fresh.kv.block_keys(0, b2, h)[slot2 * d..(slot2 + 1) * d];
            for (x, y) in a.iter().zip(b) {
                worst = worst.max((x.to_f32() - y.to_f32()).abs());
                scale = scale.max(y.to_f32().abs());
            }
        }
    }
    // f16 keeps 11 bits: a rotation re-rounds by up to half an ulp of the largest values.
    assert!(
        worst <= scale * 2e-3,
        "moved keys differ by {worst} (largest key component {scale})"
    );
    // And they did move: unrotated keys (positions off by 16) would be far off.
    assert!(scale > 1.0);
}

/// A streamed request whose prompt is longer than the window and already cached (the same
/// request again, prefix cache on): it takes at most a window of cached blocks and runs.
#[test]
fn a_cached_prompt_longer_than_the_window_streams() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = common::load_shared(
        common::shared_dir().join("golden/tiny-llama-random.gguf"),
        "the tiny random model",
    ) else {
        return;
    };
    let prompt: Vec<TokenId> = (0..300).map(|i| 10 + (i * 7 % 200) as TokenId).collect();
    let h = engine(&model, &tok, 128);
    for round in 0..2 {
        let (toks, f) = drain(
            h.submit(greedy(&prompt, 40, ContextPolicy::Stream))
                .unwrap(),
        );
        assert_eq!(toks.len(), 40, "round {round}");
        assert!(f.dropped_tokens >= 300 + 40 - 128, "round {round}: {f:?}");
        assert!(f.cached_tokens <= 128, "round {round}: {f:?}");
        assert_eq!(f.cached_tokens > 0, round == 1, "round {round}: {f:?}");
    }
    assert_eq!(h.stats().kv_used_blocks, 0);
    h.shutdown();
}
