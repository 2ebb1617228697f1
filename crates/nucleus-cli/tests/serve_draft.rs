//! `nucleus serve --speculate draft`: a draft model that is missing or whose vocabulary
//! differs from the model's is a one-line error and exit code 1, before the server listens;
//! a good one serves, says so at startup, answers as the server without speculation, and
//! /metrics shows its counters and pool. On the catalog models.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::fails_with;

mod common;

fn catalog(name: &str) -> Option<String> {
    let dir = std::env::var_os("NUCLEUS_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/nucleus/models")
        });
    let p = dir.join(format!("{name}.gguf"));
    if p.exists() {
        return Some(p.to_string_lossy().into_owned());
    }
    assert!(std::env::var_os("CI").is_none(), "{name} is missing");
    eprintln!("skipped: {} is absent", p.display());
    None
}

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const GEMMA: &str = "gemma-3-270m-q4_k_m";

#[test]
fn a_bad_draft_model_is_a_clear_error() {
    let (Some(qwen), Some(gemma)) = (catalog(QWEN), catalog(GEMMA)) else {
        return;
    };
    let serve = |draft: &str| {
        [
            "serve",
            &qwen,
            "--port",
            "0",
            "--speculate",
            "draft",
            "--draft-model",
            draft,
        ]
        .map(String::from)
    };
    let missing = serve("/nonexistent/draft.gguf");
    let missing: Vec<&str> = missing.iter().map(String::as_str).collect();
    fails_with(
        &missing,
        "cannot use the draft model /nonexistent/draft.gguf: no model",
    );
    let other = serve(&gemma);
    let other: Vec<&str> = other.iter().map(String::as_str).collect();
    fails_with(&other, "cannot use the draft model: the draft model's vocabulary has 262144 tokens, the model's 151936");
    fails_with(
        &["serve", &qwen, "--speculate", "draft"],
        "--speculate draft needs --draft-model",
    );
    fails_with(
        &["serve", &qwen, "--draft-model", &qwen, "--draft-max", "0"],
        "--draft-max",
    );
}

/// A server on a free port: (the child, its port, its startup line).
fn serve(args: &[&str]) -> (std::process::Child, u16, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nucleus"))
        .args(["serve", "--port", "0", "--max-running", "4", "--ctx", "512"])
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let port = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split([' ', '/']).next())
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    // Keep draining stderr so that the server never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    (child, port, line)
}

fn http(port: u16, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or(out)
}

#[test]
fn a_draft_serves_the_same_answers_and_is_counted() {
    let Some(qwen) = catalog(QWEN) else {
        return;
    };
    let body = r#"{"prompt": "def fib(n):\n", "max_tokens": 24, "temperature": 0.7, "seed": 5}"#;
    let text = |reply: &str| {
        let v: serde_json::Value = serde_json::from_str(reply).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let (mut plain, port, _) = serve(&[&qwen, "--speculate", "off"]);
    let want = text(&http(port, "POST", "/v1/completions", body));
    plain.kill().unwrap();
    plain.wait().unwrap();
    let (mut srv, port, line) = serve(&[&qwen, "--speculate", "draft", "--draft-model", &qwen]);
    assert!(
        line.contains(&format!("draft speculation ({qwen}) up to 16")),
        "{line}"
    );
    assert_eq!(text(&http(port, "POST", "/v1/completions", body)), want);
    let metrics = http(port, "GET", "/metrics", "");
    srv.kill().unwrap();
    srv.wait().unwrap();
    let metric = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
            .parse()
            .unwrap()
    };
    // A draft as costly as the model is not expected to pay: it never starts (its catch-up on
    // the prompt would cost a prefill), and the counters say so.
    let drafts = metric("nucleus_spec_decode_num_drafts_total");
    let proposed = metric("nucleus_spec_decode_num_draft_tokens_total");
    assert_eq!((drafts, proposed), (0, 0), "{metrics}");
    // The request is over: its draft blocks are back in the draft's pool.
    assert!(metric("nucleus_draft_kv_blocks_capacity") > 0, "{metrics}");
    assert_eq!(metric("nucleus_draft_kv_blocks_used"), 0, "{metrics}");
}
