//! `/infill` with the request editor plugins send: llama.vim's body, field for field as
//! `autoload/llama.vim` (ggml-org/llama.vim at a1c8e6e, `s:fim`) builds it, and what each of
//! its fields does (`n_indent`, `t_max_predict_ms`, `samplers`, `response_fields`,
//! `cache_prompt`, `t_max_prompt_ms`), with llama-server's meanings, and llama.cpp's `infill`
//! sampler that its `samplers` list names.

use crate::common::{post, start_catalog, Server};
use nucleus::engine::scheduler::EngineConfig;
use serde_json::{json, Value};

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

/// The catalog qwen (skipped outside CI when absent: `start_catalog`).
fn qwen_server() -> Option<Server> {
    let cfg = EngineConfig {
        n_ctx: 4096,
        kv_tokens: 8192,
        ..Default::default()
    };
    start_catalog(QWEN, cfg)
}

/// The cursor is inside `fibonacci`'s body, at the start of an indented line.
const PREFIX: &str =
    "import sys\n\n\ndef fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
const MIDDLE: &str = "    ";
const SUFFIX: &str = "\n\ndef main():\n    print(fibonacci(int(sys.argv[1])))\n";

/// llama.vim's FIM request (`s:fim`), with its default configuration: `n_predict` 128,
/// `stop_strings` [], `t_max_prompt_ms` 500, `t_max_predict_ms` 250 (its first request; 1000
/// after), and `n_indent` the indentation of the cursor's line.
fn llama_vim_body() -> Value {
    json!({
        "id_slot": 0,
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [{"text": "def lucas(n):\n    return 2 if n == 0 else 1\n", "time": 1732000000, "filename": "seq.py"}],
        "prompt": MIDDLE,
        "n_predict": 128,
        "stop": [],
        "n_indent": 4,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": false,
        "cache_prompt": true,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 250,
        "response_fields": [
            "content",
            "timings/prompt_n",
            "timings/prompt_ms",
            "timings/prompt_per_token_ms",
            "timings/prompt_per_second",
            "timings/predicted_n",
            "timings/predicted_ms",
            "timings/predicted_per_token_ms",
            "timings/predicted_per_second",
            "truncated",
            "tokens_cached",
        ],
    })
}

#[test]
fn llama_vim_request() {
    let Some(s) = qwen_server() else { return };
    // As sent, with a seed for a reproducible answer.
    let mut body = llama_vim_body();
    body["seed"] = json!(7);
    let r = post(s.addr, "/infill", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    // `response_fields`: only those, each under its path; the ones an early stop cannot know
    // (the prompt's cached part) may be absent, the rest must be there.
    let asked: Vec<&str> = body["response_fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    for k in &keys {
        assert!(asked.contains(k), "{k} was not asked for: {v}");
    }
    for k in [
        "content",
        "timings/predicted_n",
        "timings/predicted_ms",
        "truncated",
    ] {
        assert!(v.get(k).is_some(), "{k} missing: {v}");
    }
    let content = v["content"].as_str().unwrap();
    // `n_indent` 4: no line after the first starts its code with less than 4 blanks of
    // indentation (so the completion ends before `def main` or any module-level line).
    for line in content.split('\n').skip(1) {
        let t = line.trim_start_matches([' ', '\t']);
        assert!(
            t.is_empty() || line.len() - t.len() >= 4,
            "line {line:?} of {content:?}"
        );
    }
    // The same answer again (the seed, and the prompt now cached), up to where the 250 ms
    // limit cut each: the limit ends an answer at the first new line after it runs out, so
    // on a slow or busy machine the two may end at different lines of the same text.
    let again = post(s.addr, "/infill", &body).json();
    let again = again["content"].as_str().unwrap();
    assert!(
        again.starts_with(content) || content.starts_with(again),
        "{again:?} / {content:?}"
    );
    // Without the time limit, the same seed gives the same answer every time.
    body["t_max_predict_ms"] = json!(60_000);
    let whole = post(s.addr, "/infill", &body).json();
    let whole_again = post(s.addr, "/infill", &body).json();
    assert_eq!(whole["content"], whole_again["content"]);
    let whole = whole["content"].as_str().unwrap();
    assert!(
        whole.starts_with(content) && whole.starts_with(again),
        "{whole:?} / {content:?} / {again:?}"
    );

    // llama.vim's request that only fills the cache with the project's files (its ring
    // buffer): `n_predict` 0 is refused (the engine has no prompt-only request yet).
    let warm = json!({"id_slot": 0, "input_prefix": "", "input_suffix": "",
        "input_extra": [{"text": "x = 1\n", "time": 0, "filename": "a.py"}], "prompt": "",
        "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": false,
        "cache_prompt": true, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
        "response_fields": [""]});
    let r = post(s.addr, "/infill", &warm);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "n_predict");
}

