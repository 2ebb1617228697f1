//! `nucleus perplexity`: a run compared with the base it saved is at KL 0 with every top-1
//! kept, in JSON and in text; a base from another window, or flags that contradict each other,
//! are one-line errors; the same with llama.cpp's base format and formula. On the tiny model
//! (`../shared`).

mod common;

use std::path::PathBuf;

use common::{fails_with, nucleus, tiny};

fn json(args: &[String]) -> serde_json::Value {
    let (code, out, err) = nucleus(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// A fresh directory `name` holding `text.txt`, 400 words `word{i % modulo} {joiner}`; the
/// directory, the text's path, a base's path in it, and the words.
fn workspace(name: &str, joiner: &str, modulo: usize) -> (PathBuf, String, String, Vec<String>) {
    let dir = std::env::temp_dir().join(format!("nucleus-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let words: Vec<String> = (0..400)
        .map(|i| format!("word{} {joiner}", i % modulo))
        .collect();
    std::fs::write(dir.join("text.txt"), words.join(" ")).unwrap();
    let path = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let (text, base) = (path("text.txt"), path("base.kld"));
    (dir, text, base, words)
}

#[test]
fn a_run_against_its_own_base_and_the_errors() {
    let Some(m) = tiny() else { return };
    let (dir, text, base, _) = workspace("ppl", "and", 37);
    let (text, base) = (text.as_str(), base.as_str());
    let common = ["perplexity", &m, text, "--ctx", "64", "-t", "2"];
    let with = |more: &[&str]| -> Vec<String> {
        common.iter().chain(more).map(|s| s.to_string()).collect()
    };

    let saved = json(&with(&["--json", "--kl-divergence-base", base]));
    let ppl = saved["ppl"].as_f64().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{saved}");
    assert!(saved["tokens_scored"].as_u64().unwrap() > 0, "{saved}");
    assert!(saved.get("kl_divergence").is_none(), "{saved}");

    let again = json(&with(&["--json", "--kl-divergence", base]));
    assert_eq!(
        again["ppl"], saved["ppl"],
        "the same run, the same perplexity"
    );
    let kl = &again["kl_divergence"];
    assert_eq!(kl["mean"].as_f64(), Some(0.0), "{again}");
    assert_eq!(kl["top1_agreement"].as_f64(), Some(1.0), "{again}");

    let (code, out, err) = nucleus(&with(&["--kl-divergence", base]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Final estimate: PPL = "), "{out}");
    assert!(
        out.contains("KL divergence from the base (top k + rest): mean 0.000000")
            && out.contains("top-1 agreement 100.00%"),
        "{out}"
    );

    fails_with(
        &[
            "perplexity",
            &m,
            text,
            "--ctx",
            "32",
            "--kl-divergence",
            base,
        ],
        "the KL base was made with --ctx 64",
    );
    fails_with(
        &with(&["--kl-divergence", base, "--kl-divergence-base", base]),
        "use one at a time",
    );
    fails_with(
        &with(&["--stream-sinks", "2"]),
        "--stream-sinks is for --context-policy stream",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_run_against_its_own_llama_cpp_base_and_the_errors() {
    let Some(m) = tiny() else { return };
    let (dir, text, base, words) = workspace("ppl-llama", "or", 41);
    let (text, base) = (text.as_str(), base.as_str());
    let common = ["perplexity", &m, text, "--ctx", "64", "-t", "2", "--json"];
    let with = |more: &[&str]| -> Vec<String> {
        common.iter().chain(more).map(|s| s.to_string()).collect()
    };

    let saved = json(&with(&["--exact", "--kl-divergence-base-llama", base]));
    let scored = saved["tokens_scored"].as_u64().unwrap();
    let again = json(&with(&["--exact", "--kl-divergence-llama", base]));
    let kl = &again["kl_divergence"];
    assert_eq!(kl["method"], "llama.cpp, whole vocabulary", "{again}");
    assert_eq!(kl["positions"].as_u64(), Some(scored), "{again}");
    // The base's u16 steps are all that part a run from itself.
    assert!(kl["mean"].as_f64().unwrap().abs() < 1e-5, "{again}");
    // The run's own perplexity is unchanged; the base's is at most it, since its rows floor
    // the log-probabilities at 16 below the top (the tiny random model's targets are often
    // under that floor).
    assert_eq!(again["ppl"], saved["ppl"], "{again}");
    assert!(kl["ppl_base"].as_f64() <= kl["ppl"].as_f64(), "{again}");
    let fast = json(&with(&["--kl-divergence-llama", base]));
    let kl = &fast["kl_divergence"];
    assert!(kl["mean"].as_f64().unwrap() < 0.01, "{fast}");
    assert!(kl["top1_agreement"].as_f64().unwrap() > 0.5, "{fast}");

    let other = [
        "perplexity",
        &m,
        text,
        "--ctx",
        "32",
        "--kl-divergence-llama",
        base,
    ];
    fails_with(&other, "made with windows of 64 tokens");
    fails_with(
        &with(&["--kl-divergence-llama", base, "--kl-divergence", base]),
        "use one at a time",
    );
    fails_with(
        &with(&[
            "--kl-divergence-llama",
            base,
            "--kl-divergence-base-llama",
            base,
        ]),
        "give two paths",
    );
    fails_with(
        &with(&["--kl-divergence-llama", base, "--context-policy", "stream"]),
        "fresh windows only",
    );
    let short = dir.join("short.txt");
    std::fs::write(&short, words[..200].join(" ")).unwrap();
    let short = short.to_str().unwrap();
    fails_with(
        &[
            "perplexity",
            &m,
            short,
            "--ctx",
            "64",
            "--kl-divergence-llama",
            base,
        ],
        "made on another text",
    );
    std::fs::write(dir.join("bad.kld"), b"_logits_\x01").unwrap();
    let bad = dir.join("bad.kld");
    fails_with(
        &with(&["--kl-divergence-llama", bad.to_str().unwrap()]),
        "cannot read the llama.cpp KL base",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
