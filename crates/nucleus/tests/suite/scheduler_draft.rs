//! Draft-model speculation in the continuous-batching engine: many sequences, their draft
//! steps batched through the draft model and their proposals verified in the same forward as
//! everyone's decode tokens, give exactly the tokens, logprobs, text and finish reasons of
//! the engine without speculation (greedy, and seeded sampling: same seed, same output),
//! also when a small pool preempts them; every block of both pools comes back, also after
//! cancellation; a draft with another vocabulary is refused.
//!
//! The catalog qwen model is both the model and the draft (the draft's cost is set to nothing
//! so that it proposes as much as its acceptance allows; greedy requests accept everything,
//! sampled ones reject some).
//!
//! Run in release: `cargo test --release -p nucleus --test suite scheduler_draft::`.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use nucleus::engine::scheduler::{
    DraftModel, Engine, EngineConfig, EngineHandle, EngineStats, Event, Finished, GenRequest,
    SpecConfig,
};
use nucleus::model::Model;
use nucleus::sampling::SamplingParams;
use nucleus::tokenizer::{TokenId, Tokenizer};

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const GEMMA: &str = "gemma-3-270m-q4_k_m";

const CODE: &str = "def word_counts(path):\n    counts = {}\n    with open(path) as f:\n        \
    for line in f:\n            for word in line.split():\n                \
    counts[word] = counts.get(word, 0) + 1\n    return counts\n";

/// Eight chat requests, greedy (even) and seeded sampling with penalties (odd), logprobs.
fn requests(tok: &Tokenizer, max_tokens: usize) -> Vec<GenRequest> {
    requests_in(tok, max_tokens, false)
}

/// The requests in qwen's chat format, or gemma's.
fn requests_in(tok: &Tokenizer, max_tokens: usize, gemma: bool) -> Vec<GenRequest> {
    let asks = [
        format!("Add type hints to this function and return it whole:\n\n{CODE}"),
        "Write a short story about a lighthouse keeper.".to_string(),
        "Explain how a hash map works.".to_string(),
        format!("Rename `counts` to `tally` in:\n\n{CODE}"),
        "List five prime numbers and say why each is prime.".to_string(),
        format!("Add a docstring to:\n\n{CODE}"),
        "Write a haiku about the sea.".to_string(),
        "What is the capital of France? Answer in one sentence.".to_string(),
    ];
    asks.iter()
        .enumerate()
        .map(|(i, a)| {
            let text = match gemma {
                false => format!("<|im_start|>user\n{a}<|im_end|>\n<|im_start|>assistant\n"),
                true => format!("<start_of_turn>user\n{a}<end_of_turn>\n<start_of_turn>model\n"),
            };
            let prompt = tok.encode(&text, true, true).unwrap();
            let sampling = match i % 2 {
                0 => SamplingParams {
                    logprobs: Some(2),
                    ..SamplingParams::greedy()
                },
                _ => SamplingParams {
                    temperature: 0.8,
                    top_p: 0.95,
                    repeat_penalty: 1.05,
                    seed: Some(7 + i as u64),
                    logprobs: Some(1),
                    ..Default::default()
                },
            };
            let mut r = GenRequest::new(prompt, sampling);
            r.max_tokens = Some(max_tokens);
            r
        })
        .collect()
}

type Output = (
    Vec<(TokenId, Option<f32>, Vec<(TokenId, f32)>)>,
    String,
    Finished,
);

fn start(model: &Arc<Model>, tok: &Arc<Tokenizer>, cfg: EngineConfig, draft: bool) -> EngineHandle {
    let draft = draft.then(|| {
        DraftModel::new(model.clone(), tok, tok)
            .unwrap()
            .with_pass_cost(0.0)
    });
    if let Some(d) = &draft {
        cfg.check_with_draft(model, d.model()).unwrap();
    }
    Engine::start_with_draft(model.clone(), tok.clone(), cfg, draft)
}

fn run_all(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    cfg: EngineConfig,
    draft: bool,
    reqs: &[GenRequest],
) -> (Vec<Output>, EngineStats) {
    let h = start(model, tok, cfg, draft);
    let rxs: Vec<_> = reqs.iter().map(|r| h.submit(r.clone()).unwrap()).collect();
    let outs = rxs
        .into_iter()
        .map(|rx| {
            let (events, text, f) = common::drain_events(rx);
            let toks = events
                .into_iter()
                .map(|t| (t.token, t.logprob, t.top_logprobs))
                .collect();
            (toks, text, f)
        })
        .collect();
    let stats = h.stats();
    h.shutdown();
    (outs, stats)
}

fn config(kv_tokens: usize) -> EngineConfig {
    EngineConfig {
        max_running: 8,
        n_ctx: 1024,
        kv_tokens,
        speculation: Some(SpecConfig { max_draft: 8 }),
        ..Default::default()
    }
}

#[test]
fn draft_speculation_changes_no_output_in_a_batch_qwen() {
    let _one = crate::common::one_at_a_time();
    check_same_output(QWEN);
}

