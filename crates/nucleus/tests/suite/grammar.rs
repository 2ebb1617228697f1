//! The grammar stage on the real qwen model, through the engine: every sampled output (many
//! seeds, temperature 1, no truncation) is JSON valid against its schema; a regex and a Lark
//! grammar; `n > 1` (streams of a seed); logprobs; stop strings; `max_tokens` ending the JSON
//! early; a constrained request gives the same tokens alone and in a batch with unconstrained
//! ones, with ngram speculation on and off, and through a [`Session`] with and without a
//! speculator.
//!
//! Run in release: `cargo test --release -p nucleus --test suite grammar::`.

use crate::common;

use std::sync::Arc;

use serde_json::{json, Value};

use nucleus::engine::scheduler::{Engine, EngineConfig, Finished, GenRequest, SpecConfig};
use nucleus::engine::speculate::ngram::NgramProposer;
use nucleus::engine::speculate::Speculator;
use nucleus::engine::{GenerateRequest, Session};
use nucleus::model::Model;
use nucleus::sampling::{FinishReason, GrammarSpec, SamplingParams};
use nucleus::tokenizer::{TokenId, Tokenizer};

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

fn chat(tok: &Tokenizer, user: &str) -> Vec<TokenId> {
    let text = format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n");
    tok.encode(&text, true, true).unwrap()
}

/// A nested schema: `$defs`/`$ref`, an enum, an optional array, bounded strings and integers.
fn person_schema() -> Value {
    json!({
        "$defs": {
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                },
                "required": ["city"],
                "additionalProperties": false
            }
        },
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "address": {"$ref": "#/$defs/address"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}
        },
        "required": ["name", "age", "role", "address"],
        "additionalProperties": false
    })
}

/// `person_schema`, checked by hand.
fn check_person(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let o = v.as_object().ok_or("not an object")?;
    let known = ["name", "age", "role", "address", "tags"];
    if let Some(k) = o.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("unknown property {k}"));
    }
    let name = o.get("name").and_then(Value::as_str).ok_or("name")?;
    if name.chars().count() > 24 {
        return Err("name too long".into());
    }
    let age = o.get("age").and_then(Value::as_i64).ok_or("age")?;
    if !(0..=120).contains(&age) {
        return Err("age out of range".into());
    }
    let role = o.get("role").and_then(Value::as_str).ok_or("role")?;
    if !["admin", "user", "guest"].contains(&role) {
        return Err("role".into());
    }
    let addr = o
        .get("address")
        .and_then(Value::as_object)
        .ok_or("address")?;
    if addr.keys().any(|k| k != "city" && k != "zip") {
        return Err("address has an unknown property".into());
    }
    let city = addr.get("city").and_then(Value::as_str).ok_or("city")?;
    if city.chars().count() > 20 {
        return Err("city too long".into());
    }
    if let Some(zip) = addr.get("zip") {
        let zip = zip.as_str().ok_or("zip")?;
        if zip.len() != 5 || !zip.bytes().all(|b| b.is_ascii_digit()) {
            return Err("zip".into());
        }
    }
    if let Some(tags) = o.get("tags") {
        let tags = tags.as_array().ok_or("tags")?;
        if tags.len() > 3 {
            return Err("too many tags".into());
        }
        for t in tags {
            if t.as_str().ok_or("tag")?.chars().count() > 12 {
                return Err("tag too long".into());
            }
        }
    }
    Ok(())
}

const PERSON_PROMPT: &str = "Invent a person and describe them as JSON like \
    {\"name\": \"Ann Lee\", \"age\": 31, \"role\": \"user\", \"address\": {\"city\": \"Oslo\", \"zip\": \"01234\"}}.";

type Output = (Vec<(TokenId, Option<f32>)>, String, Finished);

