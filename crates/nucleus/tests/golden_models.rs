//! Conformance with llama.cpp on the same GGUF files (`../shared/golden/*.jsonl`).
//!
//! For each prompt: the tokenization must be identical; fed the prompt (one batch) and then the
//! reference's greedy tokens (one at a time, as the reference was made), our top-1 must equal
//! the reference's wherever its top-2 margin is large enough, and our logits for the reference's
//! top-8 ids must stay close to its; run free, our greedy continuation must equal the
//! reference's for its first 32 tokens, or part from it only at a near-tie.
//!
//! How close is "close" depends on the CPU. The golden files were made on an AVX-512 machine,
//! and ggml's AVX-512 kernels sum floats in another order than its AVX2 ones; 8-bit activation
//! quantization then turns last-bit differences into whole rounding steps, layer after layer.
//! On a CPU without AVX-512, llama.cpp itself (built from the same vendored source, run the same
//! way) misses its own golden files by much more than the issue's 0.3. Measured with
//! `scripts/llama_cpp_selfcheck.sh` on the 2-core AVX2 development machine:
//!
//! | model        | top-8 logit gap | top-1 flips (margin ≥ 0.1) | free run parts at margin |
//! |--------------|-----------------|----------------------------|--------------------------|
//! | tiny-llama   | 0.100           | 0                          | 0.054                    |
//! | qwen2.5 0.5B | 0.589           | 0                          | 0.009                    |
//! | gemma-3 270M | 1.707           | 3 (of 65)                  | 0.147                    |
//!
//! So the issue's criteria (0.3 / 0.1 / 0.05) are asserted where llama.cpp itself meets them:
//! on AVX-512 machines, and for tiny-llama everywhere. For qwen and gemma on other CPUs the
//! logit bound is llama.cpp's own spread above, rounded up (see [`criteria`]); the test prints
//! our figures next to the bounds.

mod common;

use nucleus::engine::{argmax, GenerateRequest, Session};
use nucleus::model::Model;
use nucleus::tokenizer::Tokenizer;
use serde_json::Value;

const FREE_RUN_TOKENS: usize = 32;

/// What a model must meet against its golden file.
#[derive(Clone, Copy, Debug)]
struct Criteria {
    /// Largest allowed |ours − reference| over the reference's top-8 logits.
    logit_tol: f32,
    /// Top-1 must agree wherever the reference's top-2 margin is at least this.
    top1_margin: f32,
    /// The free run may part from the reference only where its top-2 margin is below this.
    near_tie: f32,
}

/// The issue's criteria.
const ISSUE: Criteria = Criteria {
    logit_tol: 0.3,
    top1_margin: 0.1,
    near_tie: 0.05,
};

fn reference_reproducible_here() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The criteria for `golden_name` on this CPU (see the module documentation for the numbers).
///
/// Without AVX-512, the logit bound δ is llama.cpp's own spread against its golden file, rounded
/// up. Once each logit may be off by δ, a top-2 margin below δ can flip, so top-1 agreement and
/// the free run are required wherever the reference's margin is at least δ.
fn criteria(golden_name: &str) -> Criteria {
    if reference_reproducible_here() || golden_name.starts_with("tiny-llama") {
        return ISSUE;
    }
    let delta = if golden_name.starts_with("qwen") {
        0.6 // llama.cpp on this CPU: 0.589
    } else {
        1.8 // gemma; llama.cpp on this CPU: 1.707
    };
    Criteria {
        logit_tol: delta,
        top1_margin: delta,
        near_tie: delta,
    }
}

struct Step {
    top: Vec<(u32, f32)>,
}

