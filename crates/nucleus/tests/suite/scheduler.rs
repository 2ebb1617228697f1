//! The continuous-batching engine: batch invariance (a greedy request gives the same tokens
//! alone or among 16), preemption under a tiny KV pool, cancellation, the bounded queue.
//!
//! Run in release: `cargo test --release -p nucleus --test suite scheduler::`. Tests of the real models
//! skip (politely) when the models are absent, except in CI.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nucleus::engine::scheduler::{
    Engine, EngineConfig, EngineHandle, Event, Finished, GenRequest, SubmitError,
};
use nucleus::model::Model;
use nucleus::sampling::{FinishReason, SamplingParams};
use nucleus::tokenizer::{TokenId, Tokenizer};

fn load(path: &std::path::Path) -> (Arc<Model>, Arc<Tokenizer>) {
    let model = Model::load(path, 0).expect("load model");
    let tok = Tokenizer::from_gguf(&model.file.metadata).expect("tokenizer");
    (Arc::new(model), Arc::new(tok))
}

fn tiny() -> Option<(Arc<Model>, Arc<Tokenizer>)> {
    let path = common::shared_dir().join("golden/tiny-llama-random.gguf");
    common::require(&path, "the tiny random model").then(|| load(&path))
}

fn real(name: &str) -> Option<(Arc<Model>, Arc<Tokenizer>)> {
    let path = common::models_dir().join(format!("{name}.gguf"));
    common::require(&path, name).then(|| load(&path))
}

fn greedy(prompt: Vec<TokenId>, max_tokens: usize) -> GenRequest {
    let mut r = GenRequest::new(prompt, SamplingParams::greedy());
    r.max_tokens = Some(max_tokens);
    r.ignore_eos = true;
    r
}

fn prompts(tok: &Tokenizer, n: usize) -> Vec<Vec<TokenId>> {
    let topics = [
        "Write a Python function that reverses a string.",
        "What is the capital of France?",
        "Explain what a hash map is in one paragraph.",
        "List three prime numbers greater than 100.",
        "def fibonacci(n):",
        "The quick brown fox",
        "Translate 'good morning' into Spanish.",
        "Once upon a time, in a land far away,",
        "SELECT name FROM users WHERE",
        "How do I sort a list in Rust?",
        "fn main() {",
        "The three laws of thermodynamics are",
        "Write a haiku about the sea.",
        "#include <stdio.h>\nint main(void) {",
        "Summarise the plot of Hamlet.",
        "A short story about a robot learning to paint, with a twist at the end: it was",
    ];
    (0..n)
        .map(|i| {
            // Different lengths: repeat some prompts to make long ones.
            let text = topics[i % topics.len()].repeat(1 + (i % 4) * 3);
            tok.encode(&text, true, true).unwrap()
        })
        .collect()
}

fn start(model: &Arc<Model>, tok: &Arc<Tokenizer>, cfg: EngineConfig) -> EngineHandle {
    Engine::start(model.clone(), tok.clone(), cfg)
}

fn wait_until(h: &EngineHandle, what: &str, f: impl Fn(&EngineHandle) -> bool) {
    let t0 = Instant::now();
    while !f(h) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}: {:?}",
            h.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Each prompt alone, then all together; the greedy tokens of the batched run must equal those
/// of the lone runs for at least the first `must_match` tokens.
fn check_batch_invariance(model: &Arc<Model>, tok: &Arc<Tokenizer>, n_gen: usize, check: &[usize]) {
    let ps = prompts(tok, 16);
    let cfg = EngineConfig {
        max_running: 16,
        n_ctx: 1024,
        kv_tokens: 16 * 1024,
        ..Default::default()
    };
    let h = start(model, tok, cfg);
    let alone: Vec<Vec<TokenId>> = check
        .iter()
        .map(|&i| common::drain(h.submit(greedy(ps[i].clone(), n_gen)).unwrap()).0)
        .collect();
    let rxs: Vec<_> = ps
        .iter()
        .map(|p| h.submit(greedy(p.clone(), n_gen)).unwrap())
        .collect();
    let together: Vec<Vec<TokenId>> = rxs.into_iter().map(|rx| common::drain(rx).0).collect();
    let stats = h.stats();
    h.shutdown();
    assert!(
        stats.steps_total > 0 && stats.preemptions_total == 0,
        "{stats:?}"
    );
    for (k, &i) in check.iter().enumerate() {
        assert_eq!(alone[k].len(), n_gen);
        assert_eq!(
            together[i],
            alone[k],
            "request {i} ({} prompt tokens) differs between a lone run and a batch of 16",
            ps[i].len()
        );
    }
}

