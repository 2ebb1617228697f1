//! Attention of one query head over a sequence's paged KV cache, with an online softmax: the
//! scores of one block at a time, rescaling the running sum and output when the maximum grows,
//! so no n×n score matrix is ever built.

use half::f16;

use crate::kernels::expf_libm::expf_libm_in_place;
use crate::kernels::f16 as f16k;
use crate::kernels::{ops, tile};
use crate::kv_cache::{BlockId, KvCache, KvType};
use crate::quant::{quantize_row_act, vec_dot, vec_dot_type};

/// The keys a query at position `pos` may see: `[start, pos]`, causal, limited to the last
/// `window` positions when the layer has a sliding window.
pub fn visible_range(pos: usize, window: Option<usize>) -> (usize, usize) {
    let start = match window {
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    };
    (start, pos + 1)
}

/// How a raw q·k becomes an attention score: times the scale, then, with a soft cap (Gemma 2),
/// `cap · tanh(·)`, as llama.cpp's flash attention does it (it divides the scale by the cap
/// first, so the tanh sees `q·k · (scale / cap)`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreScale {
    scale: f32,
    /// 0 for none.
    softcap: f32,
}

impl ScoreScale {
    pub fn new(scale: f32, softcap: Option<f32>) -> ScoreScale {
        match softcap {
            Some(cap) => ScoreScale {
                scale: scale / cap,
                softcap: cap,
            },
            None => ScoreScale {
                scale,
                softcap: 0.0,
            },
        }
    }

    #[inline]
    pub fn score(self, dot: f32) -> f32 {
        let s = dot * self.scale;
        if self.softcap != 0.0 {
            self.softcap * s.tanh()
        } else {
            s
        }
    }
}

impl From<f32> for ScoreScale {
    fn from(scale: f32) -> ScoreScale {
        ScoreScale::new(scale, None)
    }
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
    scale: ScoreScale,
    out: &mut [f32],
) {
    let cfg = kv.config();
    if cfg.ty != KvType::F16 {
        return attend_head_blocks(kv, layer, blocks, kv_head, q, (start, end), scale, out);
    }
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
            let s = scale.score(f16k::dot_f16(q16, k));
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

/// [`attend_head`] for several heads that share KV head `kv_head` (`qs[h]` into `outs[h]`),
/// each with [`attend_head`]'s arithmetic and so its bits: every key and value row is read and
/// widened once for all of them. Over a quantized cache, one head at a time.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(
    kv: &KvCache,
    layer: usize,
    blocks: &[BlockId],
    kv_head: usize,
    qs: &[&[f32]],
    range: (usize, usize),
    scale: ScoreScale,
    outs: &mut [&mut [f32]],
) {
    assert_eq!(qs.len(), outs.len());
    let cfg = kv.config();
    if cfg.ty != KvType::F16 || qs.len() == 1 {
        for (q, out) in qs.iter().zip(outs.iter_mut()) {
            attend_head(kv, layer, blocks, kv_head, q, range, scale, out);
        }
        return;
    }
    let (start, end) = range;
    let (bs, dk, dv) = (cfg.block_size, cfg.head_dim_k, cfg.head_dim_v);
    let nh = qs.len();
    // Each query rounded to f16 as `attend_head` rounds it, then widened for the dots.
    let qw: Vec<Vec<f32>> = qs
        .iter()
        .map(|q| q[..dk].iter().map(|&x| f16::from_f32(x).to_f32()).collect())
        .collect();
    let mut accs = vec![f16::ZERO; nh * dv];
    let (mut max, mut sum) = (vec![f32::NEG_INFINITY; nh], vec![0f32; nh]);
    let mut key = vec![0f32; dk];
    const GROUP: usize = f16k::MANY_ROWS;
    // Per key of a group and head (key-major): the score, whether it raises the head's
    // maximum, and the exponent (in lanes of four: the padding computes e^0).
    let mut scores = vec![0f32; GROUP * nh];
    let mut grows = vec![false; GROUP * nh];
    let mut exps = vec![0f32; (GROUP * nh).div_ceil(4) * 4];
    let mut run_max = vec![0f32; nh];
    let none = f16k::AccStep {
        rescale: None,
        weight: 0.0,
    };
    let mut steps = vec![[none; GROUP]; nh];
    let mut pos = start;
    while pos < end {
        let g = GROUP.min(end - pos);
        let mut values: [&[f16]; GROUP] = [&[]; GROUP];
        for i in 0..g {
            let (block, slot) = (blocks[(pos + i) / bs], (pos + i) % bs);
            let k = &kv.block_keys(layer, block, kv_head)[slot * dk..(slot + 1) * dk];
            tile::widen_f16(&mut key, k);
            for h in 0..nh {
                scores[i * nh + h] = scale.score(f16k::dot_f16_widened(&qw[h], &key));
            }
            values[i] = &kv.block_values(layer, block, kv_head)[slot * dv..(slot + 1) * dv];
        }
        // As in `attend_head`, key by key for each head: the exponent is of the old maximum
        // less the score where the score is the new maximum, else of the score less the
        // maximum (which depends on the scores alone); then every exponent of the group through
        // the library's expf at once, and the updates in order.
        run_max.copy_from_slice(&max);
        for i in 0..g {
            for h in 0..nh {
                let (s, m) = (scores[i * nh + h], &mut run_max[h]);
                grows[i * nh + h] = s > *m;
                exps[i * nh + h] = if s > *m { *m - s } else { s - *m };
                if s > *m {
                    *m = s;
                }
            }
        }
        exps[g * nh..].fill(0.0);
        expf_libm_in_place(&mut exps);
        for i in 0..g {
            for h in 0..nh {
                let e = exps[i * nh + h];
                let (ms, vs) = if grows[i * nh + h] {
                    max[h] = scores[i * nh + h];
                    steps[h][i].rescale = Some(e);
                    (e, 1.0)
                } else {
                    steps[h][i].rescale = None;
                    (1.0, e)
                };
                steps[h][i].weight = vs;
                sum[h] = sum[h].mul_add(ms, vs);
            }
        }
        f16k::acc_steps_f16_many(&mut accs, dv, &values[..g], &steps);
        pos += g;
    }
    for h in 0..nh {
        let inv = 1.0 / sum[h];
        for (o, a) in outs[h][..dv].iter_mut().zip(&accs[h * dv..(h + 1) * dv]) {
            *o = a.to_f32() * inv;
        }
    }
}

