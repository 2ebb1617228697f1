//! The HTTP layer over loopback, with the tiny random model (fast, gibberish): every route, the
//! SSE framing, and every error case. A small HTTP/1.1 client over `TcpStream` keeps the test
//! free of client crates.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nucleus::chat::ChatTemplate;
use nucleus::engine::scheduler::{Engine, EngineConfig, EngineHandle};
use nucleus::model::Model;
use nucleus::tokenizer::Tokenizer;
use nucleus_server::AppState;
use serde_json::{json, Value};

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn tiny_path() -> Option<PathBuf> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/golden/tiny-llama-random.gguf"
    ));
    if p.exists() {
        return Some(p);
    }
    if std::env::var_os("CI").is_some() {
        panic!("the tiny model is missing at {}", p.display());
    }
    eprintln!("skipped: the tiny model is absent at {}", p.display());
    None
}

struct Server {
    addr: SocketAddr,
    engine: EngineHandle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start(cfg: EngineConfig, api_key: Option<&str>) -> Option<Server> {
    let path = tiny_path()?;
    let model = Arc::new(Model::load(&path, 1).unwrap());
    let tok = Arc::new(Tokenizer::from_gguf(&model.file.metadata).unwrap());
    let engine = Engine::start(model, tok.clone(), cfg);
    let mut state = AppState::new(engine.clone(), tok, "tiny", api_key.map(String::from));
    // The tiny model has no chat template; give it ChatML to test the chat route.
    state.template = Some(ChatTemplate::new(CHATML, "", "").unwrap());
    let state = Arc::new(state);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(l.local_addr().unwrap()).unwrap();
            nucleus_server::serve(
                l,
                state,
                async move {
                    let _ = stop_rx.await;
                },
                Duration::from_secs(2),
            )
            .await
            .unwrap();
        });
    });
    Some(Server {
        addr: addr_rx.recv().unwrap(),
        engine,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

fn small() -> EngineConfig {
    EngineConfig {
        n_ctx: 256,
        kv_tokens: 4096,
        ..Default::default()
    }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size_str = std::str::from_utf8(&b[..eol]).unwrap();
        let size = usize::from_str_radix(size_str.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
    out
}

fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut w = s.try_clone().unwrap();
    let body = body.to_vec();
    // Write the body in the background: the server may answer (413) before reading it all.
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&body);
    });
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let _ = writer.join();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body,
    }
}

fn post(addr: SocketAddr, path: &str, v: &Value) -> Resp {
    request(addr, "POST", path, &[], v.to_string().as_bytes())
}

fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"")
}

/// Parses an SSE body: the JSON of every `data:` event before `[DONE]`; checks the framing.
fn sse_events(r: &Resp) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let text = r.text();
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "stream must end with [DONE]: {text:?}"
    );
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let data = e
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("bad event {e:?}"));
        if data == "[DONE]" {
            assert_eq!(i, events.len() - 1, "[DONE] must be last");
            break;
        }
        out.push(serde_json::from_str(data).unwrap());
    }
    out
}

fn assert_error(r: &Resp, status: u16, param: Option<&str>) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{v}");
    }
    v
}

#[test]
fn health_models_metrics() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let r = get(srv.addr, "/health");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "ok");
    let r = get(srv.addr, "/v1/models");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["object"], "list");
    assert_eq!(r.json()["data"][0]["id"], "tiny");
    // One request so the counters move.
    let r = post(
        srv.addr,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 3}),
    );
    assert_eq!(r.status, 200);
    let m = get(srv.addr, "/metrics");
    assert_eq!(m.status, 200);
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    let t = m.text();
    for name in [
        "nucleus_requests_running 0",
        "nucleus_requests_waiting 0",
        "nucleus_kv_blocks_used 0",
        "nucleus_kv_blocks_free ",
        "nucleus_prompt_tokens_total ",
        "nucleus_generation_tokens_total 3",
        "nucleus_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1",
        "nucleus_inter_token_latency_seconds_count 2",
        "nucleus_http_requests_total{outcome=\"ok\"} 1",
    ] {
        assert!(t.contains(name), "missing {name:?} in\n{t}");
    }
    let r = get(srv.addr, "/nope");
    assert_error(&r, 404, None);
}

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

#[test]
fn completion_with_usage_logprobs_and_stream_framing() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let req = json!({"model": "tiny", "prompt": "The capital of France is", "max_tokens": 12,
        "temperature": 0, "logprobs": 2});
    let r = post(srv.addr, "/v1/completions", &req);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        v["usage"]["total_tokens"].as_u64().unwrap(),
        v["usage"]["prompt_tokens"].as_u64().unwrap() + 12
    );
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 12);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 12);
    assert!(lp["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x.as_f64().unwrap() <= 0.0));
    assert!(lp["top_logprobs"][0].as_object().unwrap().len() >= 2);
    let text = c["text"].as_str().unwrap().to_string();

    // The same request streamed: chunks reassemble to the same text.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    sreq["stream_options"] = json!({"include_usage": true});
    let events = sse_events(&post(srv.addr, "/v1/completions", &sreq));
    let mut streamed = String::new();
    let mut finish = None;
    let mut n_lp = 0;
    for e in &events {
        if let Some(c) = e["choices"].as_array().and_then(|c| c.first()) {
            streamed.push_str(c["text"].as_str().unwrap());
            if !c["finish_reason"].is_null() {
                finish = Some(c["finish_reason"].clone());
            }
            n_lp += c["logprobs"]["tokens"].as_array().map_or(0, Vec::len);
        }
    }
    assert_eq!(streamed, text);
    assert_eq!(finish, Some(json!("length")));
    assert_eq!(n_lp, 12);
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 12);
}

