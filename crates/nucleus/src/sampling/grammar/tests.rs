//! The grammar stage on a small synthetic vocabulary: the 256 byte tokens, a few multi-byte
//! pieces and special tokens. (Real models: `tests/suite/grammar.rs`.)

use serde_json::json;

use super::*;
use crate::gguf::{MetaType, MetaValue, Metadata};
use crate::sampling::{Sampler, SamplingError, SamplingParams, Stage};
use crate::tokenizer::Tokenizer;

pub(super) fn vocab() -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types: Vec<i32> = vec![2, 3, 3];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for t in [
        "{\"", "\":", "\"}", "true", "false", "null", "ab", "abc", "12", "▁", "▁{",
    ] {
        tokens.push(t.into());
        types.push(1);
    }
    tokens.push("<|im_end|>".into());
    types.push(3);
    let scores = tokens
        .iter()
        .map(|t| MetaValue::F32(t.chars().count() as f32))
        .collect();
    let mut m = Metadata::default();
    m.insert(
        "tokenizer.ggml.model".into(),
        MetaValue::String("llama".into()),
    );
    m.insert(
        "tokenizer.ggml.tokens".into(),
        MetaValue::Array(
            MetaType::String,
            tokens
                .iter()
                .map(|s| MetaValue::String(s.clone()))
                .collect(),
        ),
    );
    m.insert(
        "tokenizer.ggml.scores".into(),
        MetaValue::Array(MetaType::F32, scores),
    );
    m.insert(
        "tokenizer.ggml.token_type".into(),
        MetaValue::Array(
            MetaType::I32,
            types.into_iter().map(MetaValue::I32).collect(),
        ),
    );
    m.insert("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(1));
    m.insert("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2));
    Tokenizer::from_gguf(&m).unwrap()
}

/// Samples from random logits (temperature 1, no truncation) through the chain until EOS or
/// `max` tokens; returns the text and whether it ended with EOS.
fn sample_text(tok: &Tokenizer, spec: &GrammarSpec, seed: u64, max: usize) -> (String, bool) {
    let mut p = SamplingParams::unrestricted(seed);
    p.grammar = Some(spec.clone());
    let mut s = Sampler::for_tokenizer(p, tok).unwrap();
    let mut rng = crate::sampling::Rng::new(seed ^ 0x5eed);
    let mut out = Vec::new();
    for _ in 0..max {
        let mut logits: Vec<f32> = (0..tok.vocab_size() + 7)
            .map(|_| (rng.next_f64() * 4.0) as f32)
            .collect();
        let t = s.sample(&mut logits, &out).unwrap().token;
        assert!(
            (t as usize) < tok.vocab_size(),
            "a padding logit was sampled"
        );
        if tok.is_eog(t) {
            return (tok.decode(&out, false), true);
        }
        out.push(t);
    }
    (tok.decode(&out, false), false)
}

#[test]
fn every_sample_matches_the_regex() {
    let tok = vocab();
    let spec = GrammarSpec::Regex("(ab|c)+-[0-9]{2,4}".into());
    let re = |s: &str| {
        let (head, digits) = s.rsplit_once('-').unwrap();
        let mut rest = head;
        while !rest.is_empty() {
            rest = rest
                .strip_prefix("ab")
                .or_else(|| rest.strip_prefix('c'))
                .unwrap_or_else(|| panic!("{s:?}"));
        }
        !head.is_empty()
            && (2..=4).contains(&digits.len())
            && digits.bytes().all(|b| b.is_ascii_digit())
    };
    for seed in 0..40 {
        let (text, eos) = sample_text(&tok, &spec, seed, 200);
        assert!(eos, "seed {seed}: no end in 200 tokens: {text:?}");
        assert!(re(&text), "seed {seed}: {text:?}");
    }
}

#[test]
fn every_sample_is_valid_json_for_the_schema() {
    let tok = vocab();
    let spec = GrammarSpec::JsonSchema(json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tag": {"enum": ["ab", "abc"]}
        },
        "required": ["ok", "tag"],
        "additionalProperties": false
    }));
    for seed in 0..40 {
        let (text, eos) = sample_text(&tok, &spec, seed, 400);
        assert!(eos, "seed {seed}: {text:?}");
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let o = v.as_object().unwrap();
        assert!(o["ok"].is_boolean(), "{text}");
        assert!(
            ["ab", "abc"].contains(&o["tag"].as_str().unwrap()),
            "{text}"
        );
        if let Some(n) = o.get("n") {
            assert!((0..=99).contains(&n.as_i64().unwrap()), "{text}");
        }
        assert!(o.keys().all(|k| ["ok", "n", "tag"].contains(&k.as_str())));
    }
}

