//! `HParams::from_metadata`'s per-family facts and errors.

use super::*;
use crate::gguf::MetaValue;

/// A 4-layer model of `arch` (n_embd 64, 4 heads of 16) with `extra` metadata.
fn meta(arch: &str, extra: &[(&str, MetaValue)]) -> Metadata {
    let mut m = Metadata::default();
    m.insert(
        "general.architecture".into(),
        MetaValue::String(arch.into()),
    );
    for (k, v) in [
        ("block_count", 4),
        ("embedding_length", 64),
        ("feed_forward_length", 128),
        ("attention.head_count", 4),
    ] {
        m.insert(format!("{arch}.{k}"), MetaValue::U32(v));
    }
    for (k, v) in extra {
        m.insert(format!("{arch}.{k}"), v.clone());
    }
    m
}

#[test]
fn gemma2_defaults_follow_llama_cpp() {
    let hp = HParams::from_metadata(&meta("gemma2", &[]), 100).unwrap();
    assert_eq!(hp.sliding_window, Some(4096));
    assert_eq!(hp.attn_softcap, Some(50.0));
    assert_eq!(hp.final_softcap, Some(30.0));
    // Even layers local, odd ones global, both with the model's RoPE base.
    assert_eq!(
        (0..4).map(|l| hp.layer_window(l)).collect::<Vec<_>>(),
        [Some(4096), None, Some(4096), None]
    );
    assert_eq!(hp.layer_rope_base(0), hp.layer_rope_base(1));
    assert!(hp.scale_queries && hp.post_norms && hp.qk_norm == QkNorm::None);
    assert_eq!(hp.attn_scale, 0.25);
}

#[test]
fn gemma2_reads_its_window_and_caps() {
    let m = meta(
        "gemma2",
        &[
            ("attention.sliding_window", MetaValue::U32(8)),
            ("attn_logit_softcapping", MetaValue::F32(5.0)),
            ("final_logit_softcapping", MetaValue::F32(15.0)),
        ],
    );
    let hp = HParams::from_metadata(&m, 100).unwrap();
    assert_eq!(
        (hp.sliding_window, hp.attn_softcap, hp.final_softcap),
        (Some(8), Some(5.0), Some(15.0))
    );
    let bad = meta(
        "gemma2",
        &[("final_logit_softcapping", MetaValue::F32(0.0))],
    );
    let err = HParams::from_metadata(&bad, 100).unwrap_err().to_string();
    assert!(err.contains("gemma2.final_logit_softcapping = 0"), "{err}");
}

#[test]
fn gemma2_window_pattern_is_a_period() {
    let m = meta(
        "gemma2",
        &[("attention.sliding_window_pattern", MetaValue::U32(3))],
    );
    let hp = HParams::from_metadata(&m, 100).unwrap();
    assert_eq!(
        (0..4).map(|l| hp.layer_window(l)).collect::<Vec<_>>(),
        [Some(4096), Some(4096), None, Some(4096)]
    );
    let flags = MetaValue::Array(
        crate::gguf::MetaType::Bool,
        vec![MetaValue::Bool(true), MetaValue::Bool(false)],
    );
    let m = meta("gemma2", &[("attention.sliding_window_pattern", flags)]);
    let err = HParams::from_metadata(&m, 100).unwrap_err().to_string();
    assert!(
        err.contains("gemma2.attention.sliding_window_pattern: only a period"),
        "{err}"
    );
}

#[test]
fn llama_and_phi3_ignore_a_sliding_window_as_llama_cpp_does() {
    for arch in ["llama", "phi3"] {
        let m = meta(arch, &[("attention.sliding_window", MetaValue::U32(8))]);
        let hp = HParams::from_metadata(&m, 100).unwrap();
        assert_eq!(hp.sliding_window, None, "{arch}");
        assert_eq!(hp.layer_window(0), None, "{arch}");
    }
}

#[test]
fn qwen3_and_phi3_facts() {
    let q = HParams::from_metadata(&meta("qwen3", &[]), 100).unwrap();
    assert!(q.qk_norm == QkNorm::PerHead && !q.qkv_bias && !q.scale_queries);
    assert_eq!(q.rope_style, RopeStyle::Neox);
    let p = HParams::from_metadata(&meta("phi3", &[]), 100).unwrap();
    assert!(p.scale_queries && p.qk_norm == QkNorm::None);
    assert_eq!(p.rope_style, RopeStyle::Neox);
}

/// llama.cpp's facts: qwen3moe and llama (Mixtral) call `build_moe_ffn` with
/// `norm_w = true`, olmoe with `false`; qwen3moe's experts are
/// `expert_feed_forward_length` wide, or n_ff / n_expert_used without it.
#[test]
fn moe_facts_follow_llama_cpp() {
    let counts = [
        ("expert_count", MetaValue::U32(8)),
        ("expert_used_count", MetaValue::U32(2)),
    ];
    let moe = |arch: &str, extra: &[(&str, MetaValue)]| {
        let all: Vec<_> = counts.iter().chain(extra).cloned().collect();
        HParams::from_metadata(&meta(arch, &all), 100).unwrap().moe
    };
    let q = moe("qwen3moe", &[]).unwrap();
    assert_eq!((q.n_expert, q.n_expert_used, q.n_ff_exp), (8, 2, 64));
    assert!(q.norm_weights);
    let q = moe(
        "qwen3moe",
        &[("expert_feed_forward_length", MetaValue::U32(32))],
    );
    assert_eq!(q.unwrap().n_ff_exp, 32);
    let m = moe("llama", &[]).unwrap();
    assert!(m.norm_weights && m.n_ff_exp == 128);
    let o = moe("olmoe", &[]).unwrap();
    assert!(!o.norm_weights && o.n_ff_exp == 128);
    let o = HParams::from_metadata(&meta("olmoe", &counts), 100).unwrap();
    assert_eq!(o.qk_norm, QkNorm::AllHeads);
    // Dense: llama without experts, and architectures that read none.
    assert_eq!(
        HParams::from_metadata(&meta("llama", &[]), 100)
            .unwrap()
            .moe,
        None
    );
    assert_eq!(moe("qwen3", &[]), None);
}

#[test]
fn unknown_architecture_is_named() {
    let err = HParams::from_metadata(&meta("mamba", &[]), 100)
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"mamba\"") && err.contains("phi3"), "{err}");
}
