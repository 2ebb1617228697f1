//! Automatic prefix caching on the real models: a request served from cached blocks produces
//! exactly what the same request produces on a fresh engine (same tokens, same logprobs to the
//! bit), for shared prefixes that end inside a block, on a block edge, and past one prefill
//! chunk; in `--exact`, a prefix computed with other arithmetic is not reused; `n` identical prompts
//! submitted together compute their prefix once.
//!
//! Run in release: `cargo test --release -p nucleus --test suite prefix_cache::`. Skips politely when
//! the models or `../shared` are absent, except in CI.

use crate::common;

use std::sync::Arc;

use nucleus::engine::scheduler::{Engine, EngineConfig, Event, Finished, GenRequest};
use nucleus::engine::{GenerateRequest, Generation, Session};
use nucleus::kernels::PromptSlot;
use nucleus::model::{arithmetic_class, Arithmetic, Model};
use nucleus::sampling::SamplingParams;
use nucleus::tokenizer::{TokenId, Tokenizer};
use tokio::sync::mpsc::UnboundedReceiver;

const BLOCK: usize = 16;
const N_GEN: usize = 16;

fn real(name: &str) -> Option<(Arc<Model>, Arc<Tokenizer>, Vec<TokenId>)> {
    real_in(name, Arithmetic::from_env())
}

fn real_in(
    name: &str,
    arithmetic: Arithmetic,
) -> Option<(Arc<Model>, Arc<Tokenizer>, Vec<TokenId>)> {
    let path = common::models_dir().join(format!("{name}.gguf"));
    let corpus = common::shared_dir().join("corpus/python-stdlib.txt");
    if !common::require(&path, name) || !common::require(&corpus, "the corpus") {
        return None;
    }
    let model = Model::load_with(&path, 0, arithmetic).expect("load model");
    let tok = Tokenizer::from_gguf(&model.file.metadata).expect("tokenizer");
    let text = std::fs::read_to_string(corpus).expect("read the corpus");
    let ids = tok.encode(&text, true, false).expect("tokenize the corpus");
    Some((Arc::new(model), Arc::new(tok), ids))
}

/// Every token event (id, logprob bits, top logprob bits) and the end of a request.
type Output = (Vec<(TokenId, u32, Vec<(TokenId, u32)>)>, Finished);

