//! llama.cpp's tiled flash attention, which it uses from 64 queries per micro-batch: f32
//! queries and accumulators, keys in tiles of 64 positions, the scores as chains of FMAs.

use super::{apply_sink, ScoreScale};
use crate::kernels::{ops, tile};
use crate::kv_cache::{BlockId, KvCache};

/// Queries of one sequence in a batch of 64 or more, from which llama.cpp switches to its tiled
/// flash attention (`ggml_fa_tile_config::Q`).
pub const TILED_MIN_BATCH: usize = 64;
/// Keys per tile of llama.cpp's tiled flash attention; tiles start at multiples of it.
const KEY_TILE: usize = 64;
/// Queries per chunk: the lanes of the scores and of the weights.
const LANES: usize = tile::QUERY_LANES;
/// Calls with fewer queries take the scores with the keys as the lanes.
const TRANSPOSED_MAX_QUERIES: usize = 4;

/// Attention of queries of one sequence and KV head (a unit of positions, up to 32, of each of
/// the heads that share the KV head) with the arithmetic of llama.cpp's tiled flash
/// attention, which it uses for batches of [`TILED_MIN_BATCH`] or more queries: f32 queries and
/// accumulators, keys in tiles of 64 positions (from position 0), per tile the scores as chains
/// of FMAs, the tile's maximum, a rescale when it grows, ggml's SIMD `expf` and a sum per 16
/// scores, and the values folded in by chains of FMAs. `ranges[l]` are the positions query `l`
/// sees; `out[l]` receives its output; `sinks[l]`, when given, is its attention sink
/// ([`apply_sink`]).
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
    (scale, sinks): (ScoreScale, Option<&[f32]>),
    out: &mut [&mut [f32]],
) {
    let cfg = kv.config();
    let (dk, dv) = (cfg.head_dim_k, cfg.head_dim_v);
    let nq = queries.len();
    assert!(nq >= 1 && ranges.len() == nq && out.len() == nq);
    // A few queries (a decode step's part of a KV head's heads): the keys are stored transposed
    // and each query's scores computed with the keys as the lanes, the same chains
    // (`tile::dot_keys_transposed`), so the work is per query, not per chunk of eight. The
    // transposition costs about what four queries' scores do, so from four queries on the
    // queries are the lanes.
    let transposed = nq < TRANSPOSED_MAX_QUERIES;
    // One chunk of queries on 512-bit vectors (a decode step): the keys widened in pairs, each
    // fused multiply-add serving two keys (`tile::dot_key_pairs`).
    let paired = !transposed && nq <= LANES && tile::key_pairs_fast();
    // Otherwise the queries transposed, eight to a lane chunk: element d of query c·8 + l at
    // qt[c][d · 8 + l].
    let chunks = nq.div_ceil(LANES);
    let qt = if transposed {
        Vec::new()
    } else {
        transpose_queries(queries, dk)
    };
    let lo = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let hi = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let (mut max, mut sum) = (vec![f32::NEG_INFINITY; nq], vec![0f32; nq]);
    let mut acc = vec![0f32; nq * dv];
    let mut keys = vec![0f32; KEY_TILE * dk];
    let mut values = vec![0f32; KEY_TILE * dv];
    let mut scores = vec![[0f32; LANES]; KEY_TILE * chunks];
    // Each query's weights for the tile (row r: key tile_start + r, a chunk's queries side by
    // side as its scores are), and the queries that see some key of it.
    let mut weights = vec![[[0f32; LANES]; KEY_TILE]; chunks];
    let mut seeing: Vec<usize> = Vec::with_capacity(nq);
    let mut tile_start = lo / KEY_TILE * KEY_TILE;
    while tile_start < hi {
        // The keys of this tile that some query sees.
        let (k0, k1) = (tile_start.max(lo), (tile_start + KEY_TILE).min(hi));
        let nk = k1 - k0;
        let tile_keys = TileKeys {
            kv,
            at: (layer, kv_head),
            blocks,
            keys: (k0, k1),
        };
        let bufs = (&mut keys[..], &mut values[..], &mut scores[..]);
        read_and_score(&tile_keys, (transposed, paired), (queries, &qt), bufs);
        seeing.clear();
        for c in 0..chunks {
            let ls = c * LANES..((c + 1) * LANES).min(nq);
            let state = ChunkState {
                first: ls.start,
                max: &mut max[ls.clone()],
                sum: &mut sum[ls.clone()],
                acc: &mut acc[ls.start * dv..ls.end * dv],
                weights: &mut weights[c],
                seeing: &mut seeing,
            };
            let lanes = &scores[c * KEY_TILE..(c + 1) * KEY_TILE];
            chunk_weights(lanes, &ranges[ls], (tile_start, k0, k1), scale, state);
        }
        // The values folded into the accumulators of the queries that see the tile.
        let w = (k0 - tile_start, k1 - tile_start);
        fold_values(&seeing, &weights, w, &values[..nk * dv], &mut acc, dv);
        tile_start += KEY_TILE;
    }
    finish(out, &mut acc, &max, &mut sum, sinks, dv);
}

