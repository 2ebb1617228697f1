//! Conformance with llama.cpp on the same GGUF files (`../shared/golden/*.jsonl`).
//!
//! For each prompt: the tokenization must be identical; fed the prompt (one batch) and then the
//! reference's greedy tokens (one at a time, as the reference was made), our top-1 must equal
//! the reference's wherever its top-2 margin is large enough, and our logits for the reference's
//! top-8 ids must stay close to its; run free, our greedy continuation must equal the
//! reference's for its first 32 tokens, or part from it only at a near-tie.
//!
//! nucleus reproduces the arithmetic of the build that made the golden files (llama.cpp's CPU
//! backend compiled with GCC for AVX-512 with VNNI) on every CPU, and so matches its logits to
//! the last printed digit at every position of every prompt, on all three models. That takes
//! every rounding the reference makes: the summation order of each SIMD kernel, the kernel it
//! picks for a row (one-row kernels for generated tokens; for a prompt the tiled Q6_K kernel
//! from 8 rows, the repacked Q4_K gemm for rows in groups of four, sgemm for F16/BF16), the FMAs
//! GCC forms from its scalar code (RoPE, the attention sum, the GELU table), and where Gemma
//! scales its queries. With 8-bit activations any miss turns a last-bit difference into whole
//! rounding steps a few layers later, so [`EXACT`] holds every prompt to the file's precision;
//! the issue's looser criteria are checked as well and printed.

use crate::common;

use nucleus::engine::{argmax, GenerateRequest, Session};
use nucleus::model::{Arithmetic, Model};
use nucleus::tokenizer::Tokenizer;
use serde_json::Value;
use std::path::{Path, PathBuf};

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

/// Largest difference at which a position counts as matching: the golden files print logits
/// with six decimals, and f32 logits near 20 are 2e-6 apart.
const EXACT: f32 = 1e-5;

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

/// A golden file's cases and its model in `arithmetic`; `None` (skipped) when either is absent.
fn open(golden_name: &str, arithmetic: Arithmetic) -> Option<(Model, Tokenizer, Vec<Value>)> {
    let golden = common::shared_dir()
        .join("golden")
        .join(format!("{golden_name}.jsonl"));
    open_at(&golden, &common::golden_model_path(golden_name), arithmetic)
}

fn open_at(
    golden: &Path,
    model_path: &Path,
    arithmetic: Arithmetic,
) -> Option<(Model, Tokenizer, Vec<Value>)> {
    if !common::require(golden, "golden file") || !common::require(model_path, "model") {
        return None;
    }
    let model = Model::load_with(model_path, 2, arithmetic).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.metadata).unwrap();
    let cases = std::fs::read_to_string(golden)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    Some((model, tok, cases))
}

/// The reference's top logits at every position of a case (the prompt's, then the greedy
/// steps'), and how many are the prompt's.
fn steps(case: &Value) -> (Vec<Step>, usize) {
    let prompt = case["prompt_logits"].as_array().unwrap();
    let steps = prompt
        .iter()
        .chain(case["greedy_steps"].as_array().unwrap())
        .map(Step::parse)
        .collect();
    (steps, prompt.len())
}

/// The logits along the reference path: the prompt as one batch, then one greedy token at a
/// time.
fn reference_path_logits(model: &Model, tokens: &[u32], greedy: &[u32]) -> Vec<f32> {
    let mut session = Session::new(model, tokens.len() + greedy.len() + 8);
    let mut logits = session.feed(tokens, 512, true).unwrap();
    for &t in greedy {
        logits.extend(session.feed(&[t], 1, false).unwrap());
    }
    logits
}

fn check_model(golden_name: &str) {
    let Some(opened) = open(golden_name, Arithmetic::Exact) else {
        return;
    };
    check_opened(golden_name, opened, &|_| EXACT);
}