#[test]
fn batch_invariance_tiny_model() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = tiny() else { return };
    check_batch_invariance(&model, &tok, 32, &(0..16).collect::<Vec<_>>());
}

/// The real model, greedy, 32 tokens: identical alone and in a batch of 16. The batched forward
/// computes each token's row with the same kernels and the same summation order whatever the
/// batch holds (activations are quantized per row; attention is per sequence), so the logits
/// are bit-identical and greedy decoding cannot flip.
#[test]
fn batch_invariance_qwen() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = real("qwen2.5-coder-0.5b-instruct-q4_k_m") else {
        return;
    };
    check_batch_invariance(&model, &tok, 32, &[0, 5, 10, 15]);
}

#[test]
fn preemption_under_a_tiny_kv_pool_keeps_every_request_correct() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = tiny() else { return };
    let ps: Vec<Vec<TokenId>> = prompts(&tok, 8)
        .into_iter()
        .map(|p| p[..p.len().min(24)].to_vec())
        .collect();
    let n_gen = 40;
    // Reference: each alone with plenty of room.
    let h = start(&model, &tok, EngineConfig::default());
    let want: Vec<Vec<TokenId>> = ps
        .iter()
        .map(|p| common::drain(h.submit(greedy(p.clone(), n_gen)).unwrap()).0)
        .collect();
    h.shutdown();
    // Each sequence needs up to 64 tokens = 4 blocks; the pool has 10: at most two fit at once
    // when grown, but admission lets in more while they are short.
    let cfg = EngineConfig {
        max_running: 8,
        kv_tokens: 160,
        block_size: 16,
        step_token_budget: 32,
        n_ctx: 128,
        ..Default::default()
    };
    let h = start(&model, &tok, cfg);
    let rxs: Vec<_> = ps
        .iter()
        .map(|p| h.submit(greedy(p.clone(), n_gen)).unwrap())
        .collect();
    let got: Vec<(Vec<TokenId>, String, Finished)> = rxs.into_iter().map(common::drain).collect();
    let stats = h.stats();
    h.shutdown();
    assert!(
        stats.preemptions_total > 0,
        "no preemption happened: {stats:?}"
    );
    assert!(got.iter().any(|g| g.2.preemptions > 0));
    for (i, (toks, _, fin)) in got.iter().enumerate() {
        assert_eq!(fin.finish_reason, FinishReason::Length);
        assert_eq!(fin.completion_tokens, n_gen);
        assert_eq!(
            toks, &want[i],
            "request {i} (preempted {} times) differs from its lone run",
            fin.preemptions
        );
    }
    assert_eq!(stats.requests_finished, 8);
}

#[test]
fn dropping_the_receiver_cancels_and_frees_blocks() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = tiny() else { return };
    let h = start(&model, &tok, EngineConfig::default());
    let p = prompts(&tok, 1).remove(0);
    let mut rx = h.submit(greedy(p.clone(), 1500)).unwrap();
    for _ in 0..3 {
        assert!(matches!(rx.blocking_recv(), Some(Event::Token(_))));
    }
    assert!(h.stats().kv_used_blocks > 0);
    drop(rx);
    wait_until(&h, "the cancelled sequence to leave", |h| {
        let s = h.stats();
        s.running == 0 && s.kv_used_blocks == 0
    });
    let s = h.stats();
    assert_eq!(s.requests_cancelled, 1);
    assert!(s.generation_tokens_total < 1500, "{s:?}");
    // The engine keeps serving.
    let (toks, _, _) = common::drain(h.submit(greedy(p, 5)).unwrap());
    assert_eq!(toks.len(), 5);
    h.shutdown();
}

/// The tiny model's engine with one running sequence and a queue of two, and a prompt.
fn small_queue() -> Option<(EngineHandle, Vec<TokenId>)> {
    let (model, tok) = tiny()?;
    let cfg = EngineConfig {
        max_running: 1,
        queue_capacity: 2,
        ..Default::default()
    };
    Some((start(&model, &tok, cfg), prompts(&tok, 1).remove(0)))
}

