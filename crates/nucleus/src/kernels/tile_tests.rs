//! The attention tiles' kernels against plain chains of fused multiply-adds, and their timings.

use super::*;

fn vals(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8;
            (h % 20_000) as f32 / 10_000.0 - 1.0
        })
        .collect()
}

/// How fast a tile's values fold into queries' accumulators, four at a time (`cargo test
/// --release -p nucleus --lib mad_rows_speed -- --ignored --nocapture`). A 512-bit kernel
/// (eight queries a pass) ran at 42-44 G MAC/s against this one's 52-53 on the Xeon with
/// AMX (2026-12-07), and gave a 2048-token prompt nothing.
#[test]
#[ignore = "a timing, not a check"]
fn mad_rows_speed() {
    let (n, dv, reps) = (64, 128, 200_000);
    let rows = vals(n * dv, 3);
    let w = vals(n * 8, 4);
    let mut accs: Vec<Vec<f32>> = (0..MAD_QUERIES as u32).map(|q| vals(dv, 20 + q)).collect();
    let t = std::time::Instant::now();
    for _ in 0..reps {
        let mut acc_refs: Vec<&mut [f32]> = accs.iter_mut().map(|a| a.as_mut_slice()).collect();
        let w_refs: Vec<&[f32]> = (0..MAD_QUERIES).map(|q| &w[q..]).collect();
        mad_rows_many(&mut acc_refs, &rows, &w_refs, 8);
    }
    let s = t.elapsed().as_secs_f64();
    let macs = (reps * n * dv * MAD_QUERIES) as f64;
    eprintln!("{:.1} G MAC/s", macs / s / 1e9);
}

/// The dispatched paths give the bits of the plain FMA chains.
#[test]
fn simd_equals_fma_chains() {
    for (dk, nk) in [(64, 64), (256, 13), (40, 3), (128, 1), (45, 17)] {
        let qt = vals(dk * QUERY_LANES, 1);
        let keys = vals(nk * dk, 2);
        let mut got = vec![[0f32; QUERY_LANES]; nk];
        dot_keys(&qt, &keys, dk, &mut got);
        // Two chunks at once: each its own bits.
        let qt1 = vals(dk * QUERY_LANES, 7);
        let (mut pair0, mut pair1) = (vec![[0f32; QUERY_LANES]; nk], vec![[0f32; QUERY_LANES]; nk]);
        dot_keys_pair(&qt, &qt1, &keys, dk, &mut pair0, &mut pair1);
        let mut alone1 = vec![[0f32; QUERY_LANES]; nk];
        dot_keys(&qt1, &keys, dk, &mut alone1);
        let lane_bits =
            |v: &[[f32; QUERY_LANES]]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            lane_bits(&pair0),
            lane_bits(&got),
            "dk {dk}: first chunk of a pair"
        );
        assert_eq!(
            lane_bits(&pair1),
            lane_bits(&alone1),
            "dk {dk}: second chunk"
        );
        for j in 0..nk {
            for l in 0..QUERY_LANES {
                let mut s = 0f32;
                for d in 0..dk {
                    s = keys[j * dk + d].mul_add(qt[d * QUERY_LANES + l], s);
                }
                assert_eq!(got[j][l].to_bits(), s.to_bits(), "dk {dk} key {j} lane {l}");
            }
        }
        let dv = dk + 3;
        let rows = vals(nk * dv, 3);
        let w = vals(nk, 4);
        let mut acc = vals(dv, 5);
        let mut want = acc.clone();
        mad_rows(&mut acc, &rows, &w);
        mad_rows_scalar(&mut want, &rows, &w);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&acc), bits(&want), "dv {dv}");
        // One to four accumulators at once: each gets its own chains' bits.
        for nq in 1..=MAD_QUERIES {
            let ws: Vec<Vec<f32>> = (0..nq).map(|q| vals(nk, 10 + q as u32)).collect();
            let mut accs: Vec<Vec<f32>> = (0..nq).map(|q| vals(dv, 20 + q as u32)).collect();
            let mut wants = accs.clone();
            for (want, w) in wants.iter_mut().zip(&ws) {
                mad_rows_scalar(want, &rows, w);
            }
            let mut acc_refs: Vec<&mut [f32]> = accs.iter_mut().map(|a| a.as_mut_slice()).collect();
            let w_refs: Vec<&[f32]> = ws.iter().map(|w| w.as_slice()).collect();
            mad_rows_many(&mut acc_refs, &rows, &w_refs, 1);
            for (got, want) in accs.iter().zip(&wants) {
                assert_eq!(bits(got), bits(want), "dv {dv}, {nq} accumulators");
            }
            // The weights eight apart (the tiled attention's lanes), NaN between them.
            let mut spread: Vec<Vec<f32>> = vec![vec![f32::NAN; nk.max(1) * 8]; nq];
            for (sp, w) in spread.iter_mut().zip(&ws) {
                for (j, &x) in w.iter().enumerate() {
                    sp[8 * j] = x;
                }
            }
            let mut accs: Vec<Vec<f32>> = (0..nq).map(|q| vals(dv, 20 + q as u32)).collect();
            let mut acc_refs: Vec<&mut [f32]> = accs.iter_mut().map(|a| a.as_mut_slice()).collect();
            let w_refs: Vec<&[f32]> = spread.iter().map(|w| w.as_slice()).collect();
            mad_rows_many(&mut acc_refs, &rows, &w_refs, 8);
            for (got, want) in accs.iter().zip(&wants) {
                assert_eq!(
                    bits(got),
                    bits(want),
                    "dv {dv}, {nq} accumulators, stride 8"
                );
            }
        }
    }
    // One query against transposed keys: dot_keys's chain for it, bit for bit.
    for (dk, nk) in [(64usize, 64usize), (256, 13), (40, 3), (128, 1), (72, 61)] {
        const STRIDE: usize = 64;
        let keys = vals(nk.div_ceil(8) * 8 * dk, 8);
        let keys16: Vec<f16> = keys.iter().map(|&x| f16::from_f32(x)).collect();
        let mut kt = vec![f32::NAN; dk * STRIDE];
        for j0 in (0..nk).step_by(TRANSPOSE_KEYS) {
            let rows: [&[f16]; TRANSPOSE_KEYS] =
                std::array::from_fn(|j| &keys16[(j0 + j) * dk..(j0 + j + 1) * dk]);
            widen_f16_transposed(&mut kt, STRIDE, j0, &rows, dk);
        }
        let widened: Vec<f32> = keys16[..nk * dk].iter().map(|h| h.to_f32()).collect();
        for l in [0, 5] {
            let q: Vec<f32> = (0..dk)
                .map(|d| vals(dk * QUERY_LANES, 9)[d * QUERY_LANES + l])
                .collect();
            let mut got = vec![0f32; nk];
            dot_keys_transposed(&q, &kt, STRIDE, &mut got);
            let qt = vals(dk * QUERY_LANES, 9);
            let mut want = vec![[0f32; QUERY_LANES]; nk];
            dot_keys(&qt, &widened, dk, &mut want);
            for j in 0..nk {
                assert_eq!(
                    got[j].to_bits(),
                    want[j][l].to_bits(),
                    "dk {dk} key {j} lane {l}"
                );
            }
        }
    }
    let h: Vec<f16> = vals(37, 6).iter().map(|&x| f16::from_f32(x)).collect();
    let mut w = vec![0f32; 37];
    widen_f16(&mut w, &h);
    assert!(w.iter().zip(&h).all(|(a, b)| *a == b.to_f32()));
}

