//! The routes over loopback: health, models, metrics, completions and chat with usage,
//! logprobs, seeds, `n`, stop strings and the SSE framing.

use serde_json::json;

use crate::common::*;

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
