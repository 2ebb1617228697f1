//! nucleus against a reference in the golden format (as `scripts/llama_cpp_reference.cpp`
//! writes it): along the reference path (the prompt as one batch, then its greedy tokens one at
//! a time) the largest and mean difference over the reference's top-8 logits and the top-1
//! flips; run free, the step where nucleus's greedy tokens part from the reference's, with the
//! reference's top-2 margin there. One summary line per file.
//!
//! Usage: cargo run --release -p nucleus --example compare_reference -- MODEL.gguf REF.jsonl
//! (`--exact` arithmetic unless NUCLEUS_EXACT=0; 2 threads).

use nucleus::engine::{argmax, Session};
use nucleus::model::{Arithmetic, Model};
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect()
        })
        .unwrap_or_default()
}

fn tops(v: &Value) -> Vec<Vec<(usize, f32)>> {
    let steps = v.as_array().map(Vec::as_slice).unwrap_or_default();
    steps
        .iter()
        .map(|s| {
            let top = s["top"].as_array().map(Vec::as_slice).unwrap_or_default();
            top.iter()
                .map(|p| {
                    (
                        p[0].as_u64().unwrap_or(0) as usize,
                        p[1].as_f64().unwrap_or(0.0) as f32,
                    )
                })
                .collect()
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, model_path, ref_path] = &args[..] else {
        return Err("usage: compare_reference MODEL.gguf REF.jsonl".into());
    };
    let arithmetic = match std::env::var("NUCLEUS_EXACT").as_deref() {
        Ok("0") => Arithmetic::Fast,
        _ => Arithmetic::Exact,
    };
    let model = Model::load_with(model_path, 2, arithmetic)?;
    let vocab = model.hp.n_vocab;
    let (mut worst, mut sum, mut count) = (0f32, 0f64, 0usize);
    let (mut flips, mut checked) = (0, 0);
    let mut partings = Vec::new();
    for (case_no, line) in std::fs::read_to_string(ref_path)?.lines().enumerate() {
        let case: Value = serde_json::from_str(line)?;
        let tokens = ids(&case["tokens"]);
        let greedy = ids(&case["greedy_tokens"]);
        let steps: Vec<_> = tops(&case["prompt_logits"])
            .into_iter()
            .chain(tops(&case["greedy_steps"]))
            .collect();
        // Along the reference path.
        let mut session = Session::new(&model, tokens.len() + greedy.len() + 8);
        let mut logits = session.feed(&tokens, 512, true)?;
        for &t in &greedy[..steps.len() - tokens.len()] {
            logits.extend(session.feed(&[t], 1, false)?);
        }
        for (i, step) in steps.iter().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            for &(id, reference) in step {
                let diff = (row[id] - reference).abs();
                worst = worst.max(diff);
                sum += diff as f64;
                count += 1;
            }
            if step[0].1 - step[1].1 >= 0.1 {
                checked += 1;
                if argmax(row) as usize != step[0].0 {
                    flips += 1;
                }
            }
        }
        // Free greedy run, one token at a time as the reference made its own.
        let mut session = Session::new(&model, tokens.len() + greedy.len() + 8);
        let mut last = session.feed(&tokens, 512, false)?;
        for (j, &want) in greedy.iter().enumerate() {
            let ours = argmax(&last);
            if ours != want {
                let chooser = &steps[tokens.len() - 1 + j];
                let margin = chooser[0].1 - chooser[1].1;
                partings.push(format!("prompt {case_no} step {j} (margin {margin:.3})"));
                break;
            }
            if j + 1 < greedy.len() {
                last = session.feed(&[ours], 1, false)?;
            }
        }
    }
    let parts = if partings.is_empty() {
        "none".to_string()
    } else {
        partings.join(", ")
    };
    println!(
        "{model_path}: top-8 logit difference max {worst:.6} mean {:.6} over {count} (the reference prints 6 decimals); top-1 flips at margin >= 0.1: {flips}/{checked}; greedy runs part at: {parts}",
        sum / count.max(1) as f64
    );
    Ok(())
}