fn run_all(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    speculation: bool,
    reqs: &[GenRequest],
) -> Vec<Output> {
    let cfg = EngineConfig {
        max_running: 16,
        n_ctx: 1024,
        kv_tokens: 16384,
        speculation: speculation.then_some(SpecConfig { max_draft: 16 }),
        ..Default::default()
    };
    let h = Engine::start(model.clone(), tok.clone(), cfg);
    let rxs: Vec<_> = reqs.iter().map(|r| h.submit(r.clone()).unwrap()).collect();
    let outs = rxs
        .into_iter()
        .map(|rx| {
            let (events, text, f) = common::drain_events(rx);
            let toks = events.iter().map(|t| (t.token, t.logprob)).collect();
            (toks, text, f)
        })
        .collect();
    h.shutdown();
    outs
}

fn constrained(prompt: Vec<TokenId>, spec: GrammarSpec, seed: u64, max: usize) -> GenRequest {
    let mut p = SamplingParams::unrestricted(seed);
    p.grammar = Some(spec);
    let mut r = GenRequest::new(prompt, p);
    r.max_tokens = Some(max);
    r
}

#[test]
fn every_sample_validates_against_its_schema() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = common::pulled(QWEN) else {
        return;
    };
    let prompt = chat(&tok, PERSON_PROMPT);
    let spec = GrammarSpec::JsonSchema(person_schema());
    // 24 seeds at temperature 1 with nothing truncated, speculation on, all in one batch.
    let reqs: Vec<GenRequest> = (0..24)
        .map(|seed| constrained(prompt.clone(), spec.clone(), seed, 160))
        .collect();
    let outs = run_all(&model, &tok, true, &reqs);
    let mut drafts = 0;
    for (seed, (toks, text, f)) in outs.iter().enumerate() {
        assert_eq!(f.finish_reason, FinishReason::Stop, "seed {seed}: {text}");
        // The grammar ends with an end-of-generation token, not in the output.
        assert_eq!(f.completion_tokens, toks.len() + 1);
        check_person(text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        drafts += f.speculation.proposed;
    }
    eprintln!("{}\n{}\n(proposed drafts: {drafts})", outs[0].1, outs[1].1);
    // json_object: any object.
    let reqs: Vec<GenRequest> = (0..8)
        .map(|seed| constrained(prompt.clone(), GrammarSpec::JsonObject, seed, 200))
        .collect();
    for (seed, (_, text, f)) in run_all(&model, &tok, true, &reqs).iter().enumerate() {
        assert_eq!(f.finish_reason, FinishReason::Stop, "seed {seed}: {text}");
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v.is_object(), "{text}");
    }
}

#[test]
fn regex_and_lark_grammars() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = common::pulled(QWEN) else {
        return;
    };
    let date = GrammarSpec::Regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}".into());
    let answer = GrammarSpec::Lark(
        "start: (\"yes\" | \"no\") \", because \" reason \".\"\nreason: /[a-z ]{1,40}/".into(),
    );
    let mut reqs = Vec::new();
    for seed in 0..6 {
        let p = chat(&tok, "On what date did the first person walk on the Moon?");
        reqs.push(constrained(p, date.clone(), seed, 30));
        let p = chat(&tok, "Is water wet? Answer yes or no and say why.");
        reqs.push(constrained(p, answer.clone(), seed, 60));
    }
    for (i, (_, text, f)) in run_all(&model, &tok, true, &reqs).iter().enumerate() {
        assert_eq!(f.finish_reason, FinishReason::Stop, "{i}: {text}");
        if i % 2 == 0 {
            let b = text.as_bytes();
            assert!(b.len() == 10 && b[4] == b'-' && b[7] == b'-', "{text}");
            assert!(text.replace('-', "").bytes().all(|c| c.is_ascii_digit()));
        } else {
            let rest = text
                .strip_prefix("yes, because ")
                .or_else(|| text.strip_prefix("no, because "))
                .unwrap_or_else(|| panic!("{text}"));
            let reason = rest.strip_suffix('.').unwrap_or_else(|| panic!("{text}"));
            assert!((1..=40).contains(&reason.len()), "{text}");
            assert!(reason.bytes().all(|c| c == b' ' || c.is_ascii_lowercase()));
        }
    }
}