/// [`attend_head`] over a quantized cache (Q8_0/Q4_0 keys and values), with the arithmetic of
/// llama.cpp's flash-attention decode path for such a cache: the query quantized to Q8_0 once
/// and each key scored with the type's integer dot product, each value row converted to f32
/// and folded into an f32 accumulator (rescaled when the maximum grows). Keys and values are
/// read in their blocks, one row at a time: no dequantized copy of the cache.
#[allow(clippy::too_many_arguments)]
fn attend_head_blocks(
    kv: &KvCache,
    layer: usize,
    blocks: &[BlockId],
    kv_head: usize,
    q: &[f32],
    (start, end): (usize, usize),
    scale: ScoreScale,
    out: &mut [f32],
) {
    let cfg = kv.config();
    let (bs, dk, dv) = (cfg.block_size, cfg.head_dim_k, cfg.head_dim_v);
    debug_assert!(dk <= 512 && dv <= 512);
    let ty = cfg.ty.ggml();
    // Q8_0: 34 bytes per 32 values.
    let mut q8 = [0u8; 512 / 32 * 34];
    let q8 = &mut q8[..dk / 32 * 34];
    quantize_row_act(vec_dot_type(ty), &q[..dk], q8);
    let mut acc = [0f32; 512];
    let acc = &mut acc[..dv];
    let mut value = [0f32; 512];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    for pos in start..end {
        let (block, slot) = (blocks[pos / bs], pos % bs);
        let s = scale.score(vec_dot(
            ty,
            kv.key_blocks(layer, block, kv_head, slot),
            q8,
            dk,
        ));
        let (ms, vs) = if s > max {
            let ms = (max - s).exp();
            max = s;
            acc.iter_mut().for_each(|a| *a *= ms);
            (ms, 1.0)
        } else {
            (1.0, (s - max).exp())
        };
        kv.read_value(layer, block, kv_head, slot, &mut value);
        for (a, &v) in acc.iter_mut().zip(&value[..dv]) {
            *a = v.mul_add(vs, *a);
        }
        sum = sum.mul_add(ms, vs);
    }
    let inv = 1.0 / sum;
    for (o, a) in out[..dv].iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
}

/// Queries of one sequence in a batch of 64 or more, from which llama.cpp switches to its tiled
/// flash attention (`ggml_fa_tile_config::Q`).
pub const TILED_MIN_BATCH: usize = 64;
/// Keys per tile of llama.cpp's tiled flash attention; tiles start at multiples of it.
const KEY_TILE: usize = 64;

