//! Attention of one query head over a sequence's paged KV cache, with an online softmax: the
//! scores of one block at a time, rescaling the running sum and output when the maximum grows,
//! so no n×n score matrix is ever built.

use half::f16;

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
/// are `blocks`, for KV head `kv_head`. `q` is rounded to f16 first, as llama.cpp does before
/// its f16 dot products, so that scores agree with the reference.
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
    debug_assert!(dk <= 512 && dv <= 512 && bs <= 256);
    let mut qh = [0f32; 512];
    for (d, &s) in qh.iter_mut().zip(q) {
        *d = f16::from_f32(s).to_f32();
    }
    let qh = &qh[..dk];
    let mut scores = [0f32; 256];
    let mut max = f32::NEG_INFINITY;
    let mut sum = 0f32;
    out[..dv].fill(0.0);
    for bi in start / bs..end.div_ceil(bs) {
        let block = blocks[bi];
        let lo = (bi * bs).max(start) - bi * bs;
        let hi = ((bi + 1) * bs).min(end) - bi * bs;
        let keys = kv.block_keys(layer, block, kv_head);
        let mut block_max = f32::NEG_INFINITY;
        for slot in lo..hi {
            let k = &keys[slot * dk..(slot + 1) * dk];
            let s = dot_f16(qh, k) * scale;
            scores[slot] = s;
            block_max = block_max.max(s);
        }
        if block_max > max {
            let r = (max - block_max).exp();
            sum *= r;
            for o in out[..dv].iter_mut() {
                *o *= r;
            }
            max = block_max;
        }
        let values = kv.block_values(layer, block, kv_head);
        for slot in lo..hi {
            let p = (scores[slot] - max).exp();
            sum += p;
            let v = &values[slot * dv..(slot + 1) * dv];
            axpy_f16(&mut out[..dv], p, v);
        }
    }
    let inv = 1.0 / sum;
    for o in out[..dv].iter_mut() {
        *o *= inv;
    }
}

fn dot_f16(q: &[f32], k: &[f16]) -> f32 {
    let mut acc = [0f32; 8];
    let mut qc = q.chunks_exact(8);
    let mut kc = k.chunks_exact(8);
    for (qq, kk) in (&mut qc).zip(&mut kc) {
        for i in 0..8 {
            acc[i] += qq[i] * kk[i].to_f32();
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (a, b) in qc.remainder().iter().zip(kc.remainder()) {
        s += a * b.to_f32();
    }
    s
}

fn axpy_f16(out: &mut [f32], a: f32, v: &[f16]) {
    for (o, x) in out.iter_mut().zip(v) {
        *o += a * x.to_f32();
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
            n_blocks: 8,
        });
        let seq = kv.new_seq();
        let n = 11;
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
        ] {
            let range = visible_range(pos, window);
            let mut out = vec![0.0; dv];
            attend_head(
                &kv,
                0,
                kv.seq_blocks(seq).unwrap(),
                0,
                &q,
                range,
                0.5,
                &mut out,
            );
            let scores: Vec<f64> = (range.0..range.1)
                .map(|p| 0.5 * (0..dk).map(|d| (q[d] * key(p, d)) as f64).sum::<f64>())
                .collect();
            let m = scores.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            for d in 0..dv {
                let want: f64 = (range.0..range.1)
                    .zip(&scores)
                    .map(|(p, s)| (s - m).exp() / z * val(p, d) as f64)
                    .sum();
                assert!(
                    (out[d] as f64 - want).abs() < 1e-5,
                    "pos {pos} window {window:?}"
                );
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
