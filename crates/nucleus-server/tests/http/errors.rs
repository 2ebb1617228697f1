//! Every error case gets an OpenAI error body and the server stays up; the API key.

use serde_json::json;

use crate::common::*;

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
