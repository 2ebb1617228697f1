//! Reasoning output, Anthropic's `/v1/messages` and OpenAI's `/v1/responses` on the tiny
//! random model. Its free output is gibberish, so a scripted answer comes from a grammar that
//! admits only that text; and with DeepSeek-R1's template (whose prompt opens `<think>`) all of
//! its gibberish is reasoning, which is how the thinking blocks and reasoning items are tested.

use nucleus::chat::ChatTemplate;
use nucleus::engine::scheduler::EngineConfig;
use serde_json::{json, Value};

use crate::common::*;

const QWEN3: &str = include_str!("../../../nucleus/tests/data/qwen3_template.jinja");
const R1: &str = include_str!("../../../nucleus/tests/data/deepseek_r1_template.jinja");

fn cfg() -> EngineConfig {
    EngineConfig {
        n_ctx: 1024,
        kv_tokens: 8192,
        ..Default::default()
    }
}

fn with_template(src: &'static str, key: Option<&str>) -> Option<Server> {
    start_with(cfg(), key, move |st| {
        st.template = Some(ChatTemplate::new(src, "<s>", "</s>").unwrap());
    })
}

/// A Lark grammar admitting exactly `text`.
fn exactly(text: &str) -> String {
    format!("start: {}", serde_json::to_string(text).unwrap())
}

/// The events of a named-event SSE body (`event: x` / `data: {...}`), each checked to name
/// its own `type`.
fn named_events(r: &Resp) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let text = r.text();
    assert!(!text.contains("[DONE]"), "{text}");
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (ev, data) = e.split_once('\n').unwrap_or_else(|| panic!("{e:?}"));
            let kind = ev
                .strip_prefix("event: ")
                .unwrap_or_else(|| panic!("{e:?}"));
            let v: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(v["type"], kind, "{e}");
            v
        })
        .collect()
}

const SCRIPT: &str = "<think>\nThe user says hi.\n</think>\n\nHello!";

#[test]
fn reasoning_content_whole_streamed_and_raw() {
    let Some(srv) = with_template(QWEN3, None) else {
        return;
    };
    let a = srv.addr;
    let ask = |extra: Value| {
        let mut req = json!({"messages": [{"role": "user", "content": "hi"}],
            "grammar": exactly(SCRIPT), "max_tokens": 200});
        for (k, v) in extra.as_object().unwrap() {
            req[k] = v.clone();
        }
        req
    };
    let v = post(a, "/v1/chat/completions", &ask(json!({}))).json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "The user says hi.", "{v}");
    assert_eq!(m["content"], "Hello!", "{v}");
    // Streamed: the deltas add up to the same.
    let r = post(a, "/v1/chat/completions", &ask(json!({"stream": true})));
    let (mut reasoning, mut content) = (String::new(), String::new());
    for e in sse_events(&r) {
        let d = &e["choices"][0]["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(d["content"].as_str().unwrap_or(""));
    }
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        ("The user says hi.", "Hello!")
    );
    // `reasoning_format: none` keeps the raw text.
    let v = post(
        a,
        "/v1/chat/completions",
        &ask(json!({"reasoning_format": "none"})),
    )
    .json();
    assert_eq!(v["choices"][0]["message"]["content"], SCRIPT, "{v}");
    assert!(v["choices"][0]["message"]
        .get("reasoning_content")
        .is_none());
    let r = post(
        a,
        "/v1/chat/completions",
        &ask(json!({"reasoning_format": "bogus"})),
    );
    assert_error(&r, 400, Some("reasoning_format"));
}

#[test]
fn reasoning_effort_and_template_kwargs_reach_the_template() {
    let Some(srv) = with_template(QWEN3, None) else {
        return;
    };
    let a = srv.addr;
    let prompt_tokens = |extra: Value| {
        let mut req = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
        for (k, v) in extra.as_object().unwrap() {
            req[k] = v.clone();
        }
        let v = post(a, "/v1/chat/completions", &req).json();
        v["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("{v}"))
    };
    let on = prompt_tokens(json!({}));
    // Qwen3's template closes an empty thinking block when thinking is off.
    let off = prompt_tokens(json!({"chat_template_kwargs": {"enable_thinking": false}}));
    assert!(off > on, "{off} <= {on}");
    assert_eq!(prompt_tokens(json!({"reasoning_effort": "none"})), off);
    assert_eq!(prompt_tokens(json!({"reasoning_effort": "high"})), on);
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "extreme"}),
    );
    assert_error(&r, 400, Some("reasoning_effort"));
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "hi", "reasoning_effort": "low"}),
    );
    assert_error(&r, 400, Some("reasoning_effort"));
}