impl Step {
    fn parse(v: &Value) -> Step {
        let top = v["top"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
            .collect();
        Step { top }
    }

    fn margin(&self) -> f32 {
        self.top[0].1 - self.top[1].1
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_model(golden_name: &str) {
    let golden = common::shared_dir()
        .join("golden")
        .join(format!("{golden_name}.jsonl"));
    let model_path = common::golden_model_path(golden_name);
    if !common::require(&golden, "golden file") || !common::require(&model_path, "model") {
        return;
    }
    let want = criteria(golden_name);
    let model = Model::load(&model_path, 2).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.metadata).unwrap();
    let mut worst = 0f32;
    let (mut top1_checked, mut top1_flips, mut worst_flip_margin) = (0, 0, 0f32);
    let mut worst_parting_margin = 0f32;
    let mut failures = Vec::new();
    for line in std::fs::read_to_string(&golden).unwrap().lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let prompt = case["prompt"].as_str().unwrap();
        let add_special = case["add_special"].as_bool().unwrap();
        let greedy = ids(&case["greedy_tokens"]);
        let mut steps: Vec<Step> = case["prompt_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(Step::parse)
            .collect();
        let n_prompt = steps.len();
        steps.extend(
            case["greedy_steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(Step::parse),
        );

        // 1. Tokenization: exact, whatever the CPU.
        let tokens = tok.encode(prompt, add_special, true).unwrap();
        assert_eq!(
            tokens,
            ids(&case["tokens"]),
            "{golden_name}: tokenization of {prompt:?}"
        );

        // 2. Along the reference path: the prompt as one batch, then one greedy token at a time.
        let mut session = Session::new(&model, tokens.len() + greedy.len() + 8);
        let vocab = model.hp.n_vocab;
        let mut logits = session.feed(&tokens, 512, true).unwrap();
        for &t in &greedy {
            logits.extend(session.feed(&[t], 1, false).unwrap());
        }
        for (i, step) in steps.iter().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            for &(id, reference) in &step.top {
                let diff = (row[id as usize] - reference).abs();
                worst = worst.max(diff);
                if diff > want.logit_tol {
                    failures.push(format!(
                        "{prompt:?} position {i}: logit of token {id} is {} vs llama.cpp {reference}",
                        row[id as usize]
                    ));
                }
            }
            if step.margin() >= ISSUE.top1_margin {
                top1_checked += 1;
                if argmax(row) != step.top[0].0 {
                    top1_flips += 1;
                    worst_flip_margin = worst_flip_margin.max(step.margin());
                    if step.margin() >= want.top1_margin {
                        failures.push(format!(
                            "{prompt:?} position {i}: top-1 differs where llama.cpp's margin is {}",
                            step.margin()
                        ));
                    }
                }
            }
        }

        // 3. Free-running greedy continuation.
        let mut session = Session::new(&model, tokens.len() + FREE_RUN_TOKENS + 8);
        let max_tokens = FREE_RUN_TOKENS.min(greedy.len());
        let ours = session
            .generate(&tok, &tokens, &GenerateRequest::greedy(max_tokens), |_| {})
            .unwrap()
            .tokens;
        for j in 0..max_tokens {
            let chooser = &steps[n_prompt - 1 + j];
            match ours.get(j) {
                Some(&t) if t == greedy[j] => continue,
                // The reference lists the end-of-generation token it stopped at; we stop before it.
                None if j == ours.len() && tok.is_eog(greedy[j]) => break,
                _ => {
                    worst_parting_margin = worst_parting_margin.max(chooser.margin());
                    if chooser.margin() >= want.near_tie {
                        failures.push(format!(
                            "{prompt:?}: free run parts from llama.cpp at step {j} (ours {:?}, reference {}), margin {}",
                            ours.get(j),
                            greedy[j],
                            chooser.margin()
                        ));
                    }
                    break;
                }
            }
        }
        if let Some(text) = case["greedy_text"].as_str() {
            if ours.len() >= greedy.len() && ours[..greedy.len()] == greedy[..] {
                assert_eq!(tok.decode(&greedy, true), text);
            }
        }
    }
    println!(
        "{golden_name}: largest top-8 logit difference {worst:.4} (bound {}); top-1 flips {top1_flips}/{top1_checked} (largest margin {worst_flip_margin:.3}, bound {}); free run parts at margins ≤ {worst_parting_margin:.3} (bound {}); criteria: {}",
        want.logit_tol,
        want.top1_margin,
        want.near_tie,
        if want.logit_tol == ISSUE.logit_tol { "the issue's" } else { "llama.cpp's own spread on this CPU" }
    );
    assert!(
        failures.is_empty(),
        "{golden_name}:\n{}",
        failures.join("\n")
    );
}

#[test]
fn tiny_llama_random_matches_llama_cpp() {
    check_model("tiny-llama-random");
}

#[test]
fn qwen2_5_coder_matches_llama_cpp() {
    check_model("qwen2.5-coder-0.5b-instruct-q4_k_m");
}

#[test]
fn gemma3_270m_matches_llama_cpp() {
    check_model("gemma-3-270m-q4_k_m");
}