#[test]
fn the_infill_sampler_keeps_one_choice_when_one_dominates() {
    let Some(s) = qwen_server() else { return };
    // With the infill stage last and no temperature (llama.vim's order), each step keeps the
    // tokens of probability at least 1/(m+1) after merging prefixes: on a prompt whose
    // continuation is certain, the seeded answers agree whatever the seed.
    let body = |seed: u64| {
        json!({"input_prefix": "def add(a, b):\n    return a", "input_suffix": "\n",
               "n_predict": 6, "seed": seed, "samplers": ["top_k", "top_p", "infill"]})
    };
    let a = post(s.addr, "/infill", &body(1)).json();
    let b = post(s.addr, "/infill", &body(2)).json();
    assert_eq!(
        a["generation_settings"]["samplers"],
        json!(["top_k", "top_p", "infill"])
    );
    assert!(a["content"].as_str().unwrap().starts_with(" + b"), "{a}");
    assert_eq!(a["content"], b["content"]);
}

#[test]
fn n_indent_and_time_limit_end_the_answer() {
    let Some(s) = qwen_server() else { return };
    // A greedy answer without limits, then with `n_indent` above the answer's own indentation:
    // it must end at the first new line whose code starts less indented, cut there.
    let base = json!({"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": MIDDLE,
                      "n_predict": 48, "temperature": 0});
    let free = post(s.addr, "/infill", &base).json();
    let text = free["content"].as_str().unwrap().to_string();
    let Some(nl) = text.find('\n') else {
        panic!("the free answer has one line: {text:?}");
    };
    let mut limited = base.clone();
    limited["n_indent"] = json!(64);
    let v = post(s.addr, "/infill", &limited).json();
    let got = v["content"].as_str().unwrap();
    // The cut keeps the new line and the blanks before the first character, as llama-server.
    let after = &text[nl + 1..];
    let blanks = after.len() - after.trim_start_matches([' ', '\t']).len();
    assert!(
        after.len() > blanks,
        "the free answer has no second line: {text:?}"
    );
    assert_eq!(got, &text[..nl + 1 + blanks], "free: {text:?}");
    assert_eq!(v["stop_type"], "limit");
    assert!(v.get("tokens_cached").is_none(), "{v}");

    // `t_max_predict_ms` 1: the first token with a new line ends it (after that token).
    let mut timed = base.clone();
    timed["t_max_predict_ms"] = json!(1);
    let v = post(s.addr, "/infill", &timed).json();
    let got = v["content"].as_str().unwrap();
    assert!(
        got.ends_with('\n') && text.starts_with(got),
        "{got:?} / {text:?}"
    );
    assert_eq!(got.matches('\n').count(), 1, "{got:?}");
    assert_eq!(v["stop_type"], "limit");

    // Streamed: the pieces add up to the same cut answer.
    let mut st = limited.clone();
    st["stream"] = json!(true);
    let events: String = post(s.addr, "/infill", &st)
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let whole = post(s.addr, "/infill", &limited).json();
    assert_eq!(events, whole["content"].as_str().unwrap());
}

#[test]
fn samplers_order_over_http() {
    let Some(s) = qwen_server() else { return };
    let body = |samplers: Value| {
        json!({"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 8, "seed": 3,
               "temperature": 0.7, "samplers": samplers})
    };
    // A letters string and the same names give the same seeded answer.
    let a = post(s.addr, "/infill", &body(json!("kpt"))).json();
    let b = post(
        s.addr,
        "/infill",
        &body(json!(["top_k", "top_p", "temperature"])),
    )
    .json();
    assert_eq!(a["content"], b["content"]);
    assert_eq!(
        a["generation_settings"]["samplers"],
        json!(["top_k", "top_p", "temperature"])
    );
    // llama.cpp's default order when absent.
    let d = post(s.addr, "/infill", &body(Value::Null)).json();
    assert_eq!(
        d["generation_settings"]["samplers"],
        json!([
            "penalties",
            "dry",
            "top_n_sigma",
            "top_k",
            "typ_p",
            "top_p",
            "min_p",
            "xtc",
            "temperature"
        ])
    );
    for bad in [
        json!(["top_k", "topq"]),
        json!("kq"),
        json!(["top_k", "penalties"]),
        json!(5),
    ] {
        let r = post(s.addr, "/infill", &body(bad.clone()));
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], "samplers", "{bad}");
    }
    // Elsewhere too (chat completions).
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "samplers": ["min_p", "temperature"]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}
