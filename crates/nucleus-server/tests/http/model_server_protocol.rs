//! The Gateway API Inference Extension's Model Server Protocol as the Kubernetes manifests use
//! it: the metric names `deploy/kubernetes/epp.yaml` gives the endpoint picker are exported with
//! the type and meaning the protocol asks for, the probes' path answers, and the completions and
//! chat APIs serve. A name renamed on either side fails here.

use std::collections::HashMap;
use std::path::PathBuf;

use nucleus::engine::scheduler::EngineConfig;
use serde_json::json;

use crate::common::*;

fn deploy_file(name: &str) -> String {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/kubernetes"
    ))
    .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// `key: "value"` settings of the picker's configuration (the ConfigMap's YAML, read as lines:
/// each key the test needs appears once).
fn epp_settings() -> HashMap<String, String> {
    deploy_file("epp.yaml")
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            let k = k.trim_start_matches("- ");
            let is_metric_setting = k.ends_with("Spec") || k.ends_with("LabelName");
            is_metric_setting.then(|| (k.to_string(), v.trim().trim_matches('"').to_string()))
        })
        .collect()
}

/// The samples of metric family `name` in a Prometheus text page: (labels, value), after
/// checking that the family is declared with `kind`.
fn samples(page: &str, name: &str, kind: &str) -> Vec<(HashMap<String, String>, f64)> {
    assert!(
        page.lines().any(|l| l == format!("# TYPE {name} {kind}")),
        "/metrics does not declare {name} as a {kind}:\n{page}"
    );
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (family, labels) = match series.split_once('{') {
                Some((f, rest)) => (f, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            (family == name).then(|| {
                let labels = labels
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').expect("label=value");
                        (k.to_string(), v.trim_matches('"').to_string())
                    })
                    .collect();
                (labels, value.parse().expect("a number"))
            })
        })
        .collect()
}

#[test]
fn the_metrics_the_endpoint_picker_is_configured_with_are_exported() {
    let settings = epp_settings();
    let spec = |k: &str| {
        settings
            .get(k)
            .unwrap_or_else(|| panic!("epp.yaml sets no {k}: {settings:?}"))
            .clone()
    };
    // A block size other than the default shows the label is the engine's own.
    let cfg = EngineConfig {
        block_size: 8,
        ..small()
    };
    let Some(srv) = start(cfg, None) else {
        return;
    };
    let r = post(
        srv.addr,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let page = get(srv.addr, "/metrics").text();

    // TotalQueuedRequests and TotalRunningRequests: gauges of whole requests (idle now).
    for key in ["queuedRequestsSpec", "runningRequestsSpec"] {
        let s = samples(&page, &spec(key), "gauge");
        assert_eq!(s.len(), 1, "{key}: one unlabelled sample");
        assert_eq!(s[0].1, 0.0, "{key} on an idle server");
    }
    // KVCacheUtilization: the picker wants a fraction from 0 to 1.
    let s = samples(&page, &spec("kvUsageSpec"), "gauge");
    assert_eq!(s.len(), 1);
    assert!((0.0..=1.0).contains(&s[0].1), "KV usage {}", s[0].1);
    // BlockSize and the number of blocks, as labels of an info gauge.
    let total = samples(&page, "nucleus_kv_blocks_capacity", "gauge")[0].1;
    let s = samples(&page, &spec("cacheInfoSpec"), "gauge");
    assert_eq!(s.len(), 1);
    let labels = &s[0].0;
    assert_eq!(labels[&spec("cacheBlockSizeLabelName")], "8");
    assert_eq!(
        labels[&spec("cacheNumBlocksLabelName")],
        (total as u64).to_string()
    );
    assert_eq!(total, 4096.0 / 8.0);
    // No LoRA adapters to report: the picker is told not to look.
    assert_eq!(spec("loraSpec"), "");
}

#[test]
fn probes_and_the_openai_apis_answer() {
    let deployment = deploy_file("nucleus-deployment.yaml");
    let probe_paths: Vec<&str> = deployment
        .lines()
        .filter_map(|l| l.trim().strip_prefix("path: "))
        .collect();
    assert_eq!(
        probe_paths.len(),
        3,
        "startup, readiness and liveness probes"
    );
    let Some(srv) = start(small(), None) else {
        return;
    };
    for path in probe_paths {
        let r = get(srv.addr, path);
        assert_eq!(r.status, 200, "probe {path}");
    }
    let r = post(
        srv.addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["object"], "text_completion");
    let r = post(
        srv.addr,
        "/v1/chat/completions",
        &json!({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["object"], "chat.completion");
}
