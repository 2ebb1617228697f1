//! The two attention paths against a direct softmax, and against each other where they must
//! agree to the bit.

use half::f16;

use super::*;
use crate::kv_cache::{KvCache, KvConfig, KvType, SeqId};

/// [`attend_heads`] for one head.
#[allow(clippy::too_many_arguments)]
fn attend_head(
    kv: &KvCache,
    layer: usize,
    blocks: &[crate::kv_cache::BlockId],
    kv_head: usize,
    q: &[f32],
    range: (usize, usize),
    scale: ScoreScale,
    out: &mut [f32],
) {
    attend_heads(
        kv,
        layer,
        blocks,
        kv_head,
        &[q],
        range,
        (scale, None),
        &mut [out],
    );
}

/// [`attend_tiled`] on layer 0, KV head 0 of the test cache: each query's output.
fn tiled_outputs(
    kv: &KvCache,
    blocks: &[crate::kv_cache::BlockId],
    queries: &[&[f32]],
    ranges: &[(usize, usize)],
    scale: ScoreScale,
) -> Vec<Vec<f32>> {
    let mut outs = vec![vec![0f32; DV]; queries.len()];
    let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
    attend_tiled(
        kv,
        0,
        blocks,
        0,
        queries,
        ranges,
        (scale, None),
        &mut out_refs,
    );
    outs
}

/// Head dimensions of the test cache, and the f16-exact keys and values it holds.
const DK: usize = 40;
const DV: usize = 24;

fn key(p: usize, d: usize) -> f32 {
    f16::from_f32(((p * 7 + d * 3) % 11) as f32 * 0.125 - 0.6).to_f32()
}

fn val(p: usize, d: usize) -> f32 {
    f16::from_f32(((p * 5 + d) % 7) as f32 * 0.5 - 1.5).to_f32()
}

/// A one-layer cache with `n` positions of one sequence, in blocks of 16.
fn filled_cache(n: usize) -> (KvCache, SeqId) {
    let mut kv = KvCache::new(KvConfig {
        ty: crate::kv_cache::KvType::F16,
        n_layers: 1,
        n_kv_heads: 1,
        head_dim_k: DK,
        head_dim_v: DV,
        block_size: 16,
        n_blocks: n.div_ceil(16),
        sliding: None,
    });
    let seq = kv.new_seq();
    kv.reserve(seq, n).unwrap();
    for p in 0..n {
        let (b, s) = kv.slot(seq, p).unwrap();
        let k: Vec<f32> = (0..DK).map(|d| key(p, d)).collect();
        let v: Vec<f32> = (0..DV).map(|d| val(p, d)).collect();
        kv.write(0, b, s, &k, &v);
    }
    kv.commit(seq, n).unwrap();
    (kv, seq)
}

/// softmax(scale · q·Kᵀ) · V over `[start, end)`, in f64.
fn direct_attention(q: &[f32], range: (usize, usize), scale: f64) -> Vec<f64> {
    direct_capped_attention(q, range, scale, None)
}

/// [`direct_attention`] with the scores soft-capped: cap · tanh(score / cap).
fn direct_capped_attention(
    q: &[f32],
    (start, end): (usize, usize),
    scale: f64,
    cap: Option<f64>,
) -> Vec<f64> {
    let scores: Vec<f64> = (start..end)
        .map(|p| scale * (0..DK).map(|d| q[d] as f64 * key(p, d) as f64).sum::<f64>())
        .map(|s| cap.map_or(s, |c| c * (s / c).tanh()))
        .collect();
    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
    let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
    (0..DV)
        .map(|d| {
            (start..end)
                .zip(&scores)
                .map(|(p, s)| (s - m).exp() / z * val(p, d) as f64)
                .sum()
        })
        .collect()
}

fn query(i: usize) -> Vec<f32> {
    (0..DK)
        .map(|d| f16::from_f32(((d + 3 * i) % 9) as f32 * 0.1 - 0.4).to_f32())
        .collect()
}

/// Queries seeing positions that start and end in different blocks and tiles.
const CASES: [(usize, Option<usize>); 8] = [
    (0, None),
    (63, None),
    (64, None),
    (130, Some(70)),
    (200, None),
    (255, Some(3)),
    (299, None),
    (299, Some(64)),
];

/// The one-query path against a direct softmax (its output accumulates in f16, as
/// llama.cpp's does: ~1e-3 relative).
#[test]
fn online_softmax_equals_direct_softmax() {
    let (kv, seq) = filled_cache(300);
    let blocks = kv.seq_blocks(seq).unwrap();
    for (i, &(pos, window)) in CASES.iter().enumerate() {
        let (q, range) = (query(i), visible_range(pos, window));
        let mut out = vec![0.0; DV];
        attend_head(&kv, 0, blocks, 0, &q, range, 0.3.into(), &mut out);
        for (got, want) in out.iter().zip(direct_attention(&q, range, 0.3)) {
            assert!(
                (*got as f64 - want).abs() < 5e-3,
                "pos {pos} window {window:?}"
            );
        }
    }
}

