//! Speculative decoding behind the HTTP API: a server with prompt lookup on answers exactly
//! as one without, and /metrics counts the drafts, proposed and accepted tokens (vLLM's
//! `spec_decode_*` counters).

use nucleus::engine::scheduler::{EngineConfig, SpecConfig};
use serde_json::json;

use crate::common::*;

#[test]
fn speculation_changes_no_answer_and_is_counted() {
    // The tiny model's weights are random: a bias towards three tokens makes its output
    // repeat itself, partly, so that prompt lookup has something to propose and some of it is
    // right.
    let prompt = "one two three four five six seven eight nine ten ".repeat(6);
    let ask = |addr, seed: u64, temperature: f64| {
        let req = json!({"prompt": prompt, "max_tokens": 48, "temperature": temperature,
                         "seed": seed, "logprobs": 2,
                         "logit_bias": {"100": 30, "101": 30, "102": 30}});
        let r = post(addr, "/v1/completions", &req);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        (
            v["choices"][0]["text"].clone(),
            v["choices"][0]["logprobs"].clone(),
            v["usage"]["completion_tokens"].clone(),
        )
    };
    let Some(plain) = start(small(), None) else {
        return;
    };
    let want: Vec<_> = [(1, 0.0), (2, 0.9), (3, 1.2)]
        .iter()
        .map(|&(s, t)| ask(plain.addr, s, t))
        .collect();
    drop(plain);
    let srv = start(
        EngineConfig {
            speculation: Some(SpecConfig { max_draft: 8 }),
            ..small()
        },
        None,
    )
    .unwrap();
    for (i, &(s, t)) in [(1, 0.0), (2, 0.9), (3, 1.2)].iter().enumerate() {
        assert_eq!(ask(srv.addr, s, t), want[i], "seed {s}, temperature {t}");
    }
    let m = get(srv.addr, "/metrics").text();
    let metric = |name: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{m}"))
            .parse()
            .unwrap()
    };
    let drafts = metric("nucleus_spec_decode_num_drafts_total");
    let proposed = metric("nucleus_spec_decode_num_draft_tokens_total");
    let accepted = metric("nucleus_spec_decode_num_accepted_tokens_total");
    eprintln!("{drafts} drafts, {proposed} proposed, {accepted} accepted");
    assert!(
        drafts > 0 && proposed >= drafts && accepted <= proposed,
        "{m}"
    );
    assert!(accepted > 0 && accepted < proposed, "{m}");
}
