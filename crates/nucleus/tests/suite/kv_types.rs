//! Quantized KV caches on a real model: a Q8_0 cache keeps batch invariance (a request's
//! tokens do not depend on the batch around it or on how its prompt is chunked), gives
//! sensible greedy text, and its memory is what `bytes_per_token` says.
//!
//! Run in release: `cargo test --release -p nucleus --test suite kv_types::`.

use crate::common;

use std::sync::Arc;

use nucleus::engine::scheduler::{Engine, EngineConfig, Event, GenRequest};
use nucleus::engine::{GenerateRequest, Session};
use nucleus::kv_cache::KvType;
use nucleus::model::Model;
use nucleus::sampling::SamplingParams;
use nucleus::tokenizer::{TokenId, Tokenizer};

fn drain(rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Vec<TokenId> {
    common::drain(rx).0
}

#[test]
fn q8_0_cache_is_batch_invariant_and_sensible() {
    let _one = crate::common::one_at_a_time();
    let path = common::models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    if !common::require(&path, "qwen2.5-coder-0.5b-instruct") {
        return;
    }
    let model = Arc::new(Model::load(&path, 0).unwrap());
    let tok = Arc::new(Tokenizer::from_gguf(&model.file.metadata).unwrap());
    let prompts: Vec<Vec<TokenId>> = [
        "def fibonacci(n):",
        "The quick brown fox jumps over the lazy dog. "
            .repeat(12)
            .as_str(),
        "SELECT name FROM users WHERE",
        "fn main() {",
    ]
    .iter()
    .map(|p| tok.encode(p, true, true).unwrap())
    .collect();
    let greedy = |p: &[TokenId]| {
        let mut r = GenRequest::new(p.to_vec(), SamplingParams::greedy());
        r.max_tokens = Some(24);
        r.ignore_eos = true;
        r
    };
    let cfg = EngineConfig {
        kv_type: KvType::Q8_0,
        step_token_budget: 48, // the long prompt is chunked
        prefix_caching: false,
        ..Default::default()
    };
    let h = Engine::start(model.clone(), tok.clone(), cfg);
    let alone: Vec<Vec<TokenId>> = prompts
        .iter()
        .map(|p| drain(h.submit(greedy(p)).unwrap()))
        .collect();
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| h.submit(greedy(p)).unwrap())
        .collect();
    let together: Vec<Vec<TokenId>> = rxs.into_iter().map(drain).collect();
    h.shutdown();
    assert_eq!(
        alone, together,
        "a Q8_0 cache's outputs depend on the batch"
    );
    // A session computes the prompt in one chunk: the same tokens.
    let mut s = Session::with_kv_type(&model, 1024, 1024, KvType::Q8_0).unwrap();
    let mut req = GenerateRequest::greedy(24);
    req.ignore_eos = true;
    let gen = s.generate(&tok, &prompts[1], &req, |_| {}).unwrap();
    assert_eq!(
        gen.tokens, alone[1],
        "chunking changed a Q8_0 cache's output"
    );
    // Sensible code from the coder model.
    let text = tok.decode(&alone[0], true);
    assert!(text.contains("return") || text.contains("fib"), "{text:?}");
    // The memory is the formula's: rows of 64 values, 34 bytes per 32 in Q8_0.
    let hp = &model.hp;
    assert_eq!(
        s.kv.config().bytes_per_token(),
        hp.n_layers * hp.n_head_kv * 2 * (hp.head_dim / 32 * 34)
    );
    // A head dimension a type cannot hold is an error, not a panic: none here, all fit.
    assert!(Session::with_kv_type(&model, 64, 64, KvType::Q4_0).is_ok());
}