/// Keys widened in pairs give each key's scores the bits of the keys in rows
/// (`dot_key_pairs` against `dot_keys`), for head sizes with and without a tail of sixteen and
/// odd counts of keys; and the pairs hold the two rows side by side.
#[test]
fn key_pairs_give_the_rows_bits() {
    for dk in [8, 40, 64, 128, 256] {
        for nk in [1, 2, 3, 15, 16, 17, 33, 64] {
            let qt = vals(dk * QUERY_LANES, dk as u32);
            let keys: Vec<f16> = vals((nk + 1) * dk, 7 * nk as u32)
                .iter()
                .map(|&x| f16::from_f32(4.0 * x))
                .collect();
            let mut rows = vec![0f32; nk * dk];
            widen_f16(&mut rows, &keys[..nk * dk]);
            let mut want = vec![[0f32; QUERY_LANES]; nk];
            dot_keys(&qt, &rows, dk, &mut want);
            let mut pairs = vec![0f32; nk.div_ceil(2) * 2 * dk];
            let rows: Vec<&[f16]> = keys[..nk * dk].chunks_exact(dk).collect();
            widen_f16_pairs(&mut pairs, &rows, dk);
            for (p, pair) in pairs.chunks_exact(2 * dk).enumerate() {
                let (a, b) = (rows[2 * p], rows[(2 * p + 1).min(nk - 1)]);
                for d in 0..dk {
                    assert_eq!(pair[2 * d], a[d].to_f32(), "dk {dk} pair {p}");
                    assert_eq!(pair[2 * d + 1], b[d].to_f32(), "dk {dk} pair {p}");
                }
            }
            let mut got = vec![[0f32; QUERY_LANES]; nk];
            dot_key_pairs(&qt, &pairs, dk, &mut got);
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                let bits = |v: &[f32; QUERY_LANES]| v.map(f32::to_bits);
                assert_eq!(bits(g), bits(w), "dk {dk}, {nk} keys: key {j}");
            }
        }
    }
}
