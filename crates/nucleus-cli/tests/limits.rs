//! Sizes beyond their bounds are one-line errors naming the flag, before anything large is
//! allocated: the context against the model's training context and the memory available,
//! threads, and `serve`'s queue, batch and body sizes. On the tiny model (`../shared`).

mod common;

use std::process::Command;

use common::{fails_with, nucleus, tiny};

#[test]
fn context_limits() {
    let Some(m) = tiny() else { return };
    // Trained on 2048 tokens: above needs the flag.
    fails_with(
        &["run", &m, "hi", "--ctx", "4096", "-n", "1"],
        "above the model's training context (2048 tokens)",
    );
    let (code, _, err) = nucleus(&[
        "run",
        &m,
        "hi",
        "--ctx",
        "4096",
        "--allow-long-context",
        "-n",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    fails_with(
        &[
            "run",
            &m,
            "hi",
            "--ctx",
            "999999999",
            "--allow-long-context",
        ],
        "at most 16777216 tokens",
    );
    fails_with(&["run", &m, "hi", "--ctx", "1"], "too small");
    // A KV cache beyond the memory available errors before it is allocated (where the machine
    // has less available than the largest cache the flags allow).
    let model = nucleus::model::Model::load(&m, 1).unwrap();
    let need = |tokens: usize| {
        model
            .memory_plan(tokens, nucleus::kv_cache::KvType::F16, 16, 256)
            .allocated_bytes() as u64
    };
    let avail = nucleus::model::available_memory().unwrap_or(u64::MAX);
    if avail < need(1 << 24) {
        fails_with(
            &[
                "run",
                &m,
                "hi",
                "--ctx",
                "16777216",
                "--allow-long-context",
                "-n",
                "1",
            ],
            "not enough memory",
        );
    }
    if avail < need(1 << 25) {
        fails_with(
            &["serve", &m, "--kv-tokens", "33554432", "--port", "0"],
            "not enough memory",
        );
    } else {
        eprintln!("note: this machine has too much memory for the out-of-memory cases");
    }
    fails_with(
        &["serve", &m, "--kv-tokens", "33554433", "--port", "0"],
        "beyond what nucleus supports",
    );
    fails_with(
        &["serve", &m, "--ctx", "4096", "--port", "0"],
        "--allow-long-context",
    );
    fails_with(
        &[
            "serve",
            &m,
            "--ctx",
            "512",
            "--kv-tokens",
            "100",
            "--port",
            "0",
        ],
        "--kv-tokens 100 is less than the context window",
    );
}

#[test]
fn thread_queue_and_body_limits() {
    let Some(m) = tiny() else { return };
    fails_with(
        &["run", &m, "hi", "--threads", "100000"],
        "--threads 100000",
    );
    fails_with(&["serve", &m, "--threads", "100000"], "--threads 100000");
    fails_with(
        &["serve", &m, "--queue", "1000000"],
        "--queue 1000000 is out of range",
    );
    fails_with(
        &["serve", &m, "--max-running", "0"],
        "--max-running 0 is out of range",
    );
    fails_with(
        &["serve", &m, "--block-size", "0"],
        "--block-size 0 is out of range",
    );
    fails_with(
        &["serve", &m, "--step-tokens", "0"],
        "--step-tokens 0 is out of range",
    );
    fails_with(
        &["serve", &m, "--max-body-bytes", "10"],
        "--max-body-bytes 10 is out of range",
    );
}

/// `bench` with no prompt (`-p 0`, decode only) or no generation (`-g 0`) measures what is left
/// and says which kernels ran, instead of panicking on the empty prompt.
#[test]
fn bench_takes_empty_phases() {
    let Some(m) = tiny() else { return };
    for (p, g) in [("0", "4"), ("8", "0")] {
        let out = Command::new(env!("CARGO_BIN_EXE_nucleus"))
            .args(["bench", &m, "-t", "1", "-p", p, "-g", g, "--json"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "-p {p} -g {g}: {err}");
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let (pp, tg) = (
            j["prefill_tokens_per_s"].as_f64().unwrap(),
            j["decode_tokens_per_s"].as_f64().unwrap(),
        );
        assert_eq!(pp > 0.0, p != "0", "{j}");
        assert_eq!(tg > 0.0, g != "0", "{j}");
        assert!(j["kernels"].is_string() && j["amx"].is_string(), "{j}");
    }
}

/// `bench --depth` measures after that much context (llama-bench's `-d`), says so in its JSON,
/// and refuses a depth past the largest context with a clear error.
#[test]
fn bench_at_a_depth() {
    let Some(m) = tiny() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_nucleus"))
        .args([
            "bench", &m, "-t", "1", "-p", "8", "-g", "4", "-d", "40", "--json",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["depth"], 40, "{j}");
    assert!(j["prefill_tokens_per_s"].as_f64().unwrap() > 0.0, "{j}");
    assert!(j["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{j}");
    for depth in ["1000000000", "18446744073709551615"] {
        let out = Command::new(env!("CARGO_BIN_EXE_nucleus"))
            .args(["bench", &m, "-t", "1", "-d", depth, "--json"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.starts_with("error: "), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