#[test]
fn a_model_without_reasoning_refuses_reasoning_effort() {
    // The harness's ChatML template has no thinking mode.
    let Some(srv) = start_with(cfg(), None, |_| {}) else {
        return;
    };
    let r = post(
        srv.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"}),
    );
    let v = assert_error(&r, 400, Some("reasoning_effort"));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no reasoning mode"),
        "{v}"
    );
    let r = post(
        srv.addr,
        "/v1/messages",
        &json!({"max_tokens": 4, "thinking": {"type": "enabled", "budget_tokens": 100}, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("thinking"));
}

fn anthropic_error(r: &Resp, status: u16, kind: &str, names: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(names),
        "{v}"
    );
}

#[test]
fn messages_whole_streamed_with_thinking_and_errors() {
    let Some(srv) = with_template(R1, Some("sekret")) else {
        return;
    };
    let a = srv.addr;
    let body = json!({"model": "tiny", "max_tokens": 12, "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
                     {"role": "user", "content": [{"type": "text", "text": "Again"}]}],
        "temperature": 0.0, "top_k": 5, "metadata": {"user_id": "u1"}});
    let key = [("x-api-key", "sekret")];
    let send = |b: &Value| request(a, "POST", "/v1/messages", &key, b.to_string().as_bytes());
    let v = send(&body).json();
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["role"], "assistant");
    // R1's prompt opened the thinking block and the gibberish never closed it.
    assert_eq!(v["content"][0]["type"], "thinking", "{v}");
    assert!(!v["content"][0]["thinking"].as_str().unwrap().is_empty());
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 12);
    let n = v["usage"]["input_tokens"].as_u64().unwrap();
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let events = named_events(&send(&stream_body));
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..3],
        ["message_start", "ping", "content_block_start"],
        "{kinds:?}"
    );
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert_eq!(events[0]["message"]["usage"]["input_tokens"], n);
    assert_eq!(events[2]["content_block"]["type"], "thinking");
    let thinking: String = events
        .iter()
        .filter(|e| e["type"] == "content_block_delta")
        .map(|e| e["delta"]["thinking"].as_str().unwrap().to_string())
        .collect();
    // temperature 0: the same as the whole answer.
    assert_eq!(thinking, v["content"][0]["thinking"].as_str().unwrap());
    let end = &events[kinds.len() - 2];
    assert_eq!(end["delta"]["stop_reason"], "max_tokens");
    assert_eq!(end["usage"]["output_tokens"], 12);
    // count_tokens counts the same prompt.
    let mut count = body.clone();
    count.as_object_mut().unwrap().remove("max_tokens");
    let c = request(
        a,
        "POST",
        "/v1/messages/count_tokens",
        &key,
        count.to_string().as_bytes(),
    );
    assert_eq!(c.json()["input_tokens"], n, "{}", c.text());
    // Errors in Anthropic's shape.
    let r = request(a, "POST", "/v1/messages", &[], body.to_string().as_bytes());
    anthropic_error(&r, 401, "authentication_error", "API key");
    let r = request(
        a,
        "POST",
        "/v1/messages",
        &[("Authorization", "Bearer sekret")],
        body.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut b = body.clone();
    b.as_object_mut().unwrap().remove("max_tokens");
    anthropic_error(&send(&b), 400, "invalid_request_error", "max_tokens");
    let mut b = body.clone();
    b["top_a"] = json!(1);
    anthropic_error(&send(&b), 400, "invalid_request_error", "top_a");
    let mut b = body.clone();
    b["messages"][0]["content"] = json!([{"type": "image", "source": {}}]);
    anthropic_error(
        &send(&b),
        400,
        "invalid_request_error",
        "messages[0].content[0].type",
    );
    let mut b = body.clone();
    b["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}]);
    anthropic_error(&send(&b), 400, "invalid_request_error", "tools[0].type");
    let mut b = body.clone();
    b["tool_choice"] = json!({"type": "sometimes"});
    anthropic_error(&send(&b), 400, "invalid_request_error", "tool_choice");
    anthropic_error(
        &request(a, "POST", "/v1/messages", &key, b"{"),
        400,
        "invalid_request_error",
        "JSON",
    );
}

#[test]
fn messages_stop_sequence_is_named() {
    let Some(srv) = start_with(cfg(), None, |_| {}) else {
        return;
    };
    // Find what the tiny model writes, then stop on a piece of it.
    let body = json!({"max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]});
    let v = post(srv.addr, "/v1/messages", &body).json();
    let text = v["content"][0]["text"].as_str().unwrap().to_string();
    let cut = text
        .char_indices()
        .map(|(i, _)| i)
        .nth(text.chars().count() / 2)
        .unwrap();
    let stop: String = text[cut..].chars().take(2).collect();
    let mut b = body.clone();
    b["stop_sequences"] = json!(["\u{1}never", stop]);
    let v = post(srv.addr, "/v1/messages", &b).json();
    assert_eq!(
        v["stop_reason"], "stop_sequence",
        "{v} (stop {stop:?} in {text:?})"
    );
    assert_eq!(v["stop_sequence"], stop);
    assert!(text.starts_with(v["content"][0]["text"].as_str().unwrap()));
}

#[test]
fn responses_whole_streamed_reasoning_and_the_store() {
    let Some(srv) = with_template(R1, None) else {
        return;
    };
    let a = srv.addr;
    let body = json!({"model": "tiny", "instructions": "Be brief.", "input": "hi", "max_output_tokens": 10, "temperature": 0});
    let v = post(a, "/v1/responses", &body).json();
    assert_eq!(v["object"], "response", "{v}");
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["output"][0]["type"], "reasoning", "{v}");
    let reasoning = v["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!reasoning.is_empty());
    assert_eq!(v["usage"]["output_tokens"], 10);
    let mut s = body.clone();
    s["stream"] = json!(true);
    let events = named_events(&post(a, "/v1/responses", &s));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64, "{e}");
    }
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..3],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added"
        ]
    );
    assert_eq!(kinds.last(), Some(&"response.incomplete"));
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas, reasoning);
    // A stored response continues; an unknown one is a 400 naming the field.
    let id = v["id"].as_str().unwrap();
    let next = post(
        a,
        "/v1/responses",
        &json!({"input": "more", "previous_response_id": id, "max_output_tokens": 2}),
    )
    .json();
    assert!(
        next["usage"]["input_tokens"].as_u64().unwrap()
            > v["usage"]["input_tokens"].as_u64().unwrap(),
        "{next}"
    );
    let r = post(
        a,
        "/v1/responses",
        &json!({"input": "x", "previous_response_id": "resp-nope"}),
    );
    assert_error(&r, 400, Some("previous_response_id"));
    let r = post(
        a,
        "/v1/responses",
        &json!({"input": "x", "store": false, "max_output_tokens": 1}),
    );
    let unstored = r.json()["id"].as_str().unwrap().to_string();
    let r = post(
        a,
        "/v1/responses",
        &json!({"input": "x", "previous_response_id": unstored}),
    );
    assert_error(&r, 400, Some("previous_response_id"));
    // Bad input names the field.
    for (b, field) in [
        (json!({"input": "x", "background": true}), "background"),
        (json!({}), "input"),
        (
            json!({"input": [{"type": "item_reference", "id": "x"}]}),
            "input[0].type",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0]",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "yaml"}}}),
            "text.format",
        ),
        (
            json!({"input": "x", "reasoning": {"effort": "enormous"}}),
            "reasoning.effort",
        ),
        (json!({"input": "x", "truncation": "auto"}), "truncation"),
    ] {
        assert_error(&post(a, "/v1/responses", &b), 400, Some(field));
    }
}