fn drain(mut rx: UnboundedReceiver<Event>) -> Output {
    let mut toks = Vec::new();
    loop {
        match rx
            .blocking_recv()
            .expect("every request ends with an event")
        {
            Event::Token(t) => toks.push((
                t.token,
                t.logprob.expect("logprobs asked").to_bits(),
                t.top_logprobs
                    .iter()
                    .map(|&(id, lp)| (id, lp.to_bits()))
                    .collect(),
            )),
            Event::Done(f) => return (toks, f),
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
}

/// Seeded sampling with logprobs: the output shows any change in the logits' bits.
fn request(prompt: Vec<TokenId>, seed: u64) -> GenRequest {
    let mut sampling = SamplingParams::unrestricted(seed);
    sampling.logprobs = Some(3);
    let mut r = GenRequest::new(prompt, sampling);
    r.max_tokens = Some(N_GEN);
    r.ignore_eos = true;
    r
}

fn config(prefix_caching: bool) -> EngineConfig {
    EngineConfig {
        max_running: 8,
        n_ctx: 1024,
        kv_tokens: 8 * 1024,
        block_size: BLOCK,
        step_token_budget: 256,
        prefix_caching,
        ..Default::default()
    }
}

/// Prompt tokens a second prompt can take from the first one's blocks: the full blocks before
/// its last token whose tokens, and the arithmetic each token gets, are the same in both.
fn expected_hit(arithmetic: Arithmetic, first: &[TokenId], second: &[TokenId]) -> usize {
    let class = |p: &[TokenId], i: usize| {
        arithmetic_class(
            arithmetic,
            PromptSlot {
                len: p.len(),
                index: i,
                all_logits: false,
            },
        )
    };
    let same =
        |i: usize| i < first.len() && first[i] == second[i] && class(first, i) == class(second, i);
    let mut blocks = 0;
    while (blocks + 1) * BLOCK < second.len() && (blocks * BLOCK..(blocks + 1) * BLOCK).all(same) {
        blocks += 1;
    }
    blocks * BLOCK
}

/// Request `second` after `first` on one engine, and alone on a fresh engine: same output.
fn check_cached_equals_fresh(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    first: Vec<TokenId>,
    second: Vec<TokenId>,
    want_hit: usize,
    case: &str,
) {
    assert_eq!(
        expected_hit(model.arithmetic(), &first, &second),
        want_hit,
        "{case}: test setup"
    );
    let warm = Engine::start(model.clone(), tok.clone(), config(true));
    let (_, f1) = drain(warm.submit(request(first, 1)).unwrap());
    assert_eq!(f1.cached_tokens, 0, "{case}: nothing cached yet");
    let (cached, f2) = drain(warm.submit(request(second.clone(), 7)).unwrap());
    let stats = warm.stats();
    warm.shutdown();
    assert_eq!(f2.cached_tokens, want_hit, "{case}: cached tokens");
    assert_eq!(stats.prefix_cache_hits_tokens, want_hit as u64, "{case}");

    let fresh = Engine::start(model.clone(), tok.clone(), config(false));
    let (alone, f3) = drain(fresh.submit(request(second, 7)).unwrap());
    fresh.shutdown();
    assert_eq!(f3.cached_tokens, 0);
    assert_eq!(cached.len(), N_GEN);
    assert_eq!(
        cached, alone,
        "{case}: a request served from the prefix cache differs from a fresh engine's"
    );
}

fn cached_equals_fresh(name: &str) {
    for arithmetic in [Arithmetic::Fast, Arithmetic::Exact] {
        let Some((model, tok, text)) = real_in(name, arithmetic) else {
            return;
        };
        let suffix_a = &text[2000..2024];
        let suffix_b = &text[3000..3024];
        let cat = |a: &[TokenId], b: &[TokenId]| [a, b].concat();
        // Shared prefixes: inside a block (37), on a block edge (48), longer than one prefill
        // chunk of 256 (300), longer than gemma's sliding window of 512 (700). `--exact` only
        // on the one past a chunk (its other cases are the same code).
        let cases: &[(usize, usize)] = match arithmetic {
            Arithmetic::Fast => &[(37, 32), (48, 48), (300, 288), (700, 688)],
            Arithmetic::Exact => &[(300, 288)],
        };
        for &(shared, want_hit) in cases {
            let s = &text[..shared];
            check_cached_equals_fresh(
                &model,
                &tok,
                cat(s, suffix_a),
                cat(s, suffix_b),
                want_hit,
                &format!("{name}, {arithmetic:?}, {shared} shared tokens"),
            );
        }
        // The same 37 tokens, but the second prompt reaches llama.cpp's tiled attention (64+
        // tokens) and the first does not. In `--exact` their keys would differ in the last
        // bits, so nothing is taken from the cache; nucleus's own arithmetic computes them
        // alike, so the blocks are taken. Either way the output is that of a fresh engine.
        let s = &text[..37];
        let want_hit = match arithmetic {
            Arithmetic::Fast => 32,
            Arithmetic::Exact => 0,
        };
        check_cached_equals_fresh(
            &model,
            &tok,
            cat(s, suffix_a),
            cat(s, &text[3000..3040]),
            want_hit,
            &format!("{name}, {arithmetic:?}, prompts on both sides of 64 tokens"),
        );
    }
}

#[test]
fn cached_equals_fresh_qwen() {
    let _one = crate::common::one_at_a_time();
    cached_equals_fresh("qwen2.5-coder-0.5b-instruct-q4_k_m");
}

#[test]
fn cached_equals_fresh_gemma() {
    let _one = crate::common::one_at_a_time();
    cached_equals_fresh("gemma-3-270m-q4_k_m");
}

/// `n` identical prompts submitted together (the server's `n > 1`): the prefix is computed
/// once, the others wait for its blocks, and every choice is what it would be alone.
#[test]
fn identical_prompts_together_compute_the_prefix_once() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok, text)) = real("gemma-3-270m-q4_k_m") else {
        return;
    };
    let prompt = text[..300].to_vec();
    let h = Engine::start(model.clone(), tok.clone(), config(true));
    let rxs: Vec<_> = (0..4)
        .map(|seed| h.submit(request(prompt.clone(), seed)).unwrap())
        .collect();
    let outs: Vec<Output> = rxs.into_iter().map(drain).collect();
    let stats = h.stats();
    h.shutdown();
    let hit = (prompt.len() - 1) / BLOCK * BLOCK;
    let cached: Vec<usize> = outs.iter().map(|o| o.1.cached_tokens).collect();
    assert_eq!(cached, [0, hit, hit, hit], "{stats:?}");
    let computed = prompt.len() + 3 * (prompt.len() - hit) + 4 * N_GEN;
    assert!(
        stats.forward_tokens_total as usize <= computed,
        "{stats:?}: the prefix was computed more than once"
    );
    assert_eq!(stats.prefix_cache_queries_tokens, 4 * prompt.len() as u64);
    assert_eq!(stats.prefix_cache_hits_tokens, 3 * hit as u64);
    for (seed, out) in outs.iter().enumerate() {
        let fresh = Engine::start(model.clone(), tok.clone(), config(false));
        let alone = drain(fresh.submit(request(prompt.clone(), seed as u64)).unwrap());
        fresh.shutdown();
        assert_eq!(
            out.0, alone.0,
            "choice {seed} differs from the same request alone"
        );
    }
}

