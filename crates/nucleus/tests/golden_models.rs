//! Conformance with llama.cpp on the same GGUF files (`../shared/golden/*.jsonl`).
//!
//! For each prompt: the tokenization must be identical; fed the prompt plus the reference's
//! greedy tokens, our top-1 must equal the reference's wherever its top-2 margin is ≥ 0.1, and
//! our logits for the reference's top-8 ids must stay within 0.3 of its; run free, our greedy
//! continuation must equal the reference's for its first 32 tokens, or part from it only at a
//! step where the reference's top-2 margin is < 0.05.

mod common;

use nucleus::engine::{argmax, GenerationConfig, Session};
use nucleus::model::Model;
use nucleus::tokenizer::Tokenizer;
use serde_json::Value;

const TOP1_MARGIN: f32 = 0.1;
const LOGIT_TOL: f32 = 0.3;
const FREE_RUN_TOKENS: usize = 32;
const NEAR_TIE: f32 = 0.05;

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

fn check_model(golden_name: &str) {
    let golden = common::shared_dir()
        .join("golden")
        .join(format!("{golden_name}.jsonl"));
    let model_path = common::golden_model_path(golden_name);
    if !common::require(&golden, "golden file") || !common::require(&model_path, "model") {
        return;
    }
    let model = Model::load(&model_path, 2).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.metadata).unwrap();
    let mut worst = 0f32;
    let mut checked_top1 = 0;
    for line in std::fs::read_to_string(&golden).unwrap().lines() {
        let case: Value = serde_json::from_str(line).unwrap();
        let prompt = case["prompt"].as_str().unwrap();
        let add_special = case["add_special"].as_bool().unwrap();
        let want_tokens: Vec<u32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let greedy: Vec<u32> = case["greedy_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
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

        // 1. Tokenization.
        let tokens = tok.encode(prompt, add_special, true).unwrap();
        assert_eq!(
            tokens, want_tokens,
            "{golden_name}: tokenization of {prompt:?}"
        );

        // 2. Along the reference path, evaluated as the reference was: the prompt as one batch,
        // then one greedy token at a time.
        let mut session = Session::new(&model, tokens.len() + greedy.len() + 8);
        let vocab = model.hp.n_vocab;
        let mut logits = session.feed(&tokens, 512, true).unwrap();
        for &t in &greedy {
            logits.extend(session.feed(&[t], 1, false).unwrap());
        }
        assert_eq!(logits.len(), (tokens.len() + greedy.len()) * vocab);
        for (i, step) in steps.iter().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            for &(id, want) in &step.top {
                let diff = (row[id as usize] - want).abs();
                worst = worst.max(diff);
                assert!(
                    diff <= LOGIT_TOL,
                    "{golden_name} {prompt:?} position {i}: logit of token {id} is {} vs llama.cpp {want}",
                    row[id as usize]
                );
            }
            if step.margin() >= TOP1_MARGIN {
                checked_top1 += 1;
                assert_eq!(
                    argmax(row),
                    step.top[0].0,
                    "{golden_name} {prompt:?} position {i}: top-1 differs"
                );
            }
        }

        // 3. Free-running greedy continuation.
        let mut session = Session::new(&model, tokens.len() + FREE_RUN_TOKENS + 8);
        let cfg = GenerationConfig {
            max_tokens: FREE_RUN_TOKENS.min(greedy.len()),
            ..Default::default()
        };
        let (ours, _, _) = session
            .generate_greedy(&tokens, &cfg, |t| tok.is_eog(t), |_| {})
            .unwrap();
        for j in 0..cfg.max_tokens {
            let chooser = &steps[n_prompt - 1 + j];
            match ours.get(j) {
                Some(&t) if t == greedy[j] => continue,
                // The reference lists the end-of-generation token it stopped at; we stop before it.
                None if j == ours.len() && tok.is_eog(greedy[j]) => break,
                _ => {
                    assert!(
                        chooser.margin() < NEAR_TIE,
                        "{golden_name} {prompt:?}: free run parts from llama.cpp at step {j} (ours {:?}, reference {}), margin {}",
                        ours.get(j),
                        greedy[j],
                        chooser.margin()
                    );
                    eprintln!(
                        "{golden_name}: {prompt:?} parts at near-tie step {j} (margin {})",
                        chooser.margin()
                    );
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
    println!("{golden_name}: largest logit difference from llama.cpp {worst:.4} ({checked_top1} top-1 checks)");
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