/// A tile's keys `keys.0..keys.1` of one KV head (`at`: layer and head) in the cache.
struct TileKeys<'a> {
    kv: &'a KvCache,
    at: (usize, usize),
    blocks: &'a [BlockId],
    keys: (usize, usize),
}

/// The tile's values widened into `values`, its keys into `keys` as the scoring reads them
/// (`transposed`, `paired` or in rows), and every query's scores into `scores` (as
/// [`score_tile`] writes them). Its blocks are looked up once and its rows widened a block's
/// run at a time: a decode step's rows are short, and a lookup per row cost about what
/// widening the row did.
fn read_and_score(
    t: &TileKeys,
    (transposed, paired): (bool, bool),
    (queries, qt): (&[&[f32]], &[f32]),
    (keys, values, scores): (&mut [f32], &mut [f32], &mut [[f32; LANES]]),
) {
    let cfg = t.kv.config();
    let (bs, dk, dv) = (cfg.block_size, cfg.head_dim_k, cfg.head_dim_v);
    let ((layer, kv_head), (k0, k1)) = (t.at, t.keys);
    let (nk, b0) = (k1 - k0, k0 / bs);
    let mut key_blocks: [&[half::f16]; KEY_TILE + 1] = [&[]; KEY_TILE + 1];
    let mut value_blocks: [&[half::f16]; KEY_TILE + 1] = [&[]; KEY_TILE + 1];
    for (i, &block) in t.blocks[b0..k1.div_ceil(bs)].iter().enumerate() {
        key_blocks[i] = t.kv.block_keys(layer, block, kv_head);
        value_blocks[i] = t.kv.block_values(layer, block, kv_head);
    }
    let key_row = |p: usize| {
        let slot = p % bs;
        &key_blocks[p / bs - b0][slot * dk..(slot + 1) * dk]
    };
    // Rows k0..k1 a block's run at a time, whose rows lie side by side.
    let mut p = k0;
    while p < k1 {
        let (slot, n, b, r) = (p % bs, (bs - p % bs).min(k1 - p), p / bs - b0, p - k0);
        if !transposed && !paired {
            let rows = &key_blocks[b][slot * dk..(slot + n) * dk];
            tile::widen_f16(&mut keys[r * dk..(r + n) * dk], rows);
        }
        let rows = &value_blocks[b][slot * dv..(slot + n) * dv];
        tile::widen_f16(&mut values[r * dv..(r + n) * dv], rows);
        p += n;
    }
    if transposed {
        // Eight keys at a time; past the tile's last key, repeats of it (their scores are
        // never read).
        const T: usize = tile::TRANSPOSE_KEYS;
        for r0 in (0..nk).step_by(T) {
            let rows: [&[half::f16]; T] =
                std::array::from_fn(|j| key_row(k0 + (r0 + j).min(nk - 1)));
            tile::widen_f16_transposed(keys, KEY_TILE, r0, &rows, dk);
        }
    }
    if paired {
        // Keys 2i and 2i + 1 side by side; an odd last key with itself.
        let mut rows: [&[half::f16]; KEY_TILE] = [&[]; KEY_TILE];
        for (r, row) in rows[..nk].iter_mut().enumerate() {
            *row = key_row(k0 + r);
        }
        tile::widen_f16_pairs(keys, &rows[..nk], dk);
        let pairs = &keys[..nk.div_ceil(2) * 2 * dk];
        tile::dot_key_pairs(qt, pairs, dk, &mut scores[..nk]);
    } else {
        let by_lanes = (!transposed).then_some(qt);
        score_tile(queries, by_lanes, keys, (nk, dk), scores);
    }
}

