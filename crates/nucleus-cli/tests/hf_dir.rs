//! `nucleus run DIR` on a Hugging Face checkpoint directory: the tiny transformers-made
//! checkpoints of `crates/nucleus/tests/data/hf` (see `tests/suite/hf_checkpoint.rs` there), and
//! one-line errors for directories that are not checkpoints and for what is not built yet.

mod common;

use std::path::PathBuf;

use common::{fails_with, nucleus};

use serde_json::Value;

fn data() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../nucleus/tests/data/hf"
    ))
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn run_dir_gives_transformers_greedy_tokens() {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(data().join("reference.json")).unwrap())
            .unwrap();
    let case = &reference["checkpoints"]["llama-f32"]["cases"][0];
    let dir = data().join("llama-f32");
    let n = case["greedy"].as_array().unwrap().len().to_string();
    let (code, out, err) = nucleus(&[
        "run",
        dir.to_str().unwrap(),
        case["prompt"].as_str().unwrap(),
        "--json",
        "--temperature",
        "0",
        "--ignore-eos",
        "-n",
        &n,
        "-t",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    let got: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(ids(&got["prompt_tokens"]), ids(&case["ids"]));
    assert_eq!(ids(&got["tokens"]), ids(&case["greedy"]));

    let (code, out, err) = nucleus(&[
        "tokenize",
        dir.to_str().unwrap(),
        case["prompt"].as_str().unwrap(),
        "--add-special",
    ]);
    assert_eq!(code, 0, "{err}");
    let got: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(ids(&got), ids(&case["ids"]));
}

#[test]
fn bad_directories_are_one_line_errors() {
    let empty = std::env::temp_dir().join(format!("nucleus-cli-hf-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    fails_with(
        &["run", empty.to_str().unwrap(), "hi"],
        "config.json is missing",
    );
    let dir = data().join("qwen2-bf16");
    fails_with(
        &["run", dir.to_str().unwrap(), "hi", "--quantize", "Q9_9"],
        "unknown quantization type",
    );
    let out = empty.join("out.gguf");
    fails_with(
        &[
            "quantize",
            empty.to_str().unwrap(),
            out.to_str().unwrap(),
            "Q8_0",
        ],
        "config.json is missing",
    );
    assert!(!out.exists(), "no output file is left behind");
    std::fs::remove_dir_all(&empty).unwrap();
}

/// A checkpoint whose tokenizer.json llama.cpp could not follow (a pre-tokenizer it has no
/// name for) runs, but is not written to a GGUF file: one line naming the pre-tokenizer, no
/// file left behind.
#[test]
fn a_vocabulary_llama_cpp_cannot_read_is_not_written() {
    let tmp = std::env::temp_dir().join(format!("nucleus-cli-hfpre-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let src = data().join("qwen2-f32");
    for f in ["config.json", "model.safetensors", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), tmp.join(f)).unwrap();
    }
    let mut tj: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer.json")).unwrap())
            .unwrap();
    tj["pre_tokenizer"] = serde_json::json!({"type": "Whitespace"});
    std::fs::write(tmp.join("tokenizer.json"), tj.to_string()).unwrap();
    let out = tmp.join("out.gguf");
    let dir = tmp.to_str().unwrap();
    fails_with(
        &["quantize", dir, out.to_str().unwrap(), "Q8_0"],
        "llama.cpp could not tokenize it",
    );
    assert!(!out.exists(), "no output file is left behind");
    let (code, _, err) = nucleus(&["run", dir, "hello", "-n", "2", "-t", "1"]);
    assert_eq!(code, 0, "{err}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// `--quantize TYPE` on load runs what `nucleus quantize DIR OUT TYPE` writes: the same greedy
/// tokens from the quantized file as from the checkpoint quantized as it loads.
#[test]
fn a_checkpoint_quantized_on_load_runs_as_its_quantized_file() {
    let dir = data().join("llama-f32");
    let tmp = std::env::temp_dir().join(format!("nucleus-cli-hfq-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let out = tmp.join("llama-q8_0.gguf");
    let (code, _, err) = nucleus(&[
        "quantize",
        dir.to_str().unwrap(),
        out.to_str().unwrap(),
        "Q8_0",
    ]);
    assert_eq!(code, 0, "{err}");
    let greedy = |model: &str, extra: &[&str]| {
        let mut args = vec![
            "run",
            model,
            "hello world",
            "-n",
            "8",
            "--temperature",
            "0",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = nucleus(&args);
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        v["tokens"].clone()
    };
    let from_file = greedy(out.to_str().unwrap(), &[]);
    let on_load = greedy(dir.to_str().unwrap(), &["--quantize", "Q8_0"]);
    assert_eq!(from_file, on_load);
    assert_eq!(from_file.as_array().map(|a| a.len()), Some(8));
    std::fs::remove_dir_all(&tmp).unwrap();
}