#[test]
fn a_full_queue_rejects_and_accepted_requests_complete() {
    let _one = crate::common::one_at_a_time();
    let Some((h, p)) = small_queue() else { return };
    let mut accepted = Vec::new();
    let mut rejected = 0;
    for _ in 0..6 {
        match h.submit(greedy(p.clone(), 20)) {
            Ok(rx) => accepted.push(rx),
            Err(SubmitError::QueueFull(_)) => rejected += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(rejected >= 3, "rejected {rejected}");
    assert!(accepted.len() >= 2);
    for rx in accepted {
        assert_eq!(common::drain(rx).0.len(), 20);
    }
    h.shutdown();
    assert!(matches!(
        h.submit(greedy(p, 1)),
        Err(SubmitError::ShuttingDown)
    ));
}

/// A queued request its client abandoned holds no place: once the queue is full, dropping the
/// waiting requests' receivers lets a new request in (at once when they were still in the inbox,
/// by the scheduler's next step when it had taken them), while the running one goes on.
#[test]
fn abandoned_queued_requests_free_their_places() {
    let _one = crate::common::one_at_a_time();
    let Some((h, p)) = small_queue() else { return };
    let running = h.submit(greedy(p.clone(), 1500)).unwrap();
    wait_until(&h, "the first request to run", |h| h.stats().running == 1);
    let queued: Vec<_> = (0..2)
        .map(|_| h.submit(greedy(p.clone(), 5)).unwrap())
        .collect();
    assert!(matches!(
        h.submit(greedy(p.clone(), 5)),
        Err(SubmitError::QueueFull(2))
    ));
    drop(queued);
    let t0 = Instant::now();
    let late = loop {
        match h.submit(greedy(p.clone(), 5)) {
            Ok(rx) => break rx,
            Err(SubmitError::QueueFull(_)) if t0.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => panic!("the abandoned requests still hold the queue: {e}"),
        }
    };
    assert_eq!(
        h.stats().requests_finished,
        0,
        "the running request ended first"
    );
    drop(running);
    assert_eq!(common::drain(late).0.len(), 5);
    h.shutdown();
}

#[test]
fn bad_requests_are_refused_at_submit() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = tiny() else { return };
    let cfg = EngineConfig {
        n_ctx: 64,
        ..Default::default()
    };
    let h = start(&model, &tok, cfg);
    assert_eq!(
        h.submit(greedy(vec![], 4)).unwrap_err(),
        SubmitError::EmptyPrompt
    );
    assert!(matches!(
        h.submit(greedy(vec![1; 60], 10)),
        Err(SubmitError::TooLong { .. })
    ));
    let mut bad = greedy(vec![1, 2, 3], 4);
    bad.sampling.top_p = 2.0;
    assert!(matches!(h.submit(bad), Err(SubmitError::Sampling(_))));
    h.shutdown();
}

#[test]
fn stop_strings_and_seeded_sampling_per_request() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = tiny() else { return };
    let h = start(&model, &tok, EngineConfig::default());
    let p = prompts(&tok, 1).remove(0);
    // Find a piece of text the model produces, then ask it to stop there.
    let (_, text, _) = common::drain(h.submit(greedy(p.clone(), 12)).unwrap());
    let cut = text.char_indices().nth(text.chars().count() / 2).unwrap().0;
    let stop: String = text[cut..].chars().take(3).collect();
    let mut r = greedy(p.clone(), 12);
    r.stop = vec![stop.clone()];
    let (_, stopped, fin) = common::drain(h.submit(r).unwrap());
    assert_eq!(fin.finish_reason, FinishReason::Stop);
    assert!(
        text.starts_with(&stopped) && !stopped.contains(&stop),
        "{stopped:?} / {stop:?}"
    );
    // Seeded sampling: same seed, same text, even when run together.
    let seeded = |seed| {
        let mut r = GenRequest::new(p.clone(), SamplingParams::unrestricted(seed));
        r.max_tokens = Some(16);
        r.ignore_eos = true;
        r
    };
    let a = h.submit(seeded(7)).unwrap();
    let b = h.submit(seeded(7)).unwrap();
    let c = h.submit(seeded(8)).unwrap();
    let (a, b, c) = (common::drain(a).0, common::drain(b).0, common::drain(c).0);
    assert_eq!(a, b);
    assert_ne!(a, c);
    h.shutdown();
}