/// Checks a model against its reference; a prompt counts as matching when every top-8 logit
/// along the reference path is within `match_tol(prompt tokens)` of the reference's.
fn check_opened(
    golden_name: &str,
    (model, tok, cases): (Model, Tokenizer, Vec<Value>),
    match_tol: &dyn Fn(usize) -> f32,
) {
    let mut worst = 0f32;
    let (mut top1_checked, mut top1_flips, mut worst_flip_margin) = (0, 0, 0f32);
    let mut worst_parting_margin = 0f32;
    let (mut n_prompts, mut n_exact, mut n_identical) = (0, 0, 0);
    let mut failures = Vec::new();
    for case in &cases {
        let prompt = case["prompt"].as_str().unwrap();
        let add_special = case["add_special"].as_bool().unwrap();
        let greedy = ids(&case["greedy_tokens"]);
        let (steps, n_prompt) = steps(case);

        // 1. Tokenization: exact, whatever the CPU.
        let tokens = tok.encode(prompt, add_special, true).unwrap();
        assert_eq!(
            tokens,
            ids(&case["tokens"]),
            "{golden_name}: tokenization of {prompt:?}"
        );

        // 2. Along the reference path.
        let vocab = model.hp.n_vocab;
        let logits = reference_path_logits(&model, &tokens, &greedy);
        let trace = std::env::var_os("NUCLEUS_GOLDEN_TRACE").is_some();
        let mut prompt_worst = 0f32;
        for (i, step) in steps.iter().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let mut step_worst = 0f32;
            for &(id, reference) in &step.top {
                let diff = (row[id as usize] - reference).abs();
                step_worst = step_worst.max(diff);
                if diff > ISSUE.logit_tol {
                    failures.push(format!(
                        "{prompt:?} position {i}: logit of token {id} is {} vs llama.cpp {reference}",
                        row[id as usize]
                    ));
                }
            }
            worst = worst.max(step_worst);
            prompt_worst = prompt_worst.max(step_worst);
            if trace {
                let phase = if i < n_prompt { "prompt" } else { "greedy" };
                let text = prompt.escape_debug();
                println!("trace {golden_name} {text:.12} {phase} {i} {step_worst:.4}");
            }
            if step.margin() >= ISSUE.top1_margin {
                top1_checked += 1;
                if argmax(row) != step.top[0].0 {
                    top1_flips += 1;
                    worst_flip_margin = worst_flip_margin.max(step.margin());
                    if step.margin() >= ISSUE.top1_margin {
                        failures.push(format!(
                            "{prompt:?} position {i}: top-1 differs where llama.cpp's margin is {}",
                            step.margin()
                        ));
                    }
                }
            }
        }

        n_prompts += 1;
        n_identical += usize::from(prompt_worst == 0.0);
        if prompt_worst <= match_tol(tokens.len()) {
            n_exact += 1;
        } else {
            failures.push(format!(
                "{prompt:?}: parts from llama.cpp's logits (largest difference {prompt_worst:.2e}; NUCLEUS_GOLDEN_TRACE=1 shows where)"
            ));
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
                    if chooser.margin() >= ISSUE.near_tie {
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
        "{golden_name}: prompts matching llama.cpp at every position: {n_exact}/{n_prompts} ({n_identical} to the bit); largest top-8 logit difference {worst:.2e} (issue: 0.3); top-1 flips {top1_flips}/{top1_checked} (largest margin {worst_flip_margin:.3}, issue: none at margin ≥ 0.1); free run parts at margins ≤ {worst_parting_margin:.3} (issue: < 0.05)"
    );
    assert!(
        failures.is_empty(),
        "{golden_name}:\n{}",
        failures.join("\n")
    );
}

#[test]
fn tiny_llama_random_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_model("tiny-llama-random");
}

#[test]
fn qwen2_5_coder_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_model("qwen2.5-coder-0.5b-instruct-q4_k_m");
}

#[test]
fn gemma3_270m_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_model("gemma-3-270m-q4_k_m");
}

/// nucleus's own arithmetic (the default) along the reference path: its distance from
/// llama.cpp's logits, printed and bounded.
///
/// Any change of rounding moves these models' logits by about as much: llama.cpp's own AVX2
/// build parts from these files (its AVX-512 build's) by up to 0.59 (qwen) and 1.71 (gemma)
/// (README, "Conformance"); its one-token kernels used for every row of the same prompts part
/// from its batched ones by a mean top-8 logit difference of 0.067 and 0.136, at most 0.40 and
/// 0.81, with 2 and 4 top-1 flips at margins of 0.1 or more (measured with this function on the
/// fast arithmetic without its repacked products). nucleus's arithmetic measures 0.069 and 0.223
/// mean, 0.49 and 1.50 at most, 0 and 9 flips (2026-11-23, Q6_K in llama.cpp's tiled
/// arithmetic; with Q6_K in its one-row arithmetic it was 2 and 7 flips, at the same corpus
/// top-1 agreement: 95.35 % then, 95.38 % now); the bounds sit a little above. The quality
/// figures that matter, KL divergence and perplexity over a corpus, are in BENCHMARKS.md
/// (`scripts/arithmetic_quality.sh`).
fn check_fast(golden_name: &str) {
    let Some(opened) = open(golden_name, Arithmetic::Fast) else {
        return;
    };
    check_fast_opened(golden_name, opened);
}