/// The CLI's sessions (`run`, `chat`, beams): a prompt fed after `reset` takes the blocks of an
/// earlier prompt of the session and gives what a fresh session gives, sampling and beams alike.
#[test]
fn session_reuses_earlier_prompts_with_the_same_output() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok, text)) = real("qwen2.5-coder-0.5b-instruct-q4_k_m") else {
        return;
    };
    let first = [&text[..200], &text[2000..2030]].concat();
    let second = [&text[..200], &text[3000..3030]].concat();
    let mut sampled = GenerateRequest::greedy(N_GEN);
    sampled.sampling = SamplingParams::unrestricted(5);
    sampled.sampling.logprobs = Some(2);
    sampled.ignore_eos = true;
    let mut beams = GenerateRequest::greedy(N_GEN);
    beams.beams = 3;
    let kv_tokens = Session::kv_tokens_for_beams(1024, 3, N_GEN);
    for req in [sampled, beams] {
        let run = |s: &mut Session, p: &[TokenId]| -> Generation {
            s.reset();
            s.generate(&tok, p, &req, |_| {}).unwrap()
        };
        let mut warm = Session::with_kv_tokens(&model, 1024, kv_tokens);
        assert_eq!(run(&mut warm, &first).cached_tokens, 0);
        let cached = run(&mut warm, &second);
        assert_eq!(
            cached.cached_tokens,
            expected_hit(model.arithmetic(), &first, &second)
        );
        assert_eq!(cached.cached_tokens, 192);
        let mut fresh = Session::with_kv_tokens(&model, 1024, kv_tokens);
        fresh.set_prefix_caching(false);
        let alone = run(&mut fresh, &second);
        assert_eq!(alone.cached_tokens, 0);
        assert_eq!(cached.tokens, alone.tokens, "beams: {}", req.beams);
        let bits = |g: &Generation| -> Vec<u32> {
            let lps = g.logprobs.iter().flatten().map(|l| l.logprob.to_bits());
            lps.chain(g.sum_logprob.map(f32::to_bits)).collect()
        };
        assert_eq!(bits(&cached), bits(&alone), "beams: {}", req.beams);
    }
}