#[test]
fn same_output_alone_and_in_a_batch_with_speculation() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = common::pulled(QWEN) else {
        return;
    };
    let prompt = chat(&tok, PERSON_PROMPT);
    let spec = GrammarSpec::JsonSchema(person_schema());
    // Choices 0..3 of one seed (n = 3), with logprobs.
    let mut target: Vec<GenRequest> = (0..3)
        .map(|i| {
            let mut r = constrained(prompt.clone(), spec.clone(), 7, 160);
            r.sampling = r.sampling.for_choice(i);
            r.sampling.logprobs = Some(2);
            r
        })
        .collect();
    // A stop string inside the JSON.
    let mut stopped = constrained(prompt.clone(), spec.clone(), 7, 160);
    stopped.stop = vec!["\"role\"".into()];
    target.push(stopped);
    // max_tokens ends the JSON early.
    target.push(constrained(prompt.clone(), spec.clone(), 7, 6));
    let alone: Vec<Output> = target
        .iter()
        .map(|r| run_all(&model, &tok, false, std::slice::from_ref(r)).remove(0))
        .collect();
    // In one batch, between unconstrained requests, with ngram speculation.
    let mut batch = Vec::new();
    for (i, r) in target.iter().enumerate() {
        let free = chat(&tok, "Write a JSON list of three fruits.");
        let mut p = SamplingParams::unrestricted(100 + i as u64);
        p.logprobs = Some(1);
        let mut f = GenRequest::new(free, p);
        f.max_tokens = Some(40);
        batch.push(f);
        batch.push(r.clone());
    }
    let together = run_all(&model, &tok, true, &batch);
    for (i, a) in alone.iter().enumerate() {
        let b = &together[2 * i + 1];
        assert_eq!(a.0, b.0, "request {i}: tokens or logprobs differ");
        assert_eq!(a.1, b.1, "request {i}");
        assert_eq!(a.2.finish_reason, b.2.finish_reason, "request {i}");
    }
    // The three choices: valid, logprobs on every token, not all the same.
    for (toks, text, f) in &alone[..3] {
        assert_eq!(f.finish_reason, FinishReason::Stop);
        check_person(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(toks.iter().all(|(_, lp)| lp.is_some_and(|l| l <= 0.0)));
    }
    assert!(alone[0].1 != alone[1].1 || alone[1].1 != alone[2].1);
    // Choice 0 is what n = 1 gives; the stop string cuts it before "role".
    let full = &alone[0].1;
    let cut = &alone[3];
    assert_eq!(cut.2.finish_reason, FinishReason::Stop);
    assert!(full.starts_with(&cut.1) && full[cut.1.len()..].starts_with("\"role\""));
    // max_tokens: a prefix of the same JSON, finish reason length.
    let short = &alone[4];
    assert_eq!(short.2.finish_reason, FinishReason::Length);
    assert_eq!(short.0.len(), 6);
    assert!(full.starts_with(&short.1), "{} / {full}", short.1);
}

#[test]
fn session_with_and_without_a_speculator() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = common::pulled(QWEN) else {
        return;
    };
    let prompt = chat(&tok, PERSON_PROMPT);
    let mut req = GenerateRequest {
        max_tokens: 160,
        ..Default::default()
    };
    req.sampling = SamplingParams::unrestricted(3);
    req.sampling.grammar = Some(GrammarSpec::JsonSchema(person_schema()));
    let mut plain = Session::new(&model, 1024);
    let a = plain.generate(&tok, &prompt, &req, |_| {}).unwrap();
    let mut spec = Speculator::new(Box::new(NgramProposer::default()), 16);
    let mut fast = Session::new(&model, 1024);
    let b = fast
        .generate_with(&tok, &prompt, &req, Some(&mut spec), |_| {})
        .unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.finish_reason, FinishReason::Stop);
    check_person(&a.text).unwrap_or_else(|e| panic!("{e}: {}", a.text));
    eprintln!("{} {:?}", a.text, b.speculation);
    // The same request through the engine gives the same tokens.
    let mut r = GenRequest::new(prompt.clone(), req.sampling.clone());
    r.max_tokens = Some(160);
    let e = run_all(&model, &tok, true, &[r]).remove(0);
    let toks: Vec<TokenId> = e.0.iter().map(|t| t.0).collect();
    assert_eq!(toks, a.tokens);
}