/// The tiled path against a direct softmax (its accumulators are f32: close to 1e-6), and a
/// query alone gives the bits it gets in a group.
#[test]
fn tiled_attention_equals_direct_softmax() {
    let (kv, seq) = filled_cache(300);
    let blocks = kv.seq_blocks(seq).unwrap();
    let qs: Vec<Vec<f32>> = (0..CASES.len()).map(query).collect();
    let queries: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
    let ranges: Vec<(usize, usize)> = CASES.iter().map(|&(p, w)| visible_range(p, w)).collect();
    let outs = tiled_outputs(&kv, blocks, &queries, &ranges, 0.3.into());
    for (i, out) in outs.iter().enumerate() {
        for (got, want) in out.iter().zip(direct_attention(&qs[i], ranges[i], 0.3)) {
            assert!(
                (*got as f64 - want).abs() < 1e-5,
                "case {i}: {got} vs {want}"
            );
        }
    }
    let alone = tiled_outputs(&kv, blocks, &queries[3..4], &ranges[3..4], 0.3.into());
    assert_eq!(alone[0], outs[3]);
}

/// Many queries in one call (the heads sharing a KV head: more than one chunk of lanes,
/// values folded in for several queries at once) get the bits each gets alone.
#[test]
fn tiled_queries_get_their_own_bits_in_any_company() {
    let (kv, seq) = filled_cache(300);
    let blocks = kv.seq_blocks(seq).unwrap();
    // One chunk of eight lanes or less (a decode step's heads: on AVX-512 the keys in pairs),
    // and three chunks.
    for n in [4, 6, 8, 21] {
        let qs: Vec<Vec<f32>> = (0..n).map(query).collect();
        let queries: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
        let ranges: Vec<(usize, usize)> = (0..n)
            .map(|i| {
                let (p, w) = CASES[i % CASES.len()];
                visible_range(p, w)
            })
            .collect();
        let outs = tiled_outputs(&kv, blocks, &queries, &ranges, 0.3.into());
        for i in 0..n {
            let (q, r) = (&queries[i..i + 1], &ranges[i..i + 1]);
            let alone = tiled_outputs(&kv, blocks, q, r, 0.3.into()).remove(0);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&alone), bits(&outs[i]), "{n} queries: query {i}");
            for (got, want) in alone.iter().zip(direct_attention(&qs[i], ranges[i], 0.3)) {
                assert!(
                    (*got as f64 - want).abs() < 1e-5,
                    "query {i}: {got} vs {want}"
                );
            }
        }
    }
}

/// Heads attended together get the bits each gets alone, capped or not.
#[test]
fn heads_attended_together_get_their_own_bits() {
    let (kv, seq) = filled_cache(300);
    let blocks = kv.seq_blocks(seq).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for scale in [ScoreScale::from(0.3), ScoreScale::new(3.0, Some(0.5))] {
        for &(pos, window) in &CASES {
            let range = visible_range(pos, window);
            let qs: Vec<Vec<f32>> = (0..7).map(|i| query(i + pos % 5)).collect();
            let q_refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
            let mut outs = vec![vec![0f32; DV]; qs.len()];
            let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
            attend_heads(
                &kv,
                0,
                blocks,
                0,
                &q_refs,
                range,
                (scale, None),
                &mut out_refs,
            );
            for (q, got) in qs.iter().zip(&outs) {
                let mut alone = vec![0f32; DV];
                attend_head(&kv, 0, blocks, 0, q, range, scale, &mut alone);
                assert_eq!(bits(got), bits(&alone), "pos {pos} window {window:?}");
            }
        }
    }
}

/// Soft-capped scores (Gemma 2) in both paths: the softmax of cap · tanh(scale · q·k / cap),
/// and the cap changes the output (the scores here reach several times the cap of 0.5).
#[test]
fn soft_capped_attention_equals_direct_softmax() {
    let (kv, seq) = filled_cache(300);
    let blocks = kv.seq_blocks(seq).unwrap();
    let capped = ScoreScale::new(3.0, Some(0.5));
    let qs: Vec<Vec<f32>> = (0..CASES.len()).map(query).collect();
    let ranges: Vec<(usize, usize)> = CASES.iter().map(|&(p, w)| visible_range(p, w)).collect();
    let queries: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
    let tiled = tiled_outputs(&kv, blocks, &queries, &ranges, capped);
    let mut moved = 0f64;
    for (i, q) in qs.iter().enumerate() {
        let mut one = vec![0f32; DV];
        attend_head(&kv, 0, blocks, 0, q, ranges[i], capped, &mut one);
        let want = direct_capped_attention(q, ranges[i], 3.0, Some(0.5));
        let uncapped = direct_attention(q, ranges[i], 3.0);
        for d in 0..DV {
            assert!((one[d] as f64 - want[d]).abs() < 5e-3, "case {i} one-query");
            assert!(
                (tiled[i][d] as f64 - want[d]).abs() < 1e-5,
                "case {i} tiled"
            );
            moved = moved.max((want[d] - uncapped[d]).abs());
        }
    }
    assert!(moved > 0.05, "the cap changed nothing ({moved})");
}

