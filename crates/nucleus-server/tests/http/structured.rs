//! Structured output over HTTP on the tiny random model (whose free output is gibberish, so a
//! valid answer is the grammar's doing): `response_format` json_schema / json_object,
//! `grammar` (Lark), `guided_regex`, `guided_json`, streamed and not, `finish_reason: length`
//! when `max_tokens` ends it early, and a 400 naming the field for every bad value. Tool-call
//! fields' bad values are here too (the tiny model's template renders no tools).

use serde_json::{json, Value};

use crate::common::*;

const CHAT: &str = "/v1/chat/completions";
const CMPL: &str = "/v1/completions";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "level": {"enum": ["low", "high"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}
        },
        "required": ["ok", "level", "n"],
        "additionalProperties": false
    })
}

fn check(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(v["ok"].is_boolean(), "{text}");
    assert!(
        ["low", "high"].contains(&v["level"].as_str().unwrap()),
        "{text}"
    );
    assert!((0..=9).contains(&v["n"].as_i64().unwrap()), "{text}");
    let o = v.as_object().unwrap();
    assert!(o
        .keys()
        .all(|k| ["ok", "level", "n", "tags"].contains(&k.as_str())));
    if let Some(t) = o.get("tags") {
        let t = t.as_array().unwrap();
        assert!(
            t.len() <= 2 && t.iter().all(|x| x == "a" || x == "b"),
            "{text}"
        );
    }
}

fn ask(extra: Value) -> Value {
    let mut req = json!({
        "messages": [{"role": "user", "content": "Describe the state as JSON."}],
        "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0, "max_tokens": 120,
    });
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    req
}

#[test]
fn json_schema_every_seed_and_n() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let rf = json!({"type": "json_schema", "json_schema": {"name": "state", "schema": schema(), "strict": true}});
    for seed in 0..12 {
        let r = post(
            srv.addr,
            CHAT,
            &ask(json!({"response_format": rf, "seed": seed, "n": 2})),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        for c in v["choices"].as_array().unwrap() {
            assert_eq!(c["finish_reason"], "stop", "{v}");
            check(c["message"]["content"].as_str().unwrap());
        }
    }
    // Streamed: the deltas make the same JSON as the whole answer.
    let req = ask(json!({"response_format": rf, "seed": 3, "logprobs": true}));
    let whole = post(srv.addr, CHAT, &req).json();
    let mut s = req.clone();
    s["stream"] = json!(true);
    let events = sse_events(&post(srv.addr, CHAT, &s));
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    check(&text);
    // Logprobs come with every token.
    assert!(!whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn json_object_regex_lark_and_length() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    // max_tokens ends the JSON early: length, and a beginning of an object.
    let r = post(
        a,
        CHAT,
        &ask(json!({"response_format": {"type": "json_object"}, "max_tokens": 3, "seed": 1})),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with('{'));
    // The completions endpoint takes them too.
    for seed in 0..6 {
        let r = post(
            a,
            CMPL,
            &json!({"prompt": "Date:", "guided_regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}", "seed": seed, "temperature": 1, "max_tokens": 20}),
        );
        let v = r.json();
        let t = v["choices"][0]["text"].as_str().unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert!(t.len() == 10 && &t[4..5] == "-" && &t[7..8] == "-", "{t}");
        let lark =
            "start: greeting \" \" name\ngreeting: \"hello\" | \"hi\"\nname: /[A-Z][a-z]{1,8}/";
        let r = post(
            a,
            CMPL,
            &json!({"prompt": "Say hi:", "grammar": lark, "seed": seed, "temperature": 1, "max_tokens": 20}),
        );
        let v = r.json();
        let t = v["choices"][0]["text"].as_str().unwrap();
        let (g, name) = t.split_once(' ').unwrap_or_else(|| panic!("{t}"));
        assert!(g == "hello" || g == "hi", "{t}");
        assert!(
            name.chars().next().unwrap().is_ascii_uppercase() && name.len() <= 9,
            "{t}"
        );
        let r = post(
            a,
            CMPL,
            &json!({"prompt": "x", "guided_json": schema().to_string(), "seed": seed, "temperature": 1, "max_tokens": 120}),
        );
        check(r.json()["choices"][0]["text"].as_str().unwrap());
    }
}

#[test]
fn bad_values_name_the_field() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    let bad = |extra: Value, param: &str| {
        let r = post(a, CHAT, &ask(extra.clone()));
        let v = assert_error(&r, 400, Some(param));
        assert_eq!(v["error"]["type"], "invalid_request_error", "{extra}");
        v
    };
    // Schemas llguidance cannot compile: the message says why.
    let v = bad(
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}}),
        "response_format",
    );
    assert_eq!(v["error"]["code"], "invalid_grammar");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("frobnicate"),
        "{v}"
    );
    bad(
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nope"}}}}),
        "response_format",
    );
    bad(
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}}),
        "response_format",
    );
    bad(
        json!({"response_format": {"type": "yaml"}}),
        "response_format",
    );
    bad(json!({"grammar": "start: missing_rule"}), "grammar");
    bad(json!({"guided_regex": "(("}), "guided_regex");
    bad(json!({"guided_json": "{not json"}), "guided_json");
    bad(json!({"json_schema": 5}), "json_schema");
    bad(
        json!({"response_format": {"type": "json_object"}, "grammar": "start: \"a\""}),
        "grammar",
    );
    bad(
        json!({"response_format": {"type": "json_object"}, "ignore_eos": true}),
        "ignore_eos",
    );
    bad(
        json!({"response_format": {"type": "json_object"}, "use_beam_search": true, "temperature": 0, "top_p": 1, "top_k": 0, "min_p": 0}),
        "response_format",
    );
    // Tools.
    let f =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    bad(
        json!({"tools": [{"type": "code_interpreter"}]}),
        "tools[0].type",
    );
    bad(
        json!({"tools": [{"type": "function", "function": {"name": ""}}]}),
        "tools[0].function.name",
    );
    bad(
        json!({"tools": f, "tool_choice": {"type": "function", "function": {"name": "g"}}}),
        "tool_choice",
    );
    bad(json!({"tools": f, "tool_choice": "maybe"}), "tool_choice");
    bad(json!({"tool_choice": "required"}), "tool_choice");
    bad(
        json!({"tools": f, "parallel_tool_calls": 1}),
        "parallel_tool_calls",
    );
    bad(
        json!({"tools": f, "response_format": {"type": "json_object"}}),
        "response_format",
    );
    // This template does not render tools: refused rather than ignored.
    bad(json!({"tools": f}), "tools");
    // A tool message must say which call it answers; tool_calls belong to the assistant.
    bad(
        json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "1"}]}),
        "messages[1].tool_call_id",
    );
    bad(
        json!({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
        "messages[0].tool_calls",
    );
    bad(
        json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "a"}]}]}),
        "messages[0].tool_calls[0]",
    );
    let r = post(a, CMPL, &json!({"prompt": "x", "tools": f}));
    assert_error(&r, 400, Some("tools"));
    // tool_choice none with tools: plain text, the tools unused.
    let r = post(
        a,
        CHAT,
        &ask(json!({"tools": f, "tool_choice": "none", "max_tokens": 3})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}