/// The scores of a tile's first `nk` keys for every query, into `scores` (`KEY_TILE` rows per
/// chunk of [`tile::QUERY_LANES`] queries, a query's in its lane): from `keys` transposed
/// (`qt` is `None`: each query alone), or from `keys` row by row and the queries transposed in
/// `qt`, chunks two at a time (each key element broadcast once for both).
fn score_tile(
    queries: &[&[f32]],
    qt: Option<&[f32]>,
    keys: &[f32],
    (nk, dk): (usize, usize),
    scores: &mut [[f32; LANES]],
) {
    let Some(qt) = qt else {
        let mut query_scores = [0f32; KEY_TILE];
        for (l, q) in queries.iter().enumerate() {
            tile::dot_keys_transposed(&q[..dk], keys, KEY_TILE, &mut query_scores[..nk]);
            for (r, &s) in query_scores[..nk].iter().enumerate() {
                scores[r][l] = s;
            }
        }
        return;
    };
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
}

/// The tile's values, weighted by rows `w0..w1` of each query's lane of `weights` (a chunk's
/// per [`LANES`] queries), folded into the accumulators of the
/// queries `seeing` (increasing), [`tile::MAD_QUERIES`] at a time.
fn fold_values(
    seeing: &[usize],
    weights: &[[[f32; LANES]; KEY_TILE]],
    (w0, w1): (usize, usize),
    values: &[f32],
    acc: &mut [f32],
    dv: usize,
) {
    for group in seeing.chunks(tile::MAD_QUERIES) {
        let ws: Vec<&[f32]> = group
            .iter()
            .map(|&l| &weights[l / LANES].as_flattened()[w0 * LANES + l % LANES..w1 * LANES])
            .collect();
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
        tile::mad_rows_many(&mut accs, values, &ws, LANES);
    }
}

/// Each query's output: its accumulator over its sum, after its sink ([`apply_sink`]).
fn finish(
    out: &mut [&mut [f32]],
    acc: &mut [f32],
    max: &[f32],
    sum: &mut [f32],
    sinks: Option<&[f32]>,
    dv: usize,
) {
    for (l, o) in out.iter_mut().enumerate() {
        if let Some(s) = sinks {
            sum[l] = apply_sink(s[l], max[l], sum[l], &mut acc[l * dv..(l + 1) * dv]);
        }
        let inv = if sum[l] == 0.0 { 0.0 } else { 1.0 / sum[l] };
        for (o, a) in o[..dv].iter_mut().zip(&acc[l * dv..(l + 1) * dv]) {
            *o = a * inv;
        }
    }
}

/// The queries transposed, eight to a lane chunk: element d of query c·8 + l at
/// `qt[c·dk·8 + d·8 + l]`.
fn transpose_queries(queries: &[&[f32]], dk: usize) -> Vec<f32> {
    let mut qt = vec![0f32; queries.len().div_ceil(LANES) * dk * LANES];
    for (i, q) in queries.iter().enumerate() {
        let (c, l) = (i / LANES, i % LANES);
        for d in 0..dk {
            qt[c * dk * LANES + d * LANES + l] = q[d];
        }
    }
    qt
}

/// What [`chunk_weights`] updates for a chunk's queries (from query `first` on): each one's
/// running maximum, sum and accumulator, their weights for the tile (a query's in its lane),
/// and the list of queries that see some key of it.
struct ChunkState<'a> {
    first: usize,
    max: &'a mut [f32],
    sum: &'a mut [f32],
    acc: &'a mut [f32],
    weights: &'a mut [[f32; LANES]; KEY_TILE],
    seeing: &'a mut Vec<usize>,
}

