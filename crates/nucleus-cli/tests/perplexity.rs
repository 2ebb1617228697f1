//! `nucleus perplexity`: a run compared with the base it saved is at KL 0 with every top-1
//! kept, in JSON and in text; a base from another window, or flags that contradict each other,
//! are one-line errors. On the tiny model (`../shared`).

mod common;

use common::{fails_with, nucleus, tiny};

fn json(args: &[String]) -> serde_json::Value {
    let (code, out, err) = nucleus(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

#[test]
fn a_run_against_its_own_base_and_the_errors() {
    let Some(m) = tiny() else { return };
    let dir = std::env::temp_dir().join(format!("nucleus-cli-ppl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("text.txt");
    let words: Vec<String> = (0..400).map(|i| format!("word{} and", i % 37)).collect();
    std::fs::write(&text, words.join(" ")).unwrap();
    let text = text.to_str().unwrap();
    let base = dir.join("base.kld");
    let base = base.to_str().unwrap();
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
        out.contains("KL divergence from the base: mean 0.000000")
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
