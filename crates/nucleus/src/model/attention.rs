//! Attention of one query head over a sequence's paged KV cache, with an online softmax: the
//! scores of one block at a time, rescaling the running sum and output when the maximum grows,
//! so no n×n score matrix is ever built.

use half::f16;

use crate::kernels::f16 as f16k;
use crate::kv_cache::{BlockId, KvCache};

/// The keys a query at position `pos` may see: `[start, pos]`, causal, limited to the last
/// `window` positions when the layer has a sliding window.
pub fn visible_range(pos: usize, window: Option<usize>) -> (usize, usize) {
    let start = match window {
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    };
    (start, pos + 1)
}

/// out = softmax(scale · q·Kᵀ) · V over positions `[start, end)` of the sequence whose blocks
/// are `blocks`, for KV head `kv_head`, without ever holding more than one score.
///
/// The arithmetic is llama.cpp's CPU flash-attention decode path, so that our logits agree with
/// the reference to the last bit where they can: the query is rounded to f16, keys are visited
/// one at a time, and the output accumulates in f16. Every token uses it, whatever else is in
/// its batch, so a sequence's results do not depend on how it was batched or chunked (llama.cpp
/// itself switches to an f32 tiled path at 64 queries per batch, which makes its own outputs
/// batch-dependent).
#[allow(clippy::too_many_arguments)]
pub fn attend_head(
    kv: &KvCache,
    layer: usize,
    blocks: &[BlockId],
    kv_head: usize,
    q: &[f32],
    (start, end): (usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    let cfg = kv.config();
    let (bs, dk, dv) = (cfg.block_size, cfg.head_dim_k, cfg.head_dim_v);
    debug_assert!(dk <= 512 && dv <= 512);
    let mut q16 = [f16::ZERO; 512];
    for (d, &s) in q16.iter_mut().zip(q) {
        *d = f16::from_f32(s);
    }
    let q16 = &q16[..dk];
    let mut acc = [f16::ZERO; 512];
    let acc = &mut acc[..dv];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    // Keys go four at a time: their scores, then the running maximum and sum key by key, then
    // one pass over the accumulator applying the four keys' updates in order (bit-identical to
    // updating it key by key, see `acc_steps_f16`).
    const GROUP: usize = 4;
    let mut pos = start;
    while pos < end {
        let g = GROUP.min(end - pos);
        let mut steps = [f16k::AccStep {
            rescale: None,
            weight: 0.0,
        }; GROUP];
        let mut values: [&[f16]; GROUP] = [&[]; GROUP];
        for i in 0..g {
            let (block, slot) = (blocks[(pos + i) / bs], (pos + i) % bs);
            let k = &kv.block_keys(layer, block, kv_head)[slot * dk..(slot + 1) * dk];
            let s = f16k::dot_f16(q16, k) * scale;
            // Per key: either the maximum grows (rescale what we have, weight 1 for this key)
            // or this key gets weight exp(s - max).
            let (ms, vs) = if s > max {
                let ms = (max - s).exp();
                max = s;
                steps[i].rescale = Some(ms);
                (ms, 1.0)
            } else {
                (1.0, (s - max).exp())
            };
            steps[i].weight = vs;
            sum = sum.mul_add(ms, vs);
            values[i] = &kv.block_values(layer, block, kv_head)[slot * dv..(slot + 1) * dv];
        }
        f16k::acc_steps_f16(acc, &values[..g], &steps[..g]);
        pos += g;
    }
    let inv = 1.0 / sum;
    for (o, a) in out[..dv].iter_mut().zip(acc.iter()) {
        *o = a.to_f32() * inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::KvConfig;

    /// Attention against a direct softmax over all scores, across block boundaries and windows.
    #[test]
    fn online_softmax_equals_direct_softmax() {
        let (dk, dv, bs) = (8, 4, 4);
        let mut kv = KvCache::new(KvConfig {
            n_layers: 1,
            n_kv_heads: 1,
            head_dim_k: dk,
            head_dim_v: dv,
            block_size: bs,
            n_blocks: 48,
        });
        let seq = kv.new_seq();
        let n = 150;
        kv.reserve(seq, n).unwrap();
        let key =
            |p: usize, d: usize| f16::from_f32(((p * 7 + d * 3) % 11) as f32 * 0.25 - 1.0).to_f32();
        let val = |p: usize, d: usize| f16::from_f32(((p * 5 + d) % 7) as f32 * 0.5 - 1.5).to_f32();
        for p in 0..n {
            let (b, s) = kv.slot(seq, p).unwrap();
            let k: Vec<f32> = (0..dk).map(|d| key(p, d)).collect();
            let v: Vec<f32> = (0..dv).map(|d| val(p, d)).collect();
            kv.write(0, b, s, &k, &v);
        }
        kv.commit(seq, n).unwrap();
        let q: Vec<f32> = (0..dk)
            .map(|d| f16::from_f32(d as f32 * 0.2 - 0.7).to_f32())
            .collect();
        for (pos, window) in [
            (10, None),
            (10, Some(3)),
            (5, None),
            (0, None),
            (9, Some(6)),
            (149, None),
            (130, Some(70)),
        ] {
            let range = visible_range(pos, window);
            let scores: Vec<f64> = (range.0..range.1)
                .map(|p| 0.5 * (0..dk).map(|d| (q[d] * key(p, d)) as f64).sum::<f64>())
                .collect();
            let m = scores.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            {
                let mut out = vec![0.0; dv];
                let blocks = kv.seq_blocks(seq).unwrap();
                attend_head(&kv, 0, blocks, 0, &q, range, 0.5, &mut out);
                // The output accumulates in f16, as llama.cpp's does: ~1e-3 relative.
                let tol = 5e-3;
                for (d, &got) in out.iter().enumerate() {
                    let want: f64 = (range.0..range.1)
                        .zip(&scores)
                        .map(|(p, s)| (s - m).exp() / z * val(p, d) as f64)
                        .sum();
                    let got = got as f64;
                    assert!((got - want).abs() < tol, "pos {pos} window {window:?}");
                }
            }
        }
    }

    #[test]
    fn window_limits_visible_positions() {
        assert_eq!(visible_range(10, None), (0, 11));
        assert_eq!(visible_range(10, Some(4)), (7, 11));
        assert_eq!(visible_range(2, Some(512)), (0, 3));
    }
}