/// Attention of queries of one sequence and KV head (up to [`tile::QUERY_LANES`] positions of
/// each of the heads that share the KV head) with the arithmetic of llama.cpp's tiled flash
/// attention, which it uses for batches of [`TILED_MIN_BATCH`] or more queries: f32 queries and
/// accumulators, keys in tiles of 64 positions (from position 0), per tile the scores as chains
/// of FMAs, the tile's maximum, a rescale when it grows, ggml's SIMD `expf` and a sum per 16
/// scores, and the values folded in by chains of FMAs. `ranges[l]` are the positions query `l`
/// sees; `out[l]` receives its output.
///
/// Every query's arithmetic is its own, whatever else is in the call: the queries only share
/// the work of reading the tile (its keys and values widened to f32 once for all the heads of
/// the KV head, its values read once per [`tile::MAD_QUERIES`] queries).
#[allow(clippy::too_many_arguments)]
pub fn attend_tiled(
    kv: &KvCache,
    layer: usize,
    blocks: &[BlockId],
    kv_head: usize,
    queries: &[&[f32]],
    ranges: &[(usize, usize)],
    scale: ScoreScale,
    out: &mut [&mut [f32]],
) {
    const LANES: usize = tile::QUERY_LANES;
    let cfg = kv.config();
    let (bs, dk, dv) = (cfg.block_size, cfg.head_dim_k, cfg.head_dim_v);
    let nq = queries.len();
    assert!(nq >= 1 && ranges.len() == nq && out.len() == nq);
    // Queries transposed, eight to a lane chunk: element d of query c·8 + l at
    // qt[c][d · 8 + l].
    let chunks = nq.div_ceil(LANES);
    let mut qt = vec![0f32; chunks * dk * LANES];
    for (i, q) in queries.iter().enumerate() {
        let (c, l) = (i / LANES, i % LANES);
        for d in 0..dk {
            qt[c * dk * LANES + d * LANES + l] = q[d];
        }
    }
    let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let (mut max, mut sum) = (vec![f32::NEG_INFINITY; nq], vec![0f32; nq]);
    let mut acc = vec![0f32; nq * dv];
    let mut keys = vec![0f32; KEY_TILE * dk];
    let mut values = vec![0f32; KEY_TILE * dv];
    let mut scores = vec![[0f32; LANES]; KEY_TILE * chunks];
    // Each query's weights for the tile, and the queries that see some key of it.
    let mut weights = vec![[0f32; KEY_TILE]; nq];
    let mut seeing: Vec<usize> = Vec::with_capacity(nq);
    let mut tile_start = lo / KEY_TILE * KEY_TILE;
    while tile_start < hi {
        // The keys of this tile that some query sees.
        let (k0, k1) = (tile_start.max(lo), (tile_start + KEY_TILE).min(hi));
        let nk = k1 - k0;
        for p in k0..k1 {
            let (block, slot) = (blocks[p / bs], p % bs);
            let r = p - k0;
            tile::widen_f16(
                &mut keys[r * dk..(r + 1) * dk],
                &kv.block_keys(layer, block, kv_head)[slot * dk..(slot + 1) * dk],
            );
            tile::widen_f16(
                &mut values[r * dv..(r + 1) * dv],
                &kv.block_values(layer, block, kv_head)[slot * dv..(slot + 1) * dv],
            );
        }
        // Chunks of queries two at a time (each key element broadcast once for both).
        let chunk_q = |c: usize| &qt[c * dk * LANES..(c + 1) * dk * LANES];
        for (pair, out) in scores.chunks_mut(2 * KEY_TILE).enumerate() {
            let c = 2 * pair;
            if out.len() == 2 * KEY_TILE {
                let (out0, out1) = out.split_at_mut(KEY_TILE);
                let (k, o0, o1) = (&keys[..nk * dk], &mut out0[..nk], &mut out1[..nk]);
                tile::dot_keys_pair(chunk_q(c), chunk_q(c + 1), k, dk, o0, o1);
            } else {
                tile::dot_keys(chunk_q(c), &keys[..nk * dk], dk, &mut out[..nk]);
            }
        }
        seeing.clear();
        for l in 0..nq {
            let (start, end) = ranges[l];
            let scores = &scores[l / LANES * KEY_TILE..];
            // The query's row of the tile: scaled scores, −∞ where masked.
            let row = &mut weights[l];
            row.fill(f32::NEG_INFINITY);
            for p in k0.max(start)..k1.min(end) {
                row[p - tile_start] = scale.score(scores[p - k0][l % LANES]);
            }
            let tile_max = row
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| if m > x { m } else { x });
            if tile_max == f32::NEG_INFINITY {
                continue;
            }
            let acc_l = &mut acc[l * dv..(l + 1) * dv];
            let new_max = max[l].max(tile_max);
            if new_max > max[l] {
                let ms = (max[l] - new_max).exp();
                acc_l.iter_mut().for_each(|a| *a *= ms);
                sum[l] *= ms;
            }
            max[l] = new_max;
            row.iter_mut().for_each(|x| *x -= new_max);
            ops::expf_ggml_in_place(row);
            let tile_sum: f64 = row
                .chunks_exact(16)
                .map(|g| reduce_add_16(g.try_into().expect("16 lanes")) as f64)
                .sum();
            sum[l] = (sum[l] as f64 + tile_sum) as f32;
            seeing.push(l);
        }
        // The values folded into the accumulators of the queries that see the tile.
        let (w0, w1) = (k0 - tile_start, k1 - tile_start);
        for group in seeing.chunks(tile::MAD_QUERIES) {
            let ws: Vec<&[f32]> = group.iter().map(|&l| &weights[l][w0..w1]).collect();
            let mut accs: Vec<&mut [f32]> = Vec::with_capacity(group.len());
            let mut rest = &mut acc[..];
            let mut at = 0;
            for &l in group {
                // `group` is increasing: split off up to query l's accumulator.
                let (_, tail) = std::mem::take(&mut rest).split_at_mut((l - at) * dv);
                let (acc_l, tail) = tail.split_at_mut(dv);
                accs.push(acc_l);
                rest = tail;
                at = l + 1;
            }
            tile::mad_rows_many(&mut accs, &values[..nk * dv], &ws);
        }
        tile_start += KEY_TILE;
    }
    for (l, o) in out.iter_mut().enumerate() {
        let inv = if sum[l] == 0.0 { 0.0 } else { 1.0 / sum[l] };
        for (o, a) in o[..dv].iter_mut().zip(&acc[l * dv..(l + 1) * dv]) {
            *o = a * inv;
        }
    }
}

