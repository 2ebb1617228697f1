//! Speculation in the continuous-batching engine: many sequences, their drafts verified in
//! the same forward as everyone's decode tokens, give exactly the tokens, text, logprobs and
//! finish reasons of the engine without speculation (greedy and seeded sampling, stop strings,
//! both catalog models, a KV pool small enough to preempt, a streamed window), and every block
//! comes back.
//!
//! Run in release: `cargo test --release -p nucleus --test suite scheduler_speculation::`.

use crate::common;

use std::sync::Arc;

use nucleus::engine::scheduler::{
    Engine, EngineConfig, EngineStats, Finished, GenRequest, SpecConfig,
};
use nucleus::engine::ContextPolicy;
use nucleus::model::Model;
use nucleus::sampling::SamplingParams;
use nucleus::tokenizer::{TokenId, Tokenizer};

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const GEMMA: &str = "gemma-3-270m-q4_k_m";

/// Code the edits below make the model repeat.
const FUNCTIONS: [&str; 4] = [
    "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n        \
     if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n            \
     out.append(b[j])\n            j += 1\n    out.extend(a[i:])\n    out.extend(b[j:])\n    return out\n",
    "def word_counts(path):\n    counts = {}\n    with open(path) as f:\n        for line in f:\n            \
     for word in line.split():\n                counts[word] = counts.get(word, 0) + 1\n    return counts\n",
    "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n",
    "def flatten(items):\n    out = []\n    for item in items:\n        if isinstance(item, list):\n            \
     out.extend(flatten(item))\n        else:\n            out.append(item)\n    return out\n",
];

#[derive(Clone, Copy)]
enum Chat {
    ChatMl,
    Gemma,
}

/// Eight requests: code edits (which prompt lookup proposes well) and open-ended text (which it
/// does not), greedy and seeded sampling with penalties and logprobs, one with a stop string.
fn requests(tok: &Tokenizer, chat: Chat, max_tokens: usize) -> Vec<GenRequest> {
    let wrap = |s: String| match chat {
        Chat::ChatMl => format!("<|im_start|>user\n{s}<|im_end|>\n<|im_start|>assistant\n"),
        Chat::Gemma => format!("<start_of_turn>user\n{s}<end_of_turn>\n<start_of_turn>model\n"),
    };
    let mut texts: Vec<String> = FUNCTIONS
        .iter()
        .map(|f| {
            wrap(format!(
                "Add type hints to this function and return it whole:\n\n{f}"
            ))
        })
        .collect();
    texts.push(wrap(
        "Write a short story about a lighthouse keeper.".into(),
    ));
    texts.push(wrap("Explain how a hash map works.".into()));
    texts.push(wrap(format!(
        "Rename `out` to `result` in:\n\n{}",
        FUNCTIONS[0]
    )));
    texts.push(wrap(format!("Add a docstring to:\n\n{}", FUNCTIONS[3])));
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let prompt = tok.encode(t, true, true).unwrap();
            let sampling = match i % 2 {
                0 => SamplingParams {
                    logprobs: Some(2),
                    ..SamplingParams::greedy()
                },
                _ => SamplingParams {
                    temperature: 0.7,
                    top_p: 0.95,
                    repeat_penalty: 1.05,
                    seed: Some(100 + i as u64),
                    logprobs: Some(1),
                    ..Default::default()
                },
            };
            let mut r = GenRequest::new(prompt, sampling);
            r.max_tokens = Some(max_tokens);
            if i == 6 {
                r.stop = vec!["result.extend".into()];
            }
            r
        })
        .collect()
}

type Output = (
    Vec<(TokenId, Option<f32>, Vec<(TokenId, f32)>)>,
    String,
    Finished,
);

