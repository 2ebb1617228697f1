//! `nucleus serve` under SIGTERM, as a rollout or a scale-down sends it: with streams in
//! flight, `/health` answers 503 at once while new connections are still accepted and served
//! for `--unready-secs`; then the server stops accepting, lets what runs finish (`--drain-secs`)
//! and exits 0. Nothing is cut short, a request still queued when the signal comes included,
//! and `--max-tokens` bounds what a request asking for more generates (as the Deployment runs
//! it: deploy/kubernetes/nucleus-deployment.yaml). The real binary and a real signal, on the
//! catalog model.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

/// One HTTP/1.1 exchange on a new connection: (status, body), or `None` when the connection is
/// refused or closed before an answer.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split(' ').nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// A streamed completion's generated tokens (one SSE event each, `[DONE]` required) and its
/// finish reason.
fn streamed(body: &str) -> (usize, String) {
    assert!(body.contains("data: [DONE]"), "the stream was cut: {body}");
    let mut tokens = 0;
    let mut finish = String::new();
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
            continue;
        };
        assert!(v.get("error").is_none(), "an error event: {data}");
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = f.to_string();
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            tokens = n as usize;
        }
    }
    (tokens, finish)
}

#[test]
fn sigterm_serves_while_unready_then_drains_without_cutting_anything() {
    let Some(model) = catalog("qwen2.5-coder-0.5b-instruct-q4_k_m") else {
        return;
    };
    let unready = Duration::from_secs(3);
    let mut child = Command::new(env!("CARGO_BIN_EXE_nucleus"))
        .args([
            "serve",
            &model,
            "--port",
            "0",
            "--ctx",
            "512",
            "--threads",
            "2",
        ])
        .args(["--unready-secs", "3", "--drain-secs", "60"])
        .args(["--max-running", "2", "--max-tokens", "96"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let port: u16 = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split([' ', '/']).next())
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let (log_tx, log_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
        let _ = log_tx.send(rest);
    });

    // Two long streams in flight and a third queued behind them when the signal comes; each
    // asks for far more than --max-tokens.
    let stream_body = r#"{"prompt": "def sort(xs):\n", "max_tokens": 100000, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true}}"#;
    let streams: Vec<_> = (0..3)
        .map(|_| std::thread::spawn(move || http(port, "POST", "/v1/completions", stream_body)))
        .collect();
    let t0 = Instant::now();
    loop {
        let (_, m) = http(port, "GET", "/metrics", "").unwrap();
        let gauge = |name: &str| {
            m.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        if gauge("nucleus_requests_running") >= 2.0 && gauge("nucleus_requests_waiting") >= 1.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the streams never ran (two) and queued (one)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let signalled = Instant::now();
    std::thread::sleep(Duration::from_millis(200));

    // Unready, yet serving: the probe fails, a new connection gets a whole answer (queued
    // behind the streams, it is answered during the drain).
    let (health, _) = http(port, "GET", "/health", "").expect("no answer to /health");
    assert_eq!(health, 503);
    let sent = signalled.elapsed();
    let (st, body) = http(
        port,
        "POST",
        "/v1/completions",
        r#"{"prompt": "x = ", "max_tokens": 4, "ignore_eos": true}"#,
    )
    .expect("a new request during the unready window was refused");
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 4, "{body}");
    assert!(
        sent < unready - Duration::from_millis(500),
        "the checks took past the window ({sent:?}): the test proves nothing"
    );

    // After the window: no new connections.
    std::thread::sleep(unready.saturating_sub(signalled.elapsed()) + Duration::from_millis(500));
    let late = http(port, "GET", "/health", "");
    assert!(late.is_none(), "still accepting after the window: {late:?}");

    // The streams end whole, and the server exits cleanly.
    for s in streams {
        let (st, body) = s.join().unwrap().expect("a stream's connection was cut");
        assert_eq!(st, 200, "{body}");
        assert_eq!(streamed(&body), (96, "length".to_string()), "{body}");
    }
    let exit = child.wait().unwrap();
    let log = log_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(exit.success(), "{exit:?}: {log}");
    assert!(log.contains("nucleus serve: stopped\n"), "{log}");
}