/// The weights of a chunk's queries (up to eight, `ranges` the positions each sees) for the
/// tile of keys `k0..k1` (starting at `tile_start`) from the chunk's scores (row `r`: key
/// `k0 + r`, a query's in its lane): per query, its scaled scores, −∞ where masked, the tile's
/// maximum, its online-softmax step (rescaling its accumulator and sum when the maximum grows,
/// ggml's SIMD `expf`, the tile's sum in groups of 16 as `_mm512_reduce_add_ps` adds them).
/// From [`LANES_FROM`] queries the queries are the lanes, every step one query's own
/// arithmetic done for eight at once (one query at a time, these steps took 6 % of a 1.5B's
/// 2048-token prompt); fewer take them one at a time. The same bits either way
/// (`chunks_weigh_as_one_query_at_a_time`), so whatever the company.
fn chunk_weights(
    scores: &[[f32; LANES]],
    ranges: &[(usize, usize)],
    tile: (usize, usize, usize),
    scale: ScoreScale,
    state: ChunkState,
) {
    if ranges.len() < LANES_FROM {
        return each_query_weights(scores, ranges, tile, scale, state);
    }
    in_lanes(scores, ranges, tile, scale, state)
}

/// Chunks of fewer queries take their steps one query at a time (a decode step's few heads
/// of a KV head): the lanes cost what four or five queries do alone (`weights_speed`,
/// 2026-12-07: 349–365 ns a full tile in lanes for one to eight queries, 79 ns a query alone).
const LANES_FROM: usize = 5;

/// [`chunk_weights`] one query at a time ([`one_query_weights`]), each query's weights then
/// put in its lane: the same bits.
fn each_query_weights(
    scores: &[[f32; LANES]],
    ranges: &[(usize, usize)],
    (tile_start, k0, k1): (usize, usize, usize),
    scale: ScoreScale,
    st: ChunkState,
) {
    let dv = st.acc.len() / ranges.len().max(1);
    for (l, &range) in ranges.iter().enumerate() {
        let mut row = [0f32; KEY_TILE];
        let state = (
            &mut st.max[l],
            &mut st.sum[l],
            &mut st.acc[l * dv..(l + 1) * dv],
        );
        let tile = (tile_start, k0, k1);
        if one_query_weights((scores, l), range, tile, scale, &mut row, state) {
            st.seeing.push(st.first + l);
            for (w, &x) in st
                .weights
                .iter_mut()
                .zip(&row)
                .take(k1 - tile_start)
                .skip(k0 - tile_start)
            {
                w[l] = x;
            }
        }
    }
}

/// [`chunk_weights`] with the queries as the lanes.
fn in_lanes(
    scores: &[[f32; LANES]],
    ranges: &[(usize, usize)],
    tile: (usize, usize, usize),
    scale: ScoreScale,
    state: ChunkState,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_level() != crate::quant::SimdLevel::Scalar {
        // SAFETY: every non-scalar dispatch level has AVX2 and FMA.
        return unsafe { chunk_weights_avx2(scores, ranges, tile, scale, state) };
    }
    chunk_weights_lanes(scores, ranges, tile, scale, state)
}

/// [`chunk_weights_lanes`] compiled for AVX2 (its loops over the lanes become vectors).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk_weights_avx2(
    scores: &[[f32; LANES]],
    ranges: &[(usize, usize)],
    tile: (usize, usize, usize),
    scale: ScoreScale,
    state: ChunkState,
) {
    chunk_weights_lanes(scores, ranges, tile, scale, state)
}