#[test]
fn chat_completion_seed_n_stop_and_stream() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let msgs =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]);
    let req = json!({"messages": msgs, "max_tokens": 10, "seed": 42, "temperature": 1.0,
        "ignore_eos": true, "logprobs": true, "top_logprobs": 3});
    let r = post(srv.addr, "/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["role"], "assistant");
    let text = m["content"].as_str().unwrap().to_string();
    let content_lp = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content_lp.len(), 10);
    assert_eq!(content_lp[0]["top_logprobs"].as_array().unwrap().len(), 3);

    // Same seed again, streamed: same text.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let events = sse_events(&post(srv.addr, "/v1/chat/completions", &sreq));
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );

    // n = 3: three independent choices.
    let mut nreq = req.clone();
    nreq["n"] = json!(3);
    let v = post(srv.addr, "/v1/chat/completions", &nreq).json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    assert_eq!(v["usage"]["completion_tokens"], 30);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    // Choice 0 uses the request's seed, choice i stream i of it: different texts.
    assert_eq!(choices[0]["message"]["content"], text.as_str());
    assert_ne!(
        choices[1]["message"]["content"],
        choices[2]["message"]["content"]
    );
    // Issue 15: choice 1 of seed 42 is not choice 0 of seed 43 (it was, with seed + i).
    let mut next_seed = req.clone();
    next_seed["seed"] = json!(43);
    let v43 = post(srv.addr, "/v1/chat/completions", &next_seed).json();
    assert_ne!(
        choices[1]["logprobs"], v43["choices"][0]["logprobs"],
        "choice 1 of seed 42 replays seed 43"
    );

    // A stop string cut from the text ends generation before it.
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[chars.len() / 2..].iter().take(2).collect();
    let mut stop_req = req.clone();
    stop_req["stop"] = json!([stop, "never-appears-zzz"]);
    let v = post(srv.addr, "/v1/chat/completions", &stop_req).json();
    let stopped = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(
        text.starts_with(stopped) && !stopped.contains(&stop),
        "{stopped:?} {stop:?}"
    );
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_stays_up() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    let c = "/v1/completions";
    let r = request(a, "POST", c, &[], b"{\"prompt\": \"hi\",");
    assert_error(&r, 400, None);
    let r = request(a, "POST", c, &[], b"[1, 2]");
    assert_error(&r, 400, None);
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "max_tokens": "ten"})),
        400,
        Some("max_tokens"),
    );
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "temperature": "hot"})),
        400,
        Some("temperature"),
    );
    assert_error(&post(a, c, &json!({"prompt": ""})), 400, Some("prompt"));
    assert_error(&post(a, c, &json!({"prompt": []})), 400, Some("prompt"));
    assert_error(&post(a, c, &json!({"prompt": 12})), 400, Some("prompt"));
    assert_error(&post(a, c, &json!({"max_tokens": 3})), 400, Some("prompt"));
    let v = assert_error(
        &post(a, c, &json!({"prompt": "hi", "max_tokens": 100000})),
        400,
        Some("max_tokens"),
    );
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let long = "hello ".repeat(400);
    let v = assert_error(
        &post(a, c, &json!({"prompt": long, "max_tokens": 1})),
        400,
        Some("prompt"),
    );
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "temperature": -1})),
        400,
        Some("temperature"),
    );
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "top_p": 1.5})),
        400,
        Some("top_p"),
    );
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "n": 17})),
        400,
        Some("n"),
    );
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "n": 0})),
        400,
        Some("n"),
    );
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "max_tokens": 0})),
        400,
        Some("max_tokens"),
    );
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "logprobs": 99})),
        400,
        Some("logprobs"),
    );
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "logit_bias": {"abc": 1}})),
        400,
        Some("logit_bias"),
    );
    assert_error(
        &post(
            a,
            c,
            &json!({"prompt": "hi", "logit_bias": {"99999999": 1}}),
        ),
        400,
        Some("logit_bias"),
    );
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "stop": 5})),
        400,
        Some("stop"),
    );
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "min_p": 2})),
        400,
        Some("min_p"),
    );
    assert_error(
        &post(a, c, &json!({"prompt": "hi", "repetition_penalty": 0})),
        400,
        Some("repetition_penalty"),
    );
    let ch = "/v1/chat/completions";
    assert_error(
        &post(a, ch, &json!({"messages": []})),
        400,
        Some("messages"),
    );
    assert_error(
        &post(a, ch, &json!({"messages": "hi"})),
        400,
        Some("messages"),
    );
    assert_error(
        &post(
            a,
            ch,
            &json!({"messages": [{"role": "wizard", "content": "x"}]}),
        ),
        400,
        None,
    );
    assert_error(
        &post(
            a,
            ch,
            &json!({"messages": [{"role": "user", "content": "x"}], "logprobs": 3}),
        ),
        400,
        Some("logprobs"),
    );
    // Oversized body: 413.
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(2 << 20));
    assert_error(&request(a, "POST", c, &[], big.as_bytes()), 413, None);
    // Wrong method.
    assert_eq!(get(a, c).status, 405);
    // Extensions are accepted.
    let r = post(
        a,
        c,
        &json!({"prompt": "hi", "max_tokens": 2, "top_k": 5, "min_p": 0.1,
        "typical_p": 0.9, "repetition_penalty": 1.1, "no_repeat_ngram": 3, "presence_penalty": 0.5,
        "frequency_penalty": 0.5, "logit_bias": {"5": -100}, "seed": 1, "unknown_field": [1]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(a, "/health").status, 200);
    let m = get(a, "/metrics").text();
    assert!(
        m.contains("nucleus_http_requests_total{outcome=\"client_error\"} "),
        "{m}"
    );
}

#[test]
fn api_key_is_required_when_set() {
    let Some(srv) = start(small(), Some("s3cret")) else {
        return;
    };
    let body = json!({"prompt": "hi", "max_tokens": 1}).to_string();
    let r = request(srv.addr, "POST", "/v1/completions", &[], body.as_bytes());
    assert_error(&r, 401, None);
    let r = request(
        srv.addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer wrong!")],
        body.as_bytes(),
    );
    assert_error(&r, 401, None);
    let r = request(
        srv.addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer s3cret")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(
        srv.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer s3cret")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(get(srv.addr, "/health").status, 200);
}

#[test]
fn queue_full_is_429_and_everything_accepted_completes() {
    let cfg = EngineConfig {
        max_running: 1,
        queue_capacity: 2,
        n_ctx: 1024,
        ..small()
    };
    let Some(srv) = start(cfg, None) else { return };
    let addr = srv.addr;
    let handles: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(move || {
                post(
                    addr,
                    "/v1/completions",
                    &json!({"prompt": "Tell me a story", "max_tokens": 400, "ignore_eos": true}),
                )
            })
        })
        .collect();
    let resps: Vec<Resp> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = resps.iter().filter(|r| r.status == 200).count();
    let full: Vec<&Resp> = resps.iter().filter(|r| r.status == 429).collect();
    assert_eq!(ok + full.len(), 6, "{resps:?}");
    assert!(!full.is_empty() && ok >= 2, "ok {ok}, 429 {}", full.len());
    let v = assert_error(full[0], 429, None);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("queue is full"));
    assert_eq!(v["error"]["code"], "queue_full");
    for r in resps.iter().filter(|r| r.status == 200) {
        assert_eq!(r.json()["usage"]["completion_tokens"], 400);
    }
}

