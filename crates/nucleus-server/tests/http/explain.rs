//! `explain` (nucleus's extension; the CLI's `--explain`): per token, the candidates left after
//! each stage of the sampler chain, the entropy of the distribution the token was drawn from,
//! and its probability there.

use serde_json::{json, Value};

use crate::common::*;

const CHAT: &str = "/v1/chat/completions";

fn sampled() -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": true,
           "temperature": 0.9, "top_k": 5, "seed": 11})
}

fn check_entry(e: &Value, n_vocab: u64) {
    let stages = e["stages"].as_array().unwrap();
    assert_eq!(stages[0]["stage"], "input");
    assert_eq!(stages[0]["candidates"].as_u64(), Some(n_vocab), "{e}");
    let counts: Vec<u64> = stages
        .iter()
        .map(|s| s["candidates"].as_u64().unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[1] <= w[0]), "{e}: never grows");
    let p = e["chosen_prob"].as_f64().unwrap();
    assert!(p > 0.0 && p <= 1.0, "{e}");
    assert!(e["entropy"].as_f64().unwrap() >= 0.0, "{e}");
    assert!(e["token"].is_string() && e["id"].is_u64(), "{e}");
}

#[test]
fn explain_reports_every_step_and_changes_nothing() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    let n_vocab = get(a, "/v1/models").json()["data"][0]["meta"]["n_vocab"]
        .as_u64()
        .unwrap();
    let plain = post(a, CHAT, &sampled()).json();
    assert!(plain["choices"][0].get("explain").is_none());

    let mut req = sampled();
    req["explain"] = json!(true);
    let v = post(a, CHAT, &req).json();
    let c = &v["choices"][0];
    assert_eq!(c["message"], plain["choices"][0]["message"]);
    let steps = c["explain"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    for e in steps {
        check_entry(e, n_vocab);
        let names: Vec<&str> = e["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["stage"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "input",
                "penalties",
                "top_k",
                "typical_p",
                "top_p",
                "min_p",
                "temperature"
            ]
        );
        assert!(e["stages"][2]["candidates"].as_u64().unwrap() <= 5, "{e}");
    }

    // Greedy: one candidate left, probability 1, entropy 0.
    req["temperature"] = json!(0);
    let v = post(a, CHAT, &req).json();
    for e in v["choices"][0]["explain"].as_array().unwrap() {
        check_entry(e, n_vocab);
        assert_eq!(
            e["stages"].as_array().unwrap().last().unwrap()["stage"],
            "greedy"
        );
        assert_eq!(e["chosen_prob"], 1.0);
        assert_eq!(e["entropy"], 0.0);
    }

    // The legacy endpoint, n = 2.
    let body = json!({"prompt": "hi", "max_tokens": 3, "ignore_eos": true, "n": 2,
                      "explain": true, "seed": 1});
    let v = post(a, "/v1/completions", &body).json();
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["explain"].as_array().unwrap().len(), 3, "{c}");
    }
}

#[test]
fn explain_streams_one_entry_per_token() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    let mut req = sampled();
    req["explain"] = json!(true);
    req["stream"] = json!(true);
    let events = sse_events(&post(a, CHAT, &req));
    let entries: Vec<&Value> = events
        .iter()
        .filter_map(|e| e["choices"][0].get("explain"))
        .collect();
    assert_eq!(entries.len(), 4);
    for e in entries {
        assert_eq!(e.as_array().unwrap().len(), 1);
    }
}

#[test]
fn explain_bad_values_are_named() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    for bad in [json!("yes"), json!(1), json!([true])] {
        let mut req = sampled();
        req["explain"] = bad;
        assert_error(&post(srv.addr, CHAT, &req), 400, Some("explain"));
    }
}
