//! nucleus's side of `scripts/hf_vs_transformers.py`: loads a Hugging Face checkpoint
//! directory as `nucleus run DIR` does, and for each case of a reference file (`[{prompt,
//! ids, greedy}]`) writes the ids nucleus's tokenizer gives the prompt (with special tokens),
//! the logits at every position of the reference's path (its ids, then its greedy tokens, one
//! forward over the prompt and then one token at a time), and nucleus's own greedy
//! continuation of the same length.
//!
//!   cargo run --release -p nucleus --example hf_logits -- DIR REFERENCE.json OUT.json

use nucleus::engine::{argmax, Session};
use nucleus::model::Model;
use nucleus::tokenizer::Tokenizer;
use serde_json::{json, Value};

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, reference, out] = args.as_slice() else {
        eprintln!("usage: hf_logits DIR REFERENCE.json OUT.json");
        std::process::exit(2);
    };
    let model = Model::load(dir, 0).unwrap_or_else(|e| {
        eprintln!("cannot load {dir}: {e}");
        std::process::exit(1)
    });
    let tok = Tokenizer::from_gguf(&model.file.metadata).expect("tokenizer");
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(reference).expect("reference"))
            .expect("json");
    let mut results = Vec::new();
    for case in &cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let ref_ids = ids(&case["ids"]);
        let ref_greedy = ids(&case["greedy"]);
        let our_ids = tok.encode(prompt, true, true).expect("encode");

        let n_ctx = ref_ids.len() + ref_greedy.len() + 8;
        let mut session = Session::new(&model, n_ctx);
        let mut logits = session.feed(&ref_ids, 512, true).expect("forward");
        for &t in &ref_greedy {
            logits.extend(session.feed(&[t], 1, false).expect("forward"));
        }
        // The reference's path ends with a greedy token whose logits it computed too.
        let mut free = Session::new(&model, n_ctx);
        let mut last = free.feed(&ref_ids, 512, false).expect("forward");
        let mut greedy = Vec::new();
        for _ in 0..ref_greedy.len() {
            let t = argmax(&last);
            greedy.push(t);
            last = free.feed(&[t], 1, false).expect("forward");
        }
        results.push(json!({"ids": our_ids, "greedy": greedy, "logits": logits}));
    }
    std::fs::write(out, serde_json::to_string(&results).expect("json")).expect("write");
}