/// [`chunk_weights`]' steps, lane by lane in plain code (IEEE operations, none fused).
#[inline(always)]
fn chunk_weights_lanes(
    scores: &[[f32; LANES]],
    ranges: &[(usize, usize)],
    (tile_start, k0, k1): (usize, usize, usize),
    scale: ScoreScale,
    st: ChunkState,
) {
    let row = st.weights;
    // The tile's rows each query sees (none: an empty span), as lanes of i32 for compares.
    let (mut from, mut to) = ([0i32; LANES], [0i32; LANES]);
    for l in 0..ranges.len() {
        let (start, end) = ranges[l];
        let (s0, s1) = (k0.max(start), k1.min(end));
        if s0 < s1 {
            (from[l], to[l]) = ((s0 - tile_start) as i32, (s1 - tile_start) as i32);
        }
    }
    let (r0, r1) = (k0 - tile_start, k1 - tile_start);
    row[..r0].fill([f32::NEG_INFINITY; LANES]);
    row[r1..].fill([f32::NEG_INFINITY; LANES]);
    // A masked weight is e^−∞ = 0; the lanes past the chunk's queries hold 0 instead, never
    // read, as e^x takes a slow path for −∞.
    let masked: [f32; LANES] = std::array::from_fn(|l| {
        if l < ranges.len() {
            f32::NEG_INFINITY
        } else {
            0.0
        }
    });
    for (r, out) in row.iter_mut().enumerate().take(r1).skip(r0) {
        let s = &scores[r - r0];
        let x: [f32; LANES] = match scale.plain_factor() {
            Some(factor) => std::array::from_fn(|l| s[l] * factor),
            None => std::array::from_fn(|l| scale.score(s[l])),
        };
        let r = r as i32;
        for l in 0..LANES {
            out[l] = if from[l] <= r && r < to[l] {
                x[l]
            } else {
                masked[l]
            };
        }
    }
    let tile_max = lane_max(row);
    // Per query: the maximum, a rescale where it grows; each lane's scores then less it.
    let mut less = [0f32; LANES];
    let mut sees = [false; LANES];
    for l in 0..ranges.len() {
        if tile_max[l] == f32::NEG_INFINITY {
            continue;
        }
        sees[l] = true;
        st.seeing.push(st.first + l);
        let new_max = st.max[l].max(tile_max[l]);
        if new_max > st.max[l] {
            let ms = (st.max[l] - new_max).exp();
            let dv = st.acc.len() / ranges.len();
            st.acc[l * dv..(l + 1) * dv]
                .iter_mut()
                .for_each(|a| *a *= ms);
            st.sum[l] *= ms;
        }
        st.max[l] = new_max;
        less[l] = new_max;
    }
    // Rows of keys no query sees weigh 0 (e^−∞), without e^x.
    row[..r0].fill([0.0; LANES]);
    row[r1..].fill([0.0; LANES]);
    for v in row[r0..r1].iter_mut() {
        for l in 0..LANES {
            v[l] -= less[l];
        }
    }
    ops::expf_ggml_in_place(row[r0..r1].as_flattened_mut());
    let groups = group_sums(row);
    for l in (0..ranges.len()).filter(|&l| sees[l]) {
        let tile_sum: f64 = groups.iter().map(|g| g[l] as f64).sum();
        st.sum[l] = (st.sum[l] as f64 + tile_sum) as f32;
    }
}

/// Each lane's largest weight of the tile (−∞ where all are masked), in four running maxima
/// folded at the end. The maximum of numbers does not depend on their order (with a NaN among
/// them, no maximum is meaningful, and every path takes this same order).
#[inline(always)]
fn lane_max(row: &[[f32; LANES]; KEY_TILE]) -> [f32; LANES] {
    let mut m = [[f32::NEG_INFINITY; LANES]; 4];
    for rows in row.chunks_exact(4) {
        for (m, v) in m.iter_mut().zip(rows) {
            for l in 0..LANES {
                m[l] = if m[l] > v[l] { m[l] } else { v[l] };
            }
        }
    }
    let pick = |a: f32, b: f32| if a > b { a } else { b };
    std::array::from_fn(|l| pick(pick(m[0][l], m[1][l]), pick(m[2][l], m[3][l])))
}