#[test]
fn draft_speculation_changes_no_output_in_a_batch_gemma() {
    let _one = crate::common::one_at_a_time();
    // Gemma has sliding-window layers: the draft's cache has a window pool too (these
    // sequences stay inside the window: its trimming is not reached).
    check_same_output(GEMMA);
}

fn check_same_output(name: &str) {
    let Some((model, tok)) = common::pulled(name) else {
        return;
    };
    let max_tokens = 48;
    let reqs = requests_in(&tok, max_tokens, name == GEMMA);
    let need: usize = reqs
        .iter()
        .map(|r| (r.prompt_tokens.len() + max_tokens).div_ceil(16))
        .sum();
    let plain_cfg = EngineConfig {
        speculation: None,
        ..config(8192)
    };
    let (plain, _) = run_all(&model, &tok, plain_cfg, false, &reqs);
    let (spec, stats) = run_all(&model, &tok, config(8192), true, &reqs);
    // A target pool of ~40 % of what the eight need: preemption frees both caches, and the
    // recomputed sequences' drafts catch up from nothing.
    let (small, small_stats) = run_all(&model, &tok, config(need * 16 * 2 / 5), true, &reqs);
    eprintln!("{name}, draft: {stats:?}\n{name}, draft, small pool: {small_stats:?}");
    for (i, p) in plain.iter().enumerate() {
        for (what, s) in [("draft", &spec[i]), ("draft, small pool", &small[i])] {
            assert_eq!(
                s.0, p.0,
                "{name}, request {i}, {what}: tokens or logprobs differ"
            );
            assert_eq!(s.1, p.1, "request {i}, {what}: text differs");
            assert_eq!(s.2.finish_reason, p.2.finish_reason, "request {i}, {what}");
            assert_eq!(s.2.completion_tokens, p.2.completion_tokens);
        }
        assert_eq!(p.2.speculation.proposed, 0);
    }
    // Greedy requests: the draft is the model, computing the same tokens with the same
    // arithmetic, so it proposes exactly what the model chooses, as long as its cache holds
    // the sequence's context (its catch-up and rollback are right).
    for (i, s) in spec.iter().enumerate().step_by(2) {
        let sp = s.2.speculation;
        assert!(
            sp.accepted == sp.proposed && sp.accepted > 0,
            "{name}, request {i}: {sp:?}"
        );
    }
    // Sampled ones reject some proposals, and still give the same tokens.
    let sampled = spec.iter().skip(1).step_by(2).map(|s| s.2.speculation);
    assert!(
        sampled.clone().any(|sp| sp.accepted < sp.proposed),
        "{:?}",
        sampled.collect::<Vec<_>>()
    );
    let per_request: u64 = spec.iter().map(|s| s.2.speculation.accepted as u64).sum();
    assert_eq!(per_request, stats.spec_decode_num_accepted_tokens);
    assert!(stats.spec_decode_num_drafts > 0);
    assert!(small_stats.preemptions_total > 0, "{small_stats:?}");
    for s in [&stats, &small_stats] {
        assert_eq!(s.kv_used_blocks, 0, "{s:?}");
        assert!(s.draft_kv_total_blocks > 0);
        assert_eq!(s.draft_kv_used_blocks, 0, "{s:?}");
        assert_eq!(s.running + s.waiting, 0);
    }
}

fn wait_until(h: &EngineHandle, what: &str, f: impl Fn(&EngineStats) -> bool) {
    let t0 = Instant::now();
    while !f(&h.stats()) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}: {:?}",
            h.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn cancelled_sequences_free_their_draft_blocks() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = common::pulled(QWEN) else {
        return;
    };
    let h = start(&model, &tok, config(8192), true);
    let mut rxs: Vec<_> = requests(&tok, 400)
        .into_iter()
        .take(4)
        .map(|r| h.submit(r).unwrap())
        .collect();
    // A few tokens each: every sequence is decoding, with drafts.
    for rx in &mut rxs {
        for _ in 0..4 {
            match rx.blocking_recv() {
                Some(Event::Token(_)) => {}
                other => panic!("expected a token, got {other:?}"),
            }
        }
    }
    wait_until(&h, "drafts", |s| {
        s.spec_decode_num_drafts > 0 && s.draft_kv_used_blocks > 0
    });
    // Cancel two, then the others.
    rxs.truncate(2);
    wait_until(&h, "two cancellations", |s| s.requests_cancelled == 2);
    assert!(h.stats().draft_kv_used_blocks > 0);
    drop(rxs);
    wait_until(&h, "every block back", |s| {
        s.running == 0 && s.kv_used_blocks == 0 && s.draft_kv_used_blocks == 0
    });
    assert_eq!(h.stats().requests_cancelled, 4);
    h.shutdown();
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let _one = crate::common::one_at_a_time();
    let (Some((qwen, qwen_tok)), Some((gemma, gemma_tok))) =
        (common::pulled(QWEN), common::pulled(GEMMA))
    else {
        return;
    };
    let err = DraftModel::new(gemma, &gemma_tok, &qwen_tok)
        .err()
        .expect("gemma cannot draft for qwen");
    assert!(err.contains("vocabular"), "{err}");
    assert!(DraftModel::new(qwen, &qwen_tok, &qwen_tok).is_ok());
}