fn check_fast_opened(golden_name: &str, (model, tok, cases): (Model, Tokenizer, Vec<Value>)) {
    let (mut worst, mut sum, mut n) = (0f32, 0f64, 0usize);
    let (mut checked, mut flips) = (0, 0);
    for case in &cases {
        let tokens = tok
            .encode(
                case["prompt"].as_str().unwrap(),
                case["add_special"].as_bool().unwrap(),
                true,
            )
            .unwrap();
        let greedy = ids(&case["greedy_tokens"]);
        let (steps, _) = steps(case);
        let vocab = model.hp.n_vocab;
        let logits = reference_path_logits(&model, &tokens, &greedy);
        for (i, step) in steps.iter().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            for &(id, reference) in &step.top {
                let diff = (row[id as usize] - reference).abs();
                worst = worst.max(diff);
                sum += diff as f64;
                n += 1;
            }
            if step.margin() >= ISSUE.top1_margin {
                checked += 1;
                flips += usize::from(argmax(row) != step.top[0].0);
            }
        }
    }
    println!(
        "{golden_name}, nucleus's arithmetic against llama.cpp: largest top-8 logit difference {worst:.4}, mean {:.5}; top-1 flips {flips}/{checked} at margin >= {}",
        sum / n.max(1) as f64,
        ISSUE.top1_margin
    );
    let mean = sum / n.max(1) as f64;
    assert!(mean <= 0.3, "{golden_name}: mean logit gap {mean}");
    assert!(worst <= 2.0, "{golden_name}: largest logit gap {worst}");
    assert!(
        flips * 20 <= checked,
        "{golden_name}: {flips} top-1 flips of {checked} (at most 5 %)"
    );
}

#[test]
fn tiny_llama_random_fast_arithmetic_stays_close() {
    let _one = crate::common::one_at_a_time();
    check_fast("tiny-llama-random");
}

#[test]
fn qwen2_5_coder_fast_arithmetic_stays_close() {
    let _one = crate::common::one_at_a_time();
    check_fast("qwen2.5-coder-0.5b-instruct-q4_k_m");
}

#[test]
fn gemma3_270m_fast_arithmetic_stays_close() {
    let _one = crate::common::one_at_a_time();
    check_fast("gemma-3-270m-q4_k_m");
}

/// A tiny random-weight model of another architecture and llama.cpp's outputs for it, committed
/// in `tests/data/arch/` (made by `scripts/make_tiny_models.py`).
fn arch_fixture(stem: &str) -> (PathBuf, PathBuf) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch");
    (
        dir.join(format!("{stem}.jsonl")),
        dir.join(format!("{stem}.gguf")),
    )
}

/// The fixtures of `tests/data/arch/`.
const ARCH_FIXTURES: [&str; 6] = [
    "gemma2",
    "qwen3",
    "llama3-bpe",
    "smollm2",
    "phi3",
    "mistral-swa",
];

/// The mixture-of-experts fixtures. Their references need llama.cpp's AVX-512 build
/// (`LLAMA_CPP_SRC=... scripts/make_tiny_models.py qwen3moe mixtral olmoe`); until a
/// `.jsonl` is committed beside its model, its tests say so and pass.
const MOE_FIXTURES: [&str; 5] = ["qwen3moe", "qwen3moe-q4km", "mixtral", "olmoe", "gpt-oss"];

/// [`arch_fixtures_fast_arithmetic_stays_close`] for the MoE fixtures.
#[test]
fn moe_fixtures_fast_arithmetic_stays_close() {
    let _one = crate::common::one_at_a_time();
    for stem in MOE_FIXTURES {
        let (golden, model) = arch_fixture(stem);
        if moe_reference_missing(&golden) {
            continue;
        }
        let opened = open_at(&golden, &model, Arithmetic::Fast).expect("committed fixture");
        check_fast_opened(stem, opened);
    }
}

/// nucleus's own arithmetic (repacked Q8_0 products, Phi-3's fused matrices in parts) on each
/// fixture, within check_fast's bounds.
#[test]
fn arch_fixtures_fast_arithmetic_stays_close() {
    let _one = crate::common::one_at_a_time();
    for stem in ARCH_FIXTURES {
        let (golden, model) = arch_fixture(stem);
        let opened = open_at(&golden, &model, Arithmetic::Fast).expect("committed fixture");
        check_fast_opened(stem, opened);
    }
}

