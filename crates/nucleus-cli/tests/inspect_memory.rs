//! `nucleus inspect MODEL --memory`: the KV bytes per token are the product the line states,
//! the pool holds --ctx tokens in whole blocks of 16, and the total is the sum of its parts;
//! a zero context is a one-line error. On the tiny model (`../shared`).

mod common;

use common::{fails_with, nucleus, tiny};

/// The number right after `label` on its line of `out` (kB and MB as bytes).
fn figure(out: &str, label: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} in {out}"));
    let rest: Vec<&str> = line.trim_start()[label.len()..]
        .split_whitespace()
        .collect();
    let v: f64 = rest[0].parse().unwrap();
    match rest.get(1) {
        Some(&"kB") => v * 1e3,
        Some(&"MB") => v * 1e6,
        _ => v,
    }
}

#[test]
fn the_memory_plan_adds_up() {
    let Some(m) = tiny() else { return };
    let (code, out, err) = nucleus(&["inspect", &m, "--memory", "--ctx", "100"]);
    assert_eq!(code, 0, "{err}");
    let per_token = figure(&out, "KV per token");
    // "KV per token  N  bytes: L layers × H KV heads × (key K + value V values) in f16"
    let line = out.lines().find(|l| l.contains("KV per token")).unwrap();
    let nums: Vec<f64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().unwrap())
        .collect();
    let (layers, heads, k, v) = (nums[1], nums[2], nums[3], nums[4]);
    assert_eq!(per_token, layers * heads * (k + v) * 2.0, "{line}");
    assert_eq!(figure(&out, "global layers"), per_token, "{out}");
    // 100 tokens: 7 blocks of 16.
    assert!(out.contains("(7 blocks: 100 tokens"), "{out}");
    let pool = figure(&out, "KV pool");
    assert!(
        (pool - 7.0 * 16.0 * per_token).abs() <= 50.0,
        "{pool} {out}"
    );
    let parts = figure(&out, "weights")
        + pool
        + figure(&out, "pool overhead")
        + figure(&out, "forward scratch");
    let total = figure(&out, "total of the above");
    // Each figure is rounded to 0.1 MB (or kB): three roundings at most.
    assert!((total - parts).abs() <= 150e3, "{total} vs {parts}: {out}");
    fails_with(
        &["inspect", &m, "--memory", "--ctx", "0"],
        "--ctx must be at least 1",
    );
}