/// Each lane's sums of its weights in the tile's four groups of 16 (keys), each as GCC's
/// `_mm512_reduce_add_ps` adds a group: upper 8 + lower 8, upper 4 + lower 4, then
/// (0+2) + (1+3).
#[inline(always)]
fn group_sums(row: &[[f32; LANES]; KEY_TILE]) -> [[f32; LANES]; KEY_TILE / 16] {
    std::array::from_fn(|g| {
        let a = &row[16 * g..16 * (g + 1)];
        let t8: [[f32; LANES]; 8] = std::array::from_fn(|i| add(a[8 + i], a[i]));
        let t4: [[f32; LANES]; 4] = std::array::from_fn(|i| add(t8[4 + i], t8[i]));
        add(add(t4[0], t4[2]), add(t4[1], t4[3]))
    })
}

#[inline(always)]
fn add(a: [f32; LANES], b: [f32; LANES]) -> [f32; LANES] {
    std::array::from_fn(|l| a[l] + b[l])
}

/// One query's weights for the tile of keys `k0..k1` (starting at `tile_start`) from its lane
/// of the tile's scores: scaled scores, −∞ where masked, and the tile's maximum (the masked
/// entries, −∞, never raise it), in the same pass; then its online-softmax step (rescaling its
/// accumulator and sum when the maximum grows, ggml's SIMD `expf`, the tile's sum in groups of
/// 16). Returns whether the query sees a key of the tile.
fn one_query_weights(
    (scores, lane): (&[[f32; LANES]], usize),
    (start, end): (usize, usize),
    (tile_start, k0, k1): (usize, usize, usize),
    scale: ScoreScale,
    row: &mut [f32; KEY_TILE],
    (max, sum, acc): (&mut f32, &mut f32, &mut [f32]),
) -> bool {
    row.fill(f32::NEG_INFINITY);
    let (s0, s1) = (k0.max(start), k1.min(end));
    let mut put = |p: usize, x: f32| row[p - tile_start] = x;
    if let Some(factor) = scale.plain_factor() {
        (s0..s1).for_each(|p| put(p, scores[p - k0][lane] * factor));
    } else {
        (s0..s1).for_each(|p| put(p, scale.score(scores[p - k0][lane])));
    }
    let tile_max = row_max(row);
    if tile_max == f32::NEG_INFINITY {
        return false;
    }
    let new_max = max.max(tile_max);
    if new_max > *max {
        let ms = (*max - new_max).exp();
        acc.iter_mut().for_each(|a| *a *= ms);
        *sum *= ms;
    }
    *max = new_max;
    row.iter_mut().for_each(|x| *x -= new_max);
    ops::expf_ggml_in_place(row);
    let tile_sum: f64 = row
        .chunks_exact(16)
        .map(|g| reduce_add_16(g.try_into().expect("16 lanes")) as f64)
        .sum();
    *sum = (*sum as f64 + tile_sum) as f32;
    true
}

/// The largest of a tile's weights (−∞ where masked), in eight running maxima folded at the
/// end: one chain through the 64 took four cycles a key (the latency of `maxss`), 6 % of a
/// 1.5B's 2048-token prompt. The maximum of numbers does not depend on their order (with a
/// NaN among them, no maximum is meaningful, and every path takes this same order).
fn row_max(row: &[f32; KEY_TILE]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    for chunk in row.chunks_exact(8) {
        for (m, &x) in m.iter_mut().zip(chunk) {
            *m = if *m > x { *m } else { x };
        }
    }
    m.into_iter()
        .fold(f32::NEG_INFINITY, |a, x| if a > x { a } else { x })
}

/// `_mm512_reduce_add_ps` as GCC defines it: upper 8 lanes + lower 8, upper 4 + lower 4, then
/// (0+2) + (1+3).
fn reduce_add_16(a: &[f32; 16]) -> f32 {
    let t8: [f32; 8] = std::array::from_fn(|l| a[8 + l] + a[l]);
    let t4: [f32; 4] = std::array::from_fn(|l| t8[4 + l] + t8[l]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

#[cfg(test)]
#[path = "tiled_tests.rs"]
mod tests;
