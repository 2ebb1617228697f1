//! What the KV cache shows over HTTP: prefix-cache usage and metrics, context policies
//! per request.

use nucleus::engine::scheduler::EngineConfig;
use serde_json::{json, Value};

use crate::common::*;

/// Two chat requests sharing a long system prompt: the second reports the cached prompt
/// tokens (OpenAI's `usage.prompt_tokens_details.cached_tokens`, in the stream's usage chunk
/// too), /metrics counts the lookups and hits, and the answer is the one a server without the
/// prefix cache gives.
#[test]
fn prefix_cache_reports_cached_tokens_and_changes_nothing() {
    let system = "You are a careful assistant. ".repeat(20);
    let ask = |addr, q: &str, stream: bool| {
        let mut req = json!({"messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": q}],
            "max_tokens": 8, "temperature": 0});
        if stream {
            req["stream"] = json!(true);
            req["stream_options"] = json!({"include_usage": true});
        }
        post(addr, "/v1/chat/completions", &req)
    };
    let Some(plain) = start(
        EngineConfig {
            prefix_caching: false,
            ..small()
        },
        None,
    ) else {
        return;
    };
    let want = ask(plain.addr, "What is two plus two?", false);
    assert_eq!(want.status, 200, "{}", want.text());
    let want = want.json();
    assert_eq!(want["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    drop(plain);

    let srv = start(small(), None).unwrap();
    let first = ask(srv.addr, "Name a colour.", false).json();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let second = ask(srv.addr, "What is two plus two?", false).json();
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= prompt / 2 && cached < prompt && cached % 16 == 0,
        "{cached} of {prompt} prompt tokens cached"
    );
    assert_eq!(
        second["choices"][0]["message"]["content"],
        want["choices"][0]["message"]["content"]
    );
    // Streamed, the usage chunk says the same (now the whole prompt but its last block).
    let r = ask(srv.addr, "What is two plus two?", true);
    let usage = r
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .find(|v| !v["usage"].is_null())
        .expect("a usage chunk")["usage"]
        .clone();
    assert!(
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= cached
    );
    let t = get(srv.addr, "/metrics").text();
    let metric = |name: &str| -> f64 {
        t.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{t}"))
            .parse()
            .unwrap()
    };
    let first_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        metric("nucleus_prefix_cache_queries_total"),
        (first_prompt + 2 * prompt) as f64
    );
    assert!(metric("nucleus_prefix_cache_hits_total") >= 2.0 * cached as f64);
    assert!(metric("nucleus_kv_blocks_cached") > 0.0);
    assert_eq!(
        metric("nucleus_kv_cache_usage_ratio"),
        0.0,
        "no request running"
    );
}

/// `context_policy` per request: `error` (the server's default) refuses a prompt longer than
/// the window, `truncate` answers and says how many prompt tokens it dropped, `stream` runs
/// past the window; an unknown policy is a 400 naming the field.
#[test]
fn context_policies_per_request() {
    let Some(srv) = start(
        EngineConfig {
            n_ctx: 64,
            kv_tokens: 1024,
            ..Default::default()
        },
        None,
    ) else {
        return;
    };
    let prompt = "one two three four five six seven eight nine ten ".repeat(12);
    let ask = |policy: Option<&str>, max_tokens: usize| {
        let mut req = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": true});
        if let Some(p) = policy {
            req["context_policy"] = json!(p);
        }
        post(srv.addr, "/v1/completions", &req)
    };
    let r = ask(None, 4);
    assert_error(&r, 400, Some("prompt"));
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    let r = ask(Some("truncate"), 4);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let dropped = v["dropped_tokens"].as_u64().unwrap();
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(dropped > 0);
    assert_eq!(prompt_tokens, 60, "room left for the 4 tokens asked");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    let r = ask(Some("stream"), 100);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 100);
    assert!(v["dropped_tokens"].as_u64().unwrap() >= dropped + 100 - 64);
    let r = ask(Some("rolling"), 4);
    assert_error(&r, 400, Some("context_policy"));
    assert!(r.text().contains("rolling"));
}
