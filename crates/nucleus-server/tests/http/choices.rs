//! How the choices are made: `best_of` (sample more, return the `n` with the highest mean
//! logprob per token) and beam search over HTTP (`use_beam_search`, `length_penalty`).

use serde_json::{json, Value};

use crate::common::*;

const CHAT: &str = "/v1/chat/completions";

fn hi(max_tokens: usize) -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
           "ignore_eos": true})
}

fn texts(v: &Value) -> Vec<String> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn best_of_returns_the_n_most_likely_of_its_samples() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    // The same four samples (choice i draws from stream i of the seed), with their logprobs.
    let mut req = hi(6);
    req["temperature"] = json!(1.0);
    req["top_k"] = json!(0);
    req["top_p"] = json!(1.0);
    req["min_p"] = json!(0.0);
    req["seed"] = json!(7);
    req["n"] = json!(4);
    req["logprobs"] = json!(true);
    let all = post(a, CHAT, &req).json();
    let mut ranked: Vec<(f64, String)> = all["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let lps = c["logprobs"]["content"].as_array().unwrap();
            let sum: f64 = lps.iter().map(|l| l["logprob"].as_f64().unwrap()).sum();
            (
                sum / lps.len() as f64,
                c["message"]["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0));

    req["n"] = json!(2);
    req["best_of"] = json!(4);
    req["logprobs"] = json!(false);
    let r = post(a, CHAT, &req);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let want: Vec<String> = ranked[..2].iter().map(|x| x.1.clone()).collect();
    assert_eq!(texts(&v), want);
    for (i, c) in v["choices"].as_array().unwrap().iter().enumerate() {
        assert_eq!(c["index"], i);
        assert!(c["logprobs"].is_null(), "not asked for: {c}");
    }
    // Usage counts every sample.
    assert_eq!(v["usage"]["completion_tokens"], 24);

    // best_of = n is plain n, and may stream.
    req["best_of"] = json!(2);
    req["stream"] = json!(true);
    assert_eq!(post(a, CHAT, &req).status, 200);
}

#[test]
fn best_of_bad_values_are_named() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    for (n, best_of) in [
        (json!(1), json!(0)),
        (json!(3), json!(2)),
        (json!(1), json!(17)),
        (json!(1), json!("two")),
        (json!(1), json!(1.5)),
    ] {
        let mut req = hi(2);
        req["n"] = n;
        req["best_of"] = best_of;
        assert_error(&post(a, CHAT, &req), 400, Some("best_of"));
    }
    // The best are known only at the end: no streaming.
    let mut req = hi(2);
    req["best_of"] = json!(3);
    req["stream"] = json!(true);
    assert_error(&post(a, CHAT, &req), 400, Some("best_of"));
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hi", "best_of": 3, "n": 4}),
    );
    assert_error(&r, 400, Some("best_of"));
}

#[test]
fn beam_search_returns_n_beams_best_first() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    // One beam is greedy decoding.
    let mut greedy = hi(8);
    greedy["temperature"] = json!(0);
    let g = post(a, CHAT, &greedy).json();
    let mut req = hi(8);
    req["use_beam_search"] = json!(true);
    let r = post(a, CHAT, &req);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(texts(&r.json()), texts(&g));

    // Three beams, two returned; deterministic.
    req["n"] = json!(2);
    req["best_of"] = json!(3);
    req["length_penalty"] = json!(0.5);
    let v = post(a, CHAT, &req).json();
    let t = texts(&v);
    assert_eq!(t.len(), 2);
    assert_ne!(t[0], t[1]);
    assert_eq!(v["usage"]["completion_tokens"], 16);
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(texts(&post(a, CHAT, &req).json()), t);

    // Streamed: the same choices, in chunks once the search ends.
    req["stream"] = json!(true);
    let events = sse_events(&post(a, CHAT, &req));
    let mut streamed = vec![String::new(); 2];
    let mut finished = 0;
    for e in &events {
        let c = &e["choices"][0];
        let i = c["index"].as_u64().unwrap() as usize;
        if let Some(s) = c["delta"]["content"].as_str() {
            streamed[i].push_str(s);
        }
        finished += c["finish_reason"].is_string() as usize;
    }
    assert_eq!(streamed, t);
    assert_eq!(finished, 2);

    // The legacy endpoint too; a stop string cuts the best beam's text.
    let body =
        json!({"prompt": "hi", "max_tokens": 8, "ignore_eos": true, "use_beam_search": true});
    let v = post(a, "/v1/completions", &body).json();
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    let stop: String = text.chars().skip(2).take(2).collect();
    let mut body = body;
    body["stop"] = json!([stop]);
    let v = post(a, "/v1/completions", &body).json();
    let cut = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(cut, &text[..text.find(&stop).unwrap()]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[test]
fn beam_search_refuses_what_it_would_ignore() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    for (field, value) in [
        ("temperature", json!(0.7)),
        ("top_p", json!(0.5)),
        ("top_k", json!(5)),
        ("min_p", json!(0.1)),
        ("presence_penalty", json!(0.5)),
        ("repetition_penalty", json!(1.2)),
        ("logit_bias", json!({"5": 3})),
        ("logprobs", json!(true)),
        ("explain", json!(true)),
        ("context_policy", json!("stream")),
    ] {
        let mut req = hi(4);
        req["use_beam_search"] = json!(true);
        req[field] = value;
        assert_error(&post(a, CHAT, &req), 400, Some(field));
    }
    // Neutral values pass.
    let mut req = hi(2);
    req["use_beam_search"] = json!(true);
    req["temperature"] = json!(0);
    req["top_p"] = json!(1);
    req["logprobs"] = json!(false);
    req["seed"] = json!(3);
    assert_eq!(post(a, CHAT, &req).status, 200);

    let mut req = hi(4);
    req["use_beam_search"] = json!("yes");
    assert_error(&post(a, CHAT, &req), 400, Some("use_beam_search"));
    for bad in [json!("x"), json!(1e9)] {
        let mut req = hi(4);
        req["use_beam_search"] = json!(true);
        req["length_penalty"] = bad;
        assert_error(&post(a, CHAT, &req), 400, Some("length_penalty"));
    }
    // length_penalty means nothing without beams.
    let mut req = hi(4);
    req["length_penalty"] = json!(2.0);
    assert_error(&post(a, CHAT, &req), 400, Some("length_penalty"));
    // n beams returned of at least n.
    let mut req = hi(4);
    req["use_beam_search"] = json!(true);
    req["n"] = json!(3);
    req["best_of"] = json!(2);
    assert_error(&post(a, CHAT, &req), 400, Some("best_of"));
    // 16 beams of 220 tokens need more KV cache than the server has (4,096 tokens).
    let mut req = hi(220);
    req["use_beam_search"] = json!(true);
    req["best_of"] = json!(16);
    let v = assert_error(&post(a, CHAT, &req), 400, Some("max_tokens"));
    assert!(v["error"]["message"].as_str().unwrap().contains("KV cache"));
}