#[test]
fn a_disconnected_stream_is_cancelled_and_frees_its_blocks() {
    let cfg = EngineConfig {
        n_ctx: 2048,
        ..small()
    };
    let Some(srv) = start(cfg, None) else { return };
    let body =
        json!({"prompt": "Count forever", "max_tokens": 2000, "ignore_eos": true, "stream": true})
            .to_string();
    let mut s = TcpStream::connect(srv.addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read until the first token arrived, then hang up.
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&got).contains("data: ") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    drop(s);
    let t0 = Instant::now();
    loop {
        let st = srv.engine.stats();
        if st.running == 0 && st.kv_used_blocks == 0 {
            assert_eq!(st.requests_cancelled, 1, "{st:?}");
            assert!(st.generation_tokens_total < 2000, "{st:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "not cancelled: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn graceful_shutdown_finishes_in_flight_requests() {
    let Some(mut srv) = start(small(), None) else {
        return;
    };
    let addr = srv.addr;
    let h = std::thread::spawn(move || {
        post(
            addr,
            "/v1/completions",
            &json!({"prompt": "Hello", "max_tokens": 40, "ignore_eos": true}),
        )
    });
    // Wait until it runs, then ask the server to stop.
    let t0 = Instant::now();
    while srv.engine.stats().running == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = srv.stop.take().unwrap().send(());
    let r = h.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 40);
    srv.thread.take().unwrap().join().unwrap();
    assert!(srv.engine.is_shut_down());
    assert!(TcpStream::connect(addr).is_err() || get_fails(addr));
}

fn get_fails(addr: SocketAddr) -> bool {
    let mut s = match TcpStream::connect(addr) {
        Ok(s) => s,
        Err(_) => return true,
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = write!(s, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = [0u8; 64];
    !matches!(s.read(&mut buf), Ok(n) if n > 0)
}