#[test]
fn lark_grammar_and_special_tokens_masked() {
    let tok = vocab();
    let spec = GrammarSpec::Lark("start: (\"ab\" | \"12\")+ \"!\"".into());
    let mut g = GrammarCompiler::for_tokenizer(&tok)
        .unwrap()
        .compile(&spec)
        .unwrap();
    let mut logits = vec![0.0f32; tok.vocab_size() + 3];
    let allowed = g.apply_mask(&mut logits).unwrap();
    let ok: Vec<String> = (0..logits.len() as u32)
        .filter(|&t| logits[t as usize] == 0.0)
        .map(|t| String::from_utf8_lossy(tok.token_bytes(t)).into_owned())
        .collect();
    assert_eq!(allowed, ok.len());
    // "a", "1", "ab", "abc" is too long? no: "abc" would need "c" next, not in the grammar.
    assert!(
        ok.contains(&"ab".to_string()) && ok.contains(&"12".to_string()),
        "{ok:?}"
    );
    assert!(ok.contains(&"a".to_string()) && ok.contains(&"1".to_string()));
    assert!(!ok.contains(&"abc".to_string()) && !ok.contains(&"!".to_string()));
    assert!(
        !g.allows(2),
        "EOS is not allowed before the grammar can end"
    );
    let ids = ["ab", "12", "<0x21>"].map(|t| tok.token_id(t).unwrap());
    for t in ids {
        g.apply_mask(&mut logits).unwrap();
        assert!(g.allows(t), "{t}");
        g.accept(t).unwrap();
    }
    assert!(g.is_accepting());
    let mut logits = vec![0.0f32; tok.vocab_size()];
    assert_eq!(
        g.apply_mask(&mut logits).unwrap(),
        2,
        "EOS and <|im_end|>: the EOG tokens"
    );
    assert!(g.allows(2));
}

#[test]
fn errors_name_the_problem() {
    let tok = vocab();
    let c = GrammarCompiler::for_tokenizer(&tok).unwrap();
    let bad = [
        GrammarSpec::JsonSchema(json!({"type": "frobnicate"})),
        GrammarSpec::JsonSchema(json!({"$ref": "#/$defs/missing"})),
        GrammarSpec::Lark("start: undefined_rule".into()),
        GrammarSpec::Regex("(unclosed".into()),
    ];
    for spec in bad {
        let e = c.compile(&spec).err().unwrap_or_else(|| panic!("{spec:?}"));
        assert!(!e.0.is_empty(), "{spec:?}");
    }
    // The sampler reports it as a grammar error; without the vocabulary it refuses.
    let mut p = SamplingParams::greedy();
    p.grammar = Some(GrammarSpec::Regex("(".into()));
    assert!(matches!(
        Sampler::for_tokenizer(p.clone(), &tok),
        Err(SamplingError::Grammar(_))
    ));
    assert!(matches!(
        Sampler::new(p),
        Err(SamplingError::InvalidParam {
            name: "grammar",
            ..
        })
    ));
}

#[test]
fn explain_counts_the_grammar_stage_and_logprobs_stay_raw() {
    let tok = vocab();
    let mut p = SamplingParams::greedy();
    p.grammar = Some(GrammarSpec::Regex("12|ab".into()));
    p.logprobs = Some(2);
    let mut s = Sampler::for_tokenizer(p, &tok).unwrap();
    s.set_explain(true);
    let mut logits = vec![0.0f32; tok.vocab_size()];
    let z = tok.token_id("<0x7A>").unwrap(); // "z": the model's favourite, not allowed
    logits[z as usize] = 5.0;
    let ab = tok.token_id("ab").unwrap();
    logits[ab as usize] = 1.0;
    let out = s.sample(&mut logits, &[]).unwrap();
    assert_eq!(out.token, ab);
    // The raw distribution: "z" is still the most likely there.
    assert_eq!(out.top_logprobs[0].0, z);
    let ex = out.explain.unwrap();
    assert_eq!(ex.stages[1].0, Stage::Grammar);
    assert_eq!(ex.stages[1].1, 4, "a, 1, ab, 12");
    assert!(s.grammar().unwrap().is_complete());
}
