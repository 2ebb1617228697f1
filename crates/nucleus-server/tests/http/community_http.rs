//! The community samplers and GBNF over HTTP, end to end on the catalog model: a request with
//! llama-server's DRY, XTC, mirostat, top-n-σ and dynamic-temperature fields and a GBNF
//! `grammar` (llama.cpp's example `json.gbnf` and `list.gbnf`, copied from llama.cpp's
//! `grammars/` into `crates/nucleus/tests/data/gbnf`) is answered, its output parses under the
//! grammar (checked by parsers nobody here wrote: serde_json; a line pattern for the list), the
//! same seed gives the same text, and `explain` shows the stages that ran, in order.

use crate::common::{post, start_catalog, Server};
use nucleus::engine::scheduler::EngineConfig;
use serde_json::{json, Value};

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const JSON_GBNF: &str = include_str!("../../../nucleus/tests/data/gbnf/json.gbnf");
const LIST_GBNF: &str = include_str!("../../../nucleus/tests/data/gbnf/list.gbnf");

/// The catalog qwen (skipped outside CI when absent: `start_catalog`).
fn qwen_server() -> Option<Server> {
    let cfg = EngineConfig {
        n_ctx: 2048,
        kv_tokens: 8192,
        ..Default::default()
    };
    start_catalog(QWEN, cfg)
}

fn chat(s: &Server, body: &Value) -> Value {
    let r = post(s.addr, "/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r.json()
}

fn stage_names(choice: &Value) -> Vec<Vec<String>> {
    choice["explain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e["stages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["stage"].as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn community_samplers_with_a_gbnf_grammar() {
    let Some(s) = qwen_server() else { return };
    let body = json!({
        "messages": [{"role": "user", "content":
            "Describe a person as a JSON object with the keys name, age and city."}],
        "max_tokens": 200, "seed": 5, "temperature": 0.8,
        "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2,
        "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n", ":", "\"", "*"],
        "xtc_probability": 0.5, "xtc_threshold": 0.1,
        "top_n_sigma": 2.0, "dynatemp_range": 0.3, "dynatemp_exponent": 1.5,
        "grammar": JSON_GBNF, "explain": true,
    });
    let v = chat(&s, &body);
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "stop", "{v}");
    let text = c["message"]["content"].as_str().unwrap();
    let parsed: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("not JSON under json.gbnf: {e}: {text:?}"));
    assert!(parsed.is_object(), "{text}"); // json.gbnf's root is an object
                                           // The stages that ran, in llama.cpp's order.
    for names in stage_names(c) {
        let want = [
            "input",
            "grammar",
            "dry",
            "penalties",
            "top_n_sigma",
            "top_k",
            "typical_p",
            "top_p",
            "min_p",
        ];
        assert_eq!(&names[..want.len()], want, "{names:?}");
        let rest = &names[want.len()..];
        assert!(
            rest == ["xtc", "dynatemp"] || rest == ["dynatemp"],
            "{names:?}"
        );
    }
    // Seeded: the same text again.
    let again = chat(&s, &body);
    assert_eq!(again["choices"][0]["message"]["content"], text);

    // Mirostat 2 (in place of the truncations) with the list grammar: every line "- word".
    let body = json!({
        "messages": [{"role": "user", "content": "List three fruits."}],
        "max_tokens": 60, "seed": 9, "mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2,
        "grammar": LIST_GBNF, "explain": true,
    });
    let v = chat(&s, &body);
    let c = &v["choices"][0];
    let text = c["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty());
    for line in text.lines() {
        let item = line
            .strip_prefix("- ")
            .unwrap_or_else(|| panic!("{text:?}"));
        assert!(!item.contains('\n'), "{text:?}");
    }
    for names in stage_names(c) {
        assert_eq!(names.last().unwrap(), "mirostat", "{names:?}");
    }
}