/// `_mm512_reduce_add_ps` as GCC defines it: upper 8 lanes + lower 8, upper 4 + lower 4, then
/// (0+2) + (1+3).
fn reduce_add_16(a: &[f32; 16]) -> f32 {
    let t8: [f32; 8] = std::array::from_fn(|l| a[8 + l] + a[l]);
    let t4: [f32; 4] = std::array::from_fn(|l| t8[4 + l] + t8[l]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::{KvConfig, SeqId};

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
        let mut outs = vec![vec![0f32; DV]; CASES.len()];
        let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        attend_tiled(
            &kv,
            0,
            blocks,
            0,
            &queries,
            &ranges,
            0.3.into(),
            &mut out_refs,
        );
        for (i, out) in outs.iter().enumerate() {
            for (got, want) in out.iter().zip(direct_attention(&qs[i], ranges[i], 0.3)) {
                assert!(
                    (*got as f64 - want).abs() < 1e-5,
                    "case {i}: {got} vs {want}"
                );
            }
        }
        let mut alone = vec![0f32; DV];
        attend_tiled(
            &kv,
            0,
            blocks,
            0,
            &queries[3..4],
            &ranges[3..4],
            0.3.into(),
            &mut [&mut alone],
        );
        assert_eq!(alone, outs[3]);
    }

    /// Many queries in one call (the heads sharing a KV head: more than one chunk of lanes,
    /// values folded in for several queries at once) get the bits each gets alone.
    #[test]
    fn tiled_queries_get_their_own_bits_in_any_company() {
        let (kv, seq) = filled_cache(300);
        let blocks = kv.seq_blocks(seq).unwrap();
        let n = 21;
        let qs: Vec<Vec<f32>> = (0..n).map(query).collect();
        let queries: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
        let ranges: Vec<(usize, usize)> = (0..n)
            .map(|i| {
                let (p, w) = CASES[i % CASES.len()];
                visible_range(p, w)
            })
            .collect();
        let mut outs = vec![vec![0f32; DV]; n];
        let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
        attend_tiled(
            &kv,
            0,
            blocks,
            0,
            &queries,
            &ranges,
            0.3.into(),
            &mut out_refs,
        );
        for i in 0..n {
            let mut alone = vec![0f32; DV];
            let (q, r) = (&queries[i..i + 1], &ranges[i..i + 1]);
            attend_tiled(&kv, 0, blocks, 0, q, r, 0.3.into(), &mut [&mut alone]);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&alone), bits(&outs[i]), "query {i}");
            for (got, want) in alone.iter().zip(direct_attention(&qs[i], ranges[i], 0.3)) {
                assert!(
                    (*got as f64 - want).abs() < 1e-5,
                    "query {i}: {got} vs {want}"
                );
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
                let mut out_refs: Vec<&mut [f32]> =
                    outs.iter_mut().map(|o| o.as_mut_slice()).collect();
                attend_heads(&kv, 0, blocks, 0, &q_refs, range, scale, &mut out_refs);
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
        let mut tiled = vec![vec![0f32; DV]; CASES.len()];
        let queries: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
        let mut tiled_refs: Vec<&mut [f32]> = tiled.iter_mut().map(|o| o.as_mut_slice()).collect();
        attend_tiled(
            &kv,
            0,
            blocks,
            0,
            &queries,
            &ranges,
            capped,
            &mut tiled_refs,
        );
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
            let softmax =
                |q: &[f32],
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
}
