//! The chunks' weights in lanes against the steps of one query at a time (llama.cpp's order
//! for one query): the same weights, maxima, sums, accumulators and list of queries that see
//! the tile, to the bit; and the timing of the two.

use super::*;
use crate::kernels::test_rng::Rng;

/// How long a tile's softmax steps take for a chunk of `nq` queries, in lanes and one
/// query at a time (`cargo test --release -p nucleus --lib weights_speed -- --ignored
/// --nocapture`).
#[test]
#[ignore = "a timing, not a check"]
fn weights_speed() {
    let mut rng = Rng(7);
    let scores: Vec<[f32; LANES]> = (0..KEY_TILE)
        .map(|_| std::array::from_fn(|_| rng.f32() * 8.0))
        .collect();
    let (dv, reps) = (128, 100_000);
    let scale = ScoreScale::new(0.088, None);
    for (nq, partial) in [1, 2, 4, 5, 6, 7, 8]
        .map(|n| (n, false))
        .into_iter()
        .chain([(8, true)])
    {
        let ranges = vec![(0, 4 * KEY_TILE); nq];
        let tile = if partial {
            (KEY_TILE, KEY_TILE, KEY_TILE + 40)
        } else {
            (KEY_TILE, KEY_TILE, 2 * KEY_TILE)
        };
        let (mut max, mut sum, mut acc) = (vec![0f32; nq], vec![1f32; nq], vec![0f32; nq * dv]);
        let mut w = [[0f32; LANES]; KEY_TILE];
        let mut seeing = Vec::new();
        let t = std::time::Instant::now();
        for _ in 0..reps {
            seeing.clear();
            let state = ChunkState {
                first: 0,
                max: &mut max,
                sum: &mut sum,
                acc: &mut acc,
                weights: &mut w,
                seeing: &mut seeing,
            };
            in_lanes(&scores, &ranges, tile, scale, state);
        }
        let lanes = t.elapsed().as_secs_f64() * 1e9 / reps as f64;
        let mut w1 = vec![[0f32; KEY_TILE]; nq];
        let t = std::time::Instant::now();
        for _ in 0..reps {
            for l in 0..nq {
                let state = (&mut max[l], &mut sum[l], &mut acc[l * dv..(l + 1) * dv]);
                one_query_weights((&scores, l), ranges[l], tile, scale, &mut w1[l], state);
            }
        }
        let alone = t.elapsed().as_secs_f64() * 1e9 / reps as f64;
        let keys = if partial { 40 } else { KEY_TILE };
        eprintln!("{nq} queries, {keys} keys: {lanes:.0} ns in lanes, {alone:.0} ns one at a time");
    }
}

#[test]
fn chunks_weigh_as_one_query_at_a_time() {
    let mut rng = Rng(0x5eed_1234_abcd);
    let dv = 24;
    for case in 0..400 {
        let nq = 1 + case % LANES;
        let tile_start = KEY_TILE * (case % 5);
        let k0 = tile_start + (rng.next() % 20) as usize;
        let k1 = (k0 + 1 + (rng.next() % 70) as usize).min(tile_start + KEY_TILE);
        // Ranges before, across, inside and after the tile's keys.
        let ranges: Vec<(usize, usize)> = (0..nq)
            .map(|_| {
                let a = tile_start.saturating_sub(10) + (rng.next() % 90) as usize;
                (a, a + (rng.next() % 80) as usize)
            })
            .collect();
        let scale = if case % 3 == 0 {
            ScoreScale::new(0.125, Some(30.0))
        } else {
            ScoreScale::new(0.088_388_35, None)
        };
        let scores: Vec<[f32; LANES]> = (0..KEY_TILE)
            .map(|_| std::array::from_fn(|_| rng.f32() * 40.0))
            .collect();
        // Running states as earlier tiles leave them (a first tile's too: −∞ and 0).
        let max: Vec<f32> = (0..nq)
            .map(|l| {
                if (case + l) % 4 == 0 {
                    f32::NEG_INFINITY
                } else {
                    rng.f32() * 4.0
                }
            })
            .collect();
        let sum: Vec<f32> = max
            .iter()
            .map(|m| {
                if *m == f32::NEG_INFINITY {
                    0.0
                } else {
                    1.0 + rng.f32().abs() * 9.0
                }
            })
            .collect();
        let acc: Vec<f32> = (0..nq * dv).map(|_| rng.f32()).collect();
        let tile = (tile_start, k0, k1);

        let (mut max1, mut sum1, mut acc1) = (max.clone(), sum.clone(), acc.clone());
        let mut w1 = vec![[0f32; KEY_TILE]; nq];
        let mut seeing1 = Vec::new();
        for l in 0..nq {
            let state = (&mut max1[l], &mut sum1[l], &mut acc1[l * dv..(l + 1) * dv]);
            if one_query_weights((&scores, l), ranges[l], tile, scale, &mut w1[l], state) {
                seeing1.push(l);
            }
        }
        let (mut max2, mut sum2, mut acc2) = (max.clone(), sum.clone(), acc.clone());
        let mut w2 = [[0f32; LANES]; KEY_TILE];
        let mut seeing2 = Vec::new();
        let state = ChunkState {
            first: 0,
            max: &mut max2,
            sum: &mut sum2,
            acc: &mut acc2,
            weights: &mut w2,
            seeing: &mut seeing2,
        };
        in_lanes(&scores, &ranges, tile, scale, state);

        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(seeing1, seeing2, "case {case}");
        assert_eq!(bits(&max1), bits(&max2), "case {case}");
        assert_eq!(bits(&sum1), bits(&sum2), "case {case}");
        assert_eq!(bits(&acc1), bits(&acc2), "case {case}");
        let (w0, w1_) = (k0 - tile_start, k1 - tile_start);
        for &l in &seeing1 {
            let lane: Vec<f32> = w2[w0..w1_].iter().map(|v| v[l]).collect();
            assert_eq!(bits(&w1[l][w0..w1_]), bits(&lane), "case {case} query {l}");
        }
    }
}