/// `--exact` against a fixture's reference, bit for bit for prompts under 64 tokens (the
/// logits are printed with 9 significant digits, which read back as the same f32).
///
/// The references come from the llama.cpp built here, an AVX2 build, while `--exact` follows the
/// AVX-512 build that made `../shared/golden`. The fixtures are made so that both builds run
/// the same arithmetic: Q8_0 matrices (their integer sums and the f32 sum over blocks are the
/// same code in both, llama.cpp repacks no Q8_0 on x86), F32 norms, heads of 16 dimensions
/// (ggml's f16 dot products and accumulations stay in their scalar tail, which both builds
/// share below 32 elements). Not so the tiled flash attention of a prompt of 64 tokens or more:
/// its softmax sums in groups of 8 in one build and 16 in the other, and its outputs differ in
/// the last bit (`scripts/tensor_dumps/check_tiled_attention.py`'s model of each build matches
/// llama.cpp here and nucleus respectively, bit for bit, on smollm2's long prompt). The Q8_0
/// rounding of the attention output mostly absorbs that, but not always: smollm2's long prompt
/// parts by 0.022 at one position. Such prompts are held to [`AVX2_TILED_TOL`].
fn check_arch(stem: &str) {
    let (golden, model) = arch_fixture(stem);
    let opened = open_at(&golden, &model, Arithmetic::Exact).expect("committed fixture");
    check_opened(stem, opened, &|n| {
        if n < TILED_ATTENTION_TOKENS {
            0.0
        } else {
            AVX2_TILED_TOL
        }
    });
}

/// From this many prompt tokens llama.cpp computes attention with its tiled kernel.
const TILED_ATTENTION_TOKENS: usize = 64;

/// How far the AVX2 build of llama.cpp may part from `--exact` on a fixture's long prompt:
/// llama.cpp's own AVX2 build parts from its AVX-512 golden file of tiny-llama-random by up to
/// 0.10 (`scripts/llama_cpp_selfcheck.sh`, mode 0, 2026-11-23). Measured on the fixtures: 0.022
/// (smollm2), 0 on the five others.
const AVX2_TILED_TOL: f32 = 0.1;

#[test]
fn gemma2_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_arch("gemma2");
}

#[test]
fn qwen3_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_arch("qwen3");
}

#[test]
fn llama3_bpe_vocabulary_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_arch("llama3-bpe");
}

#[test]
fn smollm2_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_arch("smollm2");
}

#[test]
fn phi3_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_arch("phi3");
}

#[test]
fn mistral_sliding_window_is_ignored_as_llama_cpp_does() {
    let _one = crate::common::one_at_a_time();
    check_arch("mistral-swa");
}

/// Mixtures of experts (llama.cpp's `build_moe_ffn`, softmax gating, 8 experts of which 2
/// are used): the router, the choice of experts, their weights (renormalised for Qwen3-MoE and
/// Mixtral, not for OLMoE) and the sum of their outputs, bit for bit. Their references come
/// from llama.cpp's AVX-512 build, whose softmax over 8 experts takes the C library's `expf`
/// (an AVX2 build takes its own 8-lane `expf`, other bits), as nucleus's does.
#[test]
fn qwen3moe_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_moe("qwen3moe");
}

/// Qwen3-MoE as llama-quantize's Q4_K_M writes it: Q4_K and Q6_K expert down projections,
/// Q5_0 gate and up experts (their 64-wide rows' fallback), the types of the real files.
#[test]
fn qwen3moe_q4_k_m_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_moe("qwen3moe-q4km");
}

#[test]
fn mixtral_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_moe("mixtral");
}

#[test]
fn olmoe_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_moe("olmoe");
}

/// gpt-oss (llama.cpp's `openai-moe`): MXFP4 experts (through llama.cpp's repacked MXFP4
/// kernels' arithmetic), the biased router whose 4 largest logits are softmaxed, biased experts
/// with the clamped SwiGLU, attention sinks, a sliding window of 8 on the even layers, YaRN.
#[test]
fn gpt_oss_matches_llama_cpp() {
    let _one = crate::common::one_at_a_time();
    check_moe("gpt-oss");
}

/// [`check_arch`] once the fixture's reference is committed (see [`MOE_FIXTURES`]).
fn check_moe(stem: &str) {
    let (golden, model) = arch_fixture(stem);
    if moe_reference_missing(&golden) {
        return;
    }
    let opened = open_at(&golden, &model, Arithmetic::Exact).expect("committed fixture");
    check_opened(stem, opened, &|_| 0.0);
}

fn moe_reference_missing(golden: &Path) -> bool {
    let missing = !golden.exists();
    if missing {
        eprintln!(
            "skipped: no llama.cpp reference at {} yet (see MOE_FIXTURES)",
            golden.display()
        );
    }
    missing
}
