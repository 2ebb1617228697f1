//! Decode speed with and without a JSON-schema constraint (the grammar stage's cost).
//!
//! `cargo run --release -p nucleus --example grammar_bench -- MODEL.gguf [tokens] [runs]`
//!
//! The same chat prompt is decoded for `tokens` tokens (default 128) three ways, each `runs`
//! times (default 3; the best run counts): free (greedy, `ignore_eos`), and constrained to a
//! JSON Schema whose shortest valid answer is longer than `tokens` (an array of at least 60
//! records), greedy and at temperature 1, so every run decodes exactly `tokens` tokens and ends
//! with `length`. Prints decode tokens/s of each and the slowdown; speculation is off.

use std::time::Instant;

use nucleus::engine::{GenerateRequest, Session};
use nucleus::model::Model;
use nucleus::sampling::{GrammarCompiler, GrammarSpec, SamplingParams};
use nucleus::tokenizer::Tokenizer;
use serde_json::json;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: grammar_bench MODEL.gguf [tokens] [runs]");
    let tokens: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(128);
    let runs: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let model = Model::load(&path, 0).expect("load the model");
    let tok = Tokenizer::from_gguf(&model.file.metadata).expect("tokenizer");
    let t = Instant::now();
    GrammarCompiler::for_tokenizer(&tok).expect("grammar compiler");
    let setup_ms = t.elapsed().as_secs_f64() * 1e3;
    let text = if tok.token_id("<start_of_turn>").is_some() {
        "<start_of_turn>user\nList sixty people as JSON records with name, age and city.<end_of_turn>\n<start_of_turn>model\n"
    } else {
        "<|im_start|>user\nList sixty people as JSON records with name, age and city.<|im_end|>\n<|im_start|>assistant\n"
    };
    let prompt = tok.encode(text, true, true).unwrap();
    let schema = json!({
        "type": "array", "minItems": 60,
        "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}
        }, "required": ["name", "age", "city"], "additionalProperties": false}
    });
    let free = GenerateRequest {
        max_tokens: tokens,
        ignore_eos: true,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    };
    let mut json_greedy = GenerateRequest {
        ignore_eos: false,
        ..free.clone()
    };
    json_greedy.sampling.grammar = Some(GrammarSpec::JsonSchema(schema));
    let mut json_t1 = json_greedy.clone();
    json_t1.sampling = SamplingParams {
        grammar: json_greedy.sampling.grammar.clone(),
        ..SamplingParams::unrestricted(1)
    };
    println!("{path}: {tokens} tokens, best of {runs}; grammar compiler for the vocabulary built in {setup_ms:.0} ms");
    let mut base = 0.0;
    for (name, req) in [
        ("free, greedy", &free),
        ("JSON schema, greedy", &json_greedy),
        ("JSON schema, T=1", &json_t1),
    ] {
        let mut best = 0.0f64;
        for _ in 0..runs {
            let mut s = Session::new(&model, 2048);
            let g = s.generate(&tok, &prompt, req, |_| {}).expect("generate");
            assert_eq!(g.tokens.len(), tokens, "{name}: {}", g.text);
            best = best.max(g.timings.generate_tokens_per_s);
        }
        if base == 0.0 {
            base = best;
            println!("{name:>22}: {best:6.2} tok/s");
        } else {
            println!(
                "{name:>22}: {best:6.2} tok/s ({:+.1} %)",
                (best / base - 1.0) * 100.0
            );
        }
    }
}
