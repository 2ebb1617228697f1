//! Request fields clients send: `max_completion_tokens`, `stream_options.include_usage`, `user`,
//! `metadata`; fields that change the output and are not supported are named in a 400.

use serde_json::json;

use crate::common::*;

const CHAT: &str = "/v1/chat/completions";

fn hi() -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "ignore_eos": true})
}

#[test]
fn max_completion_tokens_is_max_tokens() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    let mut req = hi();
    req["max_completion_tokens"] = json!(5);
    let r = post(a, CHAT, &req);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    req["max_tokens"] = json!(5);
    assert_eq!(post(a, CHAT, &req).status, 200);
    req["max_tokens"] = json!(6);
    assert_error(&post(a, CHAT, &req), 400, Some("max_completion_tokens"));
    let mut req = hi();
    req["max_completion_tokens"] = json!(0);
    assert_error(&post(a, CHAT, &req), 400, Some("max_completion_tokens"));
    req["max_completion_tokens"] = json!("many");
    assert_error(&post(a, CHAT, &req), 400, Some("max_completion_tokens"));
}

#[test]
fn include_usage_ends_the_stream_with_usage_and_no_choices() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    let mut req = hi();
    req["max_tokens"] = json!(4);
    req["n"] = json!(2);
    req["stream"] = json!(true);
    let events = sse_events(&post(a, CHAT, &req));
    assert!(
        events.iter().all(|e| e.get("usage").is_none()),
        "{events:?}"
    );

    req["stream_options"] = json!({"include_usage": true});
    let events = sse_events(&post(a, CHAT, &req));
    let (last, rest) = events.split_last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 8, "both choices");
    let p = last["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(p > 0);
    assert_eq!(last["usage"]["total_tokens"].as_u64(), Some(p + 8));
    for e in rest {
        assert!(e["usage"].is_null() && e.get("usage").is_some(), "{e}");
        assert_eq!(e["choices"].as_array().unwrap().len(), 1, "{e}");
    }

    req["stream_options"] = json!({"include_usage": false});
    let events = sse_events(&post(a, CHAT, &req));
    assert!(events.iter().all(|e| e.get("usage").is_none()));

    // Not streaming: stream_options is a mistake.
    let mut req = hi();
    req["stream_options"] = json!({"include_usage": true});
    assert_error(&post(a, CHAT, &req), 400, Some("stream_options"));
    let mut req = hi();
    req["stream"] = json!(true);
    req["stream_options"] = json!({"include_usage": "yes"});
    assert_error(&post(a, CHAT, &req), 400, Some("stream_options"));
}

#[test]
fn user_and_metadata_are_accepted() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    let mut req = hi();
    req["max_tokens"] = json!(3);
    let base = post(a, CHAT, &req).json()["choices"][0]["message"]["content"].clone();
    req["user"] = json!("user-1234");
    req["metadata"] = json!({"session": "abc", "team": "x"});
    req["store"] = json!(false);
    let r = post(a, CHAT, &req);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], base);
    for bad in [json!({"n": 3}), json!("x"), json!([1])] {
        req["metadata"] = bad;
        assert_error(&post(a, CHAT, &req), 400, Some("metadata"));
    }
    req["metadata"] = json!(null);
    req["user"] = json!(12);
    assert_error(&post(a, CHAT, &req), 400, Some("user"));
}

#[test]
fn unsupported_fields_that_change_the_output_are_named() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    for (field, value) in [
        ("functions", json!([{"name": "f"}])),
        ("function_call", json!({"name": "f"})),
        ("guided_choice", json!(["a", "b"])),
        ("structured_outputs", json!({"regex": "a"})),
        ("tfs_z", json!(0.9)),
        ("stop_token_ids", json!([5])),
    ] {
        let mut req = hi();
        req[field] = value;
        let v = assert_error(&post(a, CHAT, &req), 400, Some(field));
        assert_eq!(v["error"]["code"], "unsupported_parameter");
    }
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hi", "suffix": "end"}),
    );
    assert_error(&r, 400, Some("suffix"));
    let r = post(a, "/v1/completions", &json!({"prompt": "hi", "echo": true}));
    let v = assert_error(&r, 400, Some("echo"));
    assert_eq!(v["error"]["code"], "unsupported_parameter");
    // Their neutral values change nothing and pass.
    let mut req = hi();
    req["max_tokens"] = json!(2);
    req["functions"] = json!([]);
    req["function_call"] = json!("none");
    req["tools"] = json!([]);
    req["tool_choice"] = json!("none");
    req["grammar"] = json!("");
    req["response_format"] = json!({"type": "text"});
    let r = post(a, CHAT, &req);
    assert_eq!(r.status, 200, "{}", r.text());
}