#[test]
fn score_scale_divides_by_the_cap_first() {
    let s = ScoreScale::new(0.25, Some(50.0));
    assert_eq!(s.score(8.0), 50.0 * (8.0 * (0.25f32 / 50.0)).tanh());
    assert_eq!(ScoreScale::from(0.25).score(8.0), 2.0);
}

#[test]
fn window_limits_visible_positions() {
    assert_eq!(visible_range(10, None), (0, 11));
    assert_eq!(visible_range(10, Some(4)), (7, 11));
    assert_eq!(visible_range(2, Some(512)), (0, 3));
}

/// A Q8_0 or Q4_0 cache: attention is exactly the softmax of what the cache stores, for
/// the query rounded to Q8_0 (to f32 rounding), and close to the unquantized attention,
/// within the formats' error.
#[test]
fn quantized_cache_attention_is_the_softmax_of_what_it_stores() {
    use crate::quant::{dequantize_row, quantize_row_act, GgmlType};
    const D: usize = 64;
    let k_at = |p: usize, d: usize| ((p * 13 + d * 7) as f32 * 0.37).sin();
    let v_at = |p: usize, d: usize| ((p * 3 + d * 11) as f32 * 0.23).cos() * 2.0;
    // Values up to 2 in size: Q4_0 steps of 2 / 8, off by up to one at the far end.
    for (ty, loose) in [(KvType::Q8_0, 0.02), (KvType::Q4_0, 0.26)] {
        let n = 300;
        let mut kv = KvCache::new(KvConfig {
            ty,
            n_layers: 1,
            n_kv_heads: 1,
            head_dim_k: D,
            head_dim_v: D,
            block_size: 16,
            n_blocks: n / 16 + 1,
            sliding: None,
        });
        let seq = kv.new_seq();
        kv.reserve(seq, n).unwrap();
        for p in 0..n {
            let (b, s) = kv.slot(seq, p).unwrap();
            let k: Vec<f32> = (0..D).map(|d| k_at(p, d)).collect();
            let v: Vec<f32> = (0..D).map(|d| v_at(p, d)).collect();
            kv.write(0, b, s, &k, &v);
        }
        kv.commit(seq, n).unwrap();
        let blocks = kv.seq_blocks(seq).unwrap();
        let stored = |p: usize| {
            let (b, s) = kv.slot(seq, p).unwrap();
            let (mut k, mut v) = (vec![0f32; D], vec![0f32; D]);
            kv.read_key(0, b, 0, s, &mut k);
            kv.read_value(0, b, 0, s, &mut v);
            (k, v)
        };
        // With a soft cap (Gemma 2) too: cap · tanh(score / cap).
        let softmax = |q: &[f32],
                       range: (usize, usize),
                       cap: Option<f64>,
                       kv_at: &dyn Fn(usize) -> (Vec<f32>, Vec<f32>)| {
            let rows: Vec<_> = (range.0..range.1).map(kv_at).collect();
            let sc: Vec<f64> = rows
                .iter()
                .map(|(k, _)| {
                    0.3 * k
                        .iter()
                        .zip(q)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                })
                .map(|s| cap.map_or(s, |c| c * (s / c).tanh()))
                .collect();
            let m = sc.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = sc.iter().map(|s| (s - m).exp()).sum();
            (0..D)
                .map(|d| {
                    rows.iter()
                        .zip(&sc)
                        .map(|((_, v), s)| (s - m).exp() / z * v[d] as f64)
                        .sum::<f64>()
                })
                .collect::<Vec<f64>>()
        };
        let capped_cases = CASES.iter().flat_map(|&c| [(c, None), (c, Some(1.0))]);
        for (i, ((pos, window), cap)) in capped_cases.enumerate() {
            let q: Vec<f32> = (0..D).map(|d| ((d + 5 * i) as f32 * 0.41).sin()).collect();
            let range = visible_range(pos, window);
            let mut out = vec![0.0; D];
            let scale = ScoreScale::new(0.3, cap.map(|c| c as f32));
            attend_head(&kv, 0, blocks, 0, &q, range, scale, &mut out);
            let mut q8 = vec![0u8; D / 32 * 34];
            quantize_row_act(GgmlType::Q8_0, &q, &mut q8);
            let mut qq = vec![0f32; D];
            dequantize_row(GgmlType::Q8_0, &q8, &mut qq);
            let exact = softmax(&qq, range, cap, &stored);
            let unquantized = softmax(&q, range, cap, &|p| {
                (
                    (0..D).map(|d| k_at(p, d)).collect(),
                    (0..D).map(|d| v_at(p, d)).collect(),
                )
            });
            for d in 0..D {
                let (got, e, u) = (out[d] as f64, exact[d], unquantized[d]);
                assert!(
                    (got - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{ty} case {i} dim {d}: {got} vs {e}"
                );
                assert!(
                    (got - u).abs() <= loose,
                    "{ty} case {i} dim {d}: {got} vs unquantized {u}"
                );
            }
        }
    }
}