fn run_all(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    cfg: EngineConfig,
    reqs: &[GenRequest],
) -> (Vec<Output>, EngineStats) {
    let h = Engine::start(model.clone(), tok.clone(), cfg);
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

fn config(kv_tokens: usize, speculation: Option<SpecConfig>) -> EngineConfig {
    EngineConfig {
        max_running: 8,
        n_ctx: 1024,
        kv_tokens,
        speculation,
        ..Default::default()
    }
}

const NGRAM: Option<SpecConfig> = Some(SpecConfig { max_draft: 16 });

fn check_same_output(name: &str, chat: Chat) {
    let Some((model, tok)) = common::pulled(name) else {
        return;
    };
    let reqs = requests(&tok, chat, 96);
    let need: usize = reqs
        .iter()
        .map(|r| (r.prompt_tokens.len() + 96).div_ceil(16))
        .sum();
    let (plain, _) = run_all(&model, &tok, config(8192, None), &reqs);
    let (spec, stats) = run_all(&model, &tok, config(8192, NGRAM), &reqs);
    // A pool of ~40 % of what the eight need: preemption and recomputation, drafts dropped
    // when blocks run short.
    let (small, small_stats) = run_all(&model, &tok, config(need * 16 * 2 / 5, NGRAM), &reqs);
    eprintln!("{name}: {stats:?}\n{name}, small pool: {small_stats:?}");
    for (i, p) in plain.iter().enumerate() {
        for (what, s) in [
            ("speculation", &spec[i]),
            ("speculation, small pool", &small[i]),
        ] {
            assert_eq!(
                s.0, p.0,
                "{name}, request {i}, {what}: tokens or logprobs differ"
            );
            assert_eq!(s.1, p.1, "{name}, request {i}, {what}: text differs");
            assert_eq!(
                s.2.finish_reason, p.2.finish_reason,
                "{name}, request {i}, {what}"
            );
            assert_eq!(s.2.completion_tokens, p.2.completion_tokens);
        }
        assert_eq!(p.2.speculation.proposed, 0);
    }
    assert!(
        stats.spec_decode_num_accepted_tokens > 0
            && stats.spec_decode_num_accepted_tokens <= stats.spec_decode_num_draft_tokens,
        "{stats:?}"
    );
    let per_request: u64 = spec.iter().map(|s| s.2.speculation.accepted as u64).sum();
    assert_eq!(per_request, stats.spec_decode_num_accepted_tokens);
    assert!(small_stats.preemptions_total > 0, "{small_stats:?}");
    // Every block is back (cached prompt blocks stay for reuse, but no sequence holds one).
    for s in [&stats, &small_stats] {
        assert_eq!(s.kv_used_blocks, 0, "{s:?}");
        assert_eq!(s.running + s.waiting, 0);
    }
    // The stop string ended request 6 where it ends without speculation.
    assert!(!plain[6].1.contains("result.extend"));
}

#[test]
fn same_output_in_a_batch_qwen() {
    let _one = crate::common::one_at_a_time();
    check_same_output(QWEN, Chat::ChatMl);
}

#[test]
fn same_output_in_a_batch_gemma() {
    let _one = crate::common::one_at_a_time();
    // Gemma's sliding-window layers: rolled-back drafts must leave its window intact.
    check_same_output(GEMMA, Chat::Gemma);
}

#[test]
fn a_streamed_window_slides_as_without_speculation() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = common::pulled(QWEN) else {
        return;
    };
    // 300 tokens through a 128-token window, with code that the answer repeats.
    let mut reqs = requests(&tok, Chat::ChatMl, 300);
    reqs.truncate(3);
    for r in &mut reqs {
        r.context_policy = ContextPolicy::Stream;
        r.prompt_tokens.truncate(100);
        r.stop.clear();
        r.ignore_eos = true;
    }
    let cfg = |spec| EngineConfig {
        n_ctx: 128,
        ..config(4096, spec)
    };
    let (plain, _) = run_all(&model, &tok, cfg(None), &reqs);
    let (spec, stats) = run_all(&model, &tok, cfg(NGRAM), &reqs);
    for (i, (p, s)) in plain.iter().zip(&spec).enumerate() {
        assert_eq!(p.0.len(), 300);
        assert_eq!(s.0, p.0, "request {i}");
        assert!(s.2.dropped_tokens > 0 && s.2.dropped_tokens == p.2.dropped_tokens);
    }
    assert!(stats.spec_decode_num_drafts > 0, "{stats:?}");
    assert_eq!(stats.kv_used_blocks, 0);
}

/// Mixtures of experts in the engine: the tiny Qwen3-MoE fixtures (Q8_0/F16 experts, and
/// llama-quantize's Q4_K_M: Q4_K, Q6_K and Q5_0 experts) and gpt-oss (its
/// experts' routing, attention sinks and sliding window too) give the same tokens, logprobs
/// and text with prompt-lookup speculation as without, with a pool small enough to preempt,
/// in nucleus's arithmetic and in `--exact`; a verification's rows touch experts its tokens
/// would not touch alone, which must not change them.
#[test]
fn same_output_in_a_batch_moe_fixtures() {
    let _one = crate::common::one_at_a_time();
    use nucleus::model::Arithmetic;
    const GEN: usize = 160;
    for stem in ["qwen3moe", "qwen3moe-q4km", "gpt-oss"] {
        for arithmetic in [Arithmetic::Fast, Arithmetic::Exact] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("tests/data/arch/{stem}.gguf"));
            let model = Arc::new(Model::load_with(&path, 2, arithmetic).unwrap());
            let tok = Arc::new(Tokenizer::from_gguf(&model.file.metadata).unwrap());
            let mut reqs = requests(&tok, Chat::ChatMl, GEN);
            for r in &mut reqs {
                r.ignore_eos = true;
            }
            let need: usize = reqs
                .iter()
                .map(|r| (r.prompt_tokens.len() + GEN).div_ceil(16))
                .sum();
            let (plain, _) = run_all(&model, &tok, config(8192, None), &reqs);
            let (spec, stats) = run_all(&model, &tok, config(8192, NGRAM), &reqs);
            let small_cfg = config(need * 16 * 2 / 5, NGRAM);
            let (small, small_stats) = run_all(&model, &tok, small_cfg, &reqs);
            let at = format!("{stem} ({arithmetic:?})");
            for (i, p) in plain.iter().enumerate() {
                assert_eq!(p.0.len(), GEN, "{at}, request {i}");
                assert_eq!(spec[i].0, p.0, "{at}, request {i}: speculation");
                assert_eq!(spec[i].1, p.1, "{at}, request {i}: speculation's text");
                assert_eq!(small[i].0, p.0, "{at}, request {i}: small pool");
            }
            // Drafts were proposed and verified (random weights repeat themselves enough).
            assert!(stats.spec_decode_num_drafts > 0, "{at}: {stats:?}");
            assert!(small_stats.preemptions_total > 0, "{at}: {small_stats:?}");
            for s in [&stats, &small_stats] {
                assert_eq!(s.kv_used_blocks, 0, "{at}: {s:?}");
            }
        }
    }
}
