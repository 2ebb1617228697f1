//! Broken variants of the architecture fixtures (`tests/data/arch/`): each loads to a clear
//! error naming the problem, never a panic.

use std::path::Path;
use std::sync::Arc;

use nucleus::gguf::{GgufFile, GgufWriter, MetaValue};
use nucleus::model::{Arithmetic, Model};
use nucleus::quant::GgmlType;

/// A fixture rewritten: metadata `set` (replacing a key or adding it), tensors named in `drop`
/// left out, `add` appended (F32).
fn variant(
    stem: &str,
    set: &[(&str, MetaValue)],
    drop: &[&str],
    add: &[(&str, Vec<u64>)],
) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/arch/{stem}.gguf"));
    let file = GgufFile::open(path).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata.iter() {
        if !set.iter().any(|(k, _)| *k == key) {
            w.add_meta(key, value.clone());
        }
    }
    for (key, value) in set {
        w.add_meta(key, value.clone());
    }
    for t in file
        .tensors
        .iter()
        .filter(|t| !drop.contains(&t.name.as_str()))
    {
        w.add_tensor(&t.name, &t.dims, t.ty, file.tensor_data(t).to_vec());
    }
    for (name, dims) in add {
        let n = dims.iter().product::<u64>() as usize;
        let ones: Vec<u8> = (0..n).flat_map(|_| 1f32.to_le_bytes()).collect();
        w.add_tensor(name, dims, GgmlType::F32, ones);
    }
    w.to_bytes()
}

fn load_error(bytes: Vec<u8>) -> String {
    let file = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    match Model::from_file_with(file, 1, Arithmetic::Exact) {
        Ok(_) => panic!("the broken model loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn fixtures_load_unchanged() {
    for stem in [
        "qwen3", "gemma2", "phi3", "qwen3moe", "mixtral", "olmoe", "gpt-oss",
    ] {
        let file = Arc::new(GgufFile::from_bytes(variant(stem, &[], &[], &[])).unwrap());
        Model::from_file_with(file, 1, Arithmetic::Exact).unwrap();
    }
}

#[test]
fn unknown_architecture_is_named_with_the_supported_ones() {
    let err = load_error(variant(
        "qwen3",
        &[("general.architecture", MetaValue::String("qwen9".into()))],
        &[],
        &[],
    ));
    assert_eq!(
        err,
        "architecture \"qwen9\" is not supported (supported: llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, olmoe, gpt-oss)"
    );
}

#[test]
fn qwen3_without_its_q_norm_names_the_tensor() {
    let err = load_error(variant("qwen3", &[], &["blk.2.attn_q_norm.weight"], &[]));
    assert_eq!(
        err,
        "invalid model: missing tensor blk.2.attn_q_norm.weight"
    );
}

#[test]
fn phi3_fused_matrices_must_have_their_rows() {
    // With 1 KV head in the metadata attn_qkv must have 64 + 2·16 rows; the file's has 64 + 2·32.
    let err = load_error(variant(
        "phi3",
        &[("phi3.attention.head_count_kv", MetaValue::U32(1))],
        &[],
        &[],
    ));
    assert!(
        err.contains("tensor blk.0.attn_qkv.weight has shape [64, 128], expected [64, 96]"),
        "{err}"
    );
    let err = load_error(variant(
        "phi3",
        &[("phi3.feed_forward_length", MetaValue::U32(256))],
        &[],
        &[],
    ));
    assert!(
        err.contains("tensor blk.0.ffn_up.weight has shape [64, 256], expected [64, 512]"),
        "{err}"
    );
}

#[test]
fn phi3_long_rope_is_refused() {
    let err = load_error(variant(
        "phi3",
        &[],
        &[],
        &[("rope_factors_long.weight", vec![8])],
    ));
    assert!(err.contains("LongRoPE"), "{err}");
}

#[test]
fn gemma2_soft_cap_must_be_positive() {
    let err = load_error(variant(
        "gemma2",
        &[("gemma2.attn_logit_softcapping", MetaValue::F32(-1.0))],
        &[],
        &[],
    ));
    assert_eq!(
        err,
        "invalid model: gemma2.attn_logit_softcapping = -1 is not a positive number"
    );
}

#[test]
fn moe_without_its_expert_counts_names_the_key() {
    let drop_key = |stem: &str, key: &str| {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/arch/{stem}.gguf"));
        let file = GgufFile::open(path).unwrap();
        let mut w = GgufWriter::new();
        for (k, v) in file.metadata.iter() {
            if k != key {
                w.add_meta(k, v.clone());
            }
        }
        for t in &file.tensors {
            w.add_tensor(&t.name, &t.dims, t.ty, file.tensor_data(t).to_vec());
        }
        load_error(w.to_bytes())
    };
    assert_eq!(
        drop_key("qwen3moe", "qwen3moe.expert_count"),
        "invalid model: missing metadata qwen3moe.expert_count"
    );
    assert_eq!(
        drop_key("olmoe", "olmoe.expert_used_count"),
        "invalid model: missing metadata olmoe.expert_used_count"
    );
    // gpt-oss: its experts' width and its sliding window are required, as llama.cpp requires
    // them.
    assert_eq!(
        drop_key("gpt-oss", "gpt-oss.expert_feed_forward_length"),
        "invalid model: missing metadata gpt-oss.expert_feed_forward_length"
    );
    assert_eq!(
        drop_key("gpt-oss", "gpt-oss.attention.sliding_window"),
        "invalid model: missing metadata gpt-oss.attention.sliding_window"
    );
    // Without expert_count a llama file is dense, as in llama.cpp; its expert tensors say why
    // it cannot load.
    assert_eq!(
        drop_key("mixtral", "llama.expert_count"),
        "invalid model: missing metadata llama.expert_count (the file has expert tensors: blk.0.ffn_gate_inp.weight)"
    );
}

#[test]
fn moe_counts_contradicting_the_tensors_are_named() {
    let err = load_error(variant(
        "qwen3moe",
        &[("qwen3moe.expert_count", MetaValue::U32(4))],
        &[],
        &[],
    ));
    assert_eq!(
        err,
        "invalid model: tensor blk.0.ffn_gate_inp.weight has shape [64, 8], expected [64, 4] (qwen3moe.expert_count = 4)"
    );
    let err = load_error(variant(
        "qwen3moe",
        &[("qwen3moe.expert_used_count", MetaValue::U32(9))],
        &[],
        &[],
    ));
    assert_eq!(
        err,
        "invalid model: qwen3moe.expert_used_count = 9 must be between 1 and qwen3moe.expert_count = 8"
    );
    let err = load_error(variant(
        "qwen3moe",
        &[("qwen3moe.expert_feed_forward_length", MetaValue::U32(64))],
        &[],
        &[],
    ));
    assert_eq!(
        err,
        "invalid model: tensor blk.0.ffn_gate_exps.weight has shape [64, 32, 8], expected [64, 64, 8] (qwen3moe.expert_count = 8, qwen3moe.expert_feed_forward_length = 64)"
    );
    let err = load_error(variant(
        "mixtral",
        &[],
        &["blk.1.ffn_down_exps.weight"],
        &[],
    ));
    assert_eq!(
        err,
        "invalid model: missing tensor blk.1.ffn_down_exps.weight"
    );
}
