//! gemma-3's sliding-window layers hold only their window (512 tokens): the blocks that fall
//! out of it go back to their pool as the sequence grows. Nothing they free is ever read
//! again, so the output is the same, to the bit, as with a cache that keeps every layer's
//! whole context, for a long prompt, a prompt taken from the prefix cache, and a streamed
//! context running past its window; and the cache takes what the formula says.
//!
//! Run in release: `cargo test --release -p nucleus --test suite sliding_window::`.

use crate::common;

use std::sync::Arc;

use nucleus::engine::scheduler::{Engine, EngineConfig, GenRequest};
use nucleus::engine::{ContextPolicy, GenerateRequest, Session, BLOCK_SIZE, MAX_CHUNK};
use nucleus::kv_cache::{window_blocks_per_seq, KvConfig, KvType};
use nucleus::model::Model;
use nucleus::sampling::SamplingParams;
use nucleus::tokenizer::{TokenId, Tokenizer};

const GEMMA: &str = "gemma-3-270m-q4_k_m";

fn gemma() -> Option<(Model, Tokenizer, Vec<TokenId>)> {
    let path = common::models_dir().join(format!("{GEMMA}.gguf"));
    let corpus = common::shared_dir().join("corpus/python-stdlib.txt");
    if !common::require(&path, GEMMA) || !common::require(&corpus, "the corpus") {
        return None;
    }
    let model = Model::load(&path, 0).expect("load model");
    let tok = Tokenizer::from_gguf(&model.file.metadata).expect("tokenizer");
    let text = std::fs::read_to_string(corpus).expect("read the corpus");
    let ids = tok.encode(&text, true, false).expect("tokenize the corpus");
    Some((model, tok, ids))
}

/// Every layer in one pool that keeps the whole context: the cache before sliding windows.
fn whole_context(model: &Model, n_ctx: usize, ty: KvType) -> KvConfig {
    KvConfig {
        sliding: None,
        ..model.kv_config(n_ctx, BLOCK_SIZE, ty)
    }
}

fn greedy(n: usize) -> GenerateRequest {
    let mut req = GenerateRequest::greedy(n);
    req.ignore_eos = true;
    req
}

#[test]
fn long_prompt_same_logits_with_less_memory() {
    let _one = crate::common::one_at_a_time();
    let Some((model, _, text)) = gemma() else {
        return;
    };
    let window = model
        .hp
        .sliding_window
        .expect("gemma-3 has a sliding window");
    let (n_ctx, prompt) = (2048, &text[..1100]);
    let mut windowed = Session::new(&model, n_ctx);
    let mut whole =
        Session::with_kv_config(&model, n_ctx, whole_context(&model, n_ctx, KvType::F16)).unwrap();
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let mut a = windowed.feed(prompt, 256, false).unwrap();
    let b = whole.feed(prompt, 256, false).unwrap();
    assert!(same(&a, &b), "prompt logits");
    for step in 0..16 {
        let next = nucleus::engine::argmax(&a);
        a = windowed.feed(&[next], 1, false).unwrap();
        let b = whole.feed(&[next], 1, false).unwrap();
        assert!(same(&a, &b), "logits of greedy step {step}");
    }
    // What the window layers hold: their window and a block or two beside it (the sink, the
    // edges), instead of all 1,116 tokens; their pool, a window and a chunk.
    let per_seq = window_blocks_per_seq(window, MAX_CHUNK, BLOCK_SIZE);
    assert!(windowed.kv.window_used_blocks() <= window / BLOCK_SIZE + 3);
    assert!(whole.kv.used_blocks() >= 1116 / BLOCK_SIZE);

    // The bytes both pools take, for each type: 3 global layers for the context, 15 local
    // ones for the window pool.
    let local_layers = (0..model.hp.n_layers)
        .filter(|&l| model.hp.layer_window(l).is_some())
        .count();
    assert_eq!(
        local_layers, 15,
        "gemma-3-270m: 18 layers, every sixth global"
    );
    for ty in [KvType::F16, KvType::Q8_0, KvType::Q4_0] {
        let s = Session::with_kv_type(&model, n_ctx, n_ctx, ty).unwrap();
        let cfg = *s.kv.config();
        assert_eq!(cfg.sliding.expect("a window pool").n_blocks, per_seq);
        let layer = cfg.layer_bytes_per_token();
        assert_eq!(
            s.kv.total_bytes(),
            BLOCK_SIZE * layer * (3 * n_ctx / BLOCK_SIZE + 15 * per_seq),
            "{ty}"
        );
        let w = Session::with_kv_config(&model, n_ctx, whole_context(&model, n_ctx, ty)).unwrap();
        assert_eq!(w.kv.total_bytes(), layer * 18 * n_ctx, "{ty}");
    }
}

#[test]
fn streamed_context_past_the_window_same_tokens() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok, text)) = gemma() else {
        return;
    };
    // A context of 768 > 512: the windows are full long before the context slides.
    let n_ctx = 768;
    let prompt = &text[..700];
    let mut windowed = Session::new(&model, n_ctx);
    let mut whole =
        Session::with_kv_config(&model, n_ctx, whole_context(&model, n_ctx, KvType::F16)).unwrap();
    let mut outs = Vec::new();
    for s in [&mut windowed, &mut whole] {
        s.set_context_policy(ContextPolicy::Stream).unwrap();
        outs.push(
            s.generate(&tok, prompt, &greedy(160), |_| {})
                .unwrap()
                .tokens,
        );
        assert!(s.evicted_tokens() > 0, "the context slid");
    }
    assert_eq!(outs[0], outs[1]);
}

/// Through the engine: a second request that shares 1,200 prompt tokens with the first takes
/// them from the prefix cache (the window pool still holds the window of their end) and
/// generates what a fresh engine generates.
#[test]
fn prefix_cache_across_the_window_engine() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok, text)) = gemma() else {
        return;
    };
    let (model, tok) = (Arc::new(model), Arc::new(tok));
    let shared = &text[..1200];
    let first = [shared, &text[3000..3020]].concat();
    let second = [shared, &text[4000..4020]].concat();
    let request = |p: &[TokenId]| {
        let mut r = GenRequest::new(p.to_vec(), SamplingParams::unrestricted(5));
        r.max_tokens = Some(16);
        r.ignore_eos = true;
        r
    };
    let config = |prefix_caching| EngineConfig {
        n_ctx: 2048,
        kv_tokens: 4096,
        max_running: 4,
        prefix_caching,
        ..Default::default()
    };
    let warm = Engine::start(model.clone(), tok.clone(), config(true));
    let kv = config(true).kv_config(&model);
    assert!(
        kv.sliding.unwrap().n_blocks < kv.n_blocks,
        "the window pool is the smaller"
    );
    let _ = common::drain(warm.submit(request(&first)).unwrap());
    let (cached, _, f) = common::drain(warm.submit(request(&second)).unwrap());
    warm.shutdown();
    assert_eq!(f.cached_tokens, 1200 / BLOCK_SIZE * BLOCK_SIZE);
    let fresh = Engine::start(model, tok, config(false));
    let (alone, _, f) = common::drain(fresh.submit(request(&second)).unwrap());
    fresh.shutdown();
    assert_eq!(f.cached_tokens, 0);
    assert_eq!(cached, alone);
}
