//! Prometheus text-format metrics: engine gauges and counters, plus latency histograms measured
//! where the HTTP layer receives the engine's events.
//!
//! The Gateway API Inference Extension's endpoint picker routes by four of them (its Model Server
//! Protocol): `nucleus_requests_waiting` (TotalQueuedRequests), `nucleus_requests_running`
//! (TotalRunningRequests), `nucleus_kv_cache_usage_ratio` (KVCacheUtilization, 0 to 1) and
//! `nucleus_cache_config_info` (BlockSize and the number of blocks, as labels).
//! `deploy/kubernetes/epp.yaml` names them; `tests/http/model_server_protocol.rs` keeps the two in step.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use nucleus::engine::scheduler::EngineStats;

/// A cumulative histogram with fixed bucket bounds (seconds).
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// Sum in nanoseconds.
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            if seconds <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        describe(out, name, "histogram", help);
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{b}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let n = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {n}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {n}");
    }
}

const TTFT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const ITL_BOUNDS: &[f64] = &[0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0];

pub struct Metrics {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub requests_ok: AtomicU64,
    pub requests_client_error: AtomicU64,
    pub requests_rejected: AtomicU64,
    pub requests_server_error: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ttft: Histogram::new(TTFT_BOUNDS),
            itl: Histogram::new(ITL_BOUNDS),
            requests_ok: AtomicU64::new(0),
            requests_client_error: AtomicU64::new(0),
            requests_rejected: AtomicU64::new(0),
            requests_server_error: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    pub fn count_status(&self, status: u16) {
        let c = match status {
            429 => &self.requests_rejected,
            400..=499 => &self.requests_client_error,
            500.. => &self.requests_server_error,
            _ => &self.requests_ok,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The metrics page for `s`, an engine whose KV blocks hold `block_size` tokens each.
    pub fn render(&self, s: &EngineStats, block_size: usize) -> String {
        let mut out = String::new();
        for (kind, name, v, help) in engine_metrics(s) {
            describe(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {v}");
        }
        kv_cache_metrics(&mut out, s, block_size);
        self.render_http(&mut out);
        out
    }

    /// Requests by outcome, and the latency histograms.
    fn render_http(&self, out: &mut String) {
        describe(
            out,
            "nucleus_http_requests_total",
            COUNTER,
            "HTTP generation requests by outcome.",
        );
        for (label, c) in [
            ("ok", &self.requests_ok),
            ("client_error", &self.requests_client_error),
            ("rejected", &self.requests_rejected),
            ("server_error", &self.requests_server_error),
        ] {
            let _ = writeln!(
                out,
                "nucleus_http_requests_total{{outcome=\"{label}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        self.ttft.render(
            out,
            "nucleus_time_to_first_token_seconds",
            "Time from request arrival to the first generated token.",
        );
        self.itl.render(
            out,
            "nucleus_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a sequence.",
        );
    }
}

/// Prometheus metric types.
const GAUGE: &str = "gauge";
const COUNTER: &str = "counter";

/// The engine's gauges and counters: (type, name, value, help).
#[rustfmt::skip]
fn engine_metrics(s: &EngineStats) -> [(&'static str, &'static str, u64, &'static str); 21] {
    [
        (GAUGE, "nucleus_requests_running", s.running as u64,
            "Sequences being decoded."),
        (GAUGE, "nucleus_requests_waiting", s.waiting as u64,
            "Sequences waiting for admission (queued or preempted)."),
        (GAUGE, "nucleus_kv_blocks_used", s.kv_used_blocks as u64,
            "KV cache blocks in use."),
        (GAUGE, "nucleus_kv_blocks_free", s.kv_free_blocks as u64,
            "KV cache blocks free."),
        (GAUGE, "nucleus_kv_blocks_capacity", s.kv_total_blocks as u64,
            "KV cache blocks in the pool."),
        (GAUGE, "nucleus_kv_blocks_cached", s.kv_cached_blocks as u64,
            "KV cache blocks holding a cached prefix (in use, or kept for reuse and counted free)."),
        (COUNTER, "nucleus_prefix_cache_queries_total", s.prefix_cache_queries_tokens,
            "Prompt tokens looked up in the prefix cache."),
        (COUNTER, "nucleus_prefix_cache_hits_total", s.prefix_cache_hits_tokens,
            "Prompt tokens found in the prefix cache (not computed)."),
        (COUNTER, "nucleus_prompt_tokens_total", s.prompt_tokens_total,
            "Prompt tokens of admitted requests."),
        (COUNTER, "nucleus_generation_tokens_total", s.generation_tokens_total,
            "Tokens generated."),
        (COUNTER, "nucleus_forward_tokens_total", s.forward_tokens_total,
            "Tokens through the forward pass (including recomputation)."),
        (COUNTER, "nucleus_steps_total", s.steps_total,
            "Scheduler steps (batched forward passes)."),
        (COUNTER, "nucleus_preemptions_total", s.preemptions_total,
            "Sequences preempted for lack of KV blocks (recomputed later)."),
        (COUNTER, "nucleus_spec_decode_num_drafts_total", s.spec_decode_num_drafts,
            "Speculative decoding: verifications of proposed tokens."),
        (COUNTER, "nucleus_spec_decode_num_draft_tokens_total", s.spec_decode_num_draft_tokens,
            "Speculative decoding: tokens proposed."),
        (COUNTER, "nucleus_spec_decode_num_accepted_tokens_total", s.spec_decode_num_accepted_tokens,
            "Speculative decoding: proposed tokens accepted (the output is the same as without)."),
        (GAUGE, "nucleus_draft_kv_blocks_used", s.draft_kv_used_blocks as u64,
            "Blocks of the draft model's KV pool in use (0 without a draft model)."),
        (GAUGE, "nucleus_draft_kv_blocks_capacity", s.draft_kv_total_blocks as u64,
            "Blocks in the draft model's KV pool (0 without a draft model)."),
        (COUNTER, "nucleus_sequences_finished_total", s.requests_finished,
            "Sequences that ended normally."),
        (COUNTER, "nucleus_sequences_cancelled_total", s.requests_cancelled,
            "Sequences cancelled by their client."),
        (COUNTER, "nucleus_sequences_failed_total", s.requests_failed,
            "Sequences that ended with an error."),
    ]
}

/// The KV cache's usage ratio and configuration (the endpoint picker reads both).
fn kv_cache_metrics(out: &mut String, s: &EngineStats, block_size: usize) {
    let usage = if s.kv_total_blocks == 0 {
        0.0
    } else {
        s.kv_used_blocks as f64 / s.kv_total_blocks as f64
    };
    describe(
        out,
        "nucleus_kv_cache_usage_ratio",
        GAUGE,
        "Fraction of the KV cache's blocks in use by sequences (cached blocks kept for reuse \
         count as free).",
    );
    let _ = writeln!(out, "nucleus_kv_cache_usage_ratio {usage}");
    // vLLM's `cache_config_info` shape: an info gauge whose labels carry the values; the
    // picker's prefix-cache scorer hashes prompts in blocks of this size (in tokens, about
    // four characters each) and sizes its per-server index by the number of blocks.
    describe(
        out,
        "nucleus_cache_config_info",
        GAUGE,
        "The KV cache's configuration as labels: tokens per block and blocks in the pool \
         (always 1).",
    );
    let _ = writeln!(
        out,
        "nucleus_cache_config_info{{block_size=\"{block_size}\",num_blocks=\"{}\"}} 1",
        s.kv_total_blocks
    );
}

/// A metric's `# HELP` and `# TYPE` lines.
fn describe(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}
