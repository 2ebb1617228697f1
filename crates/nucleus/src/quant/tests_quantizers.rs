//! The quantizers: round trips within a grid step, llama.cpp's layouts and rounding (ties to
//! even in the activation quantizers, away from zero in the reference ones), and the signed
//! maximum that the reference ones scale by.

#![allow(clippy::needless_range_loop)]
use super::blocks::{nearest_int, signed_absmax};
use super::tests::{deq, Rng};
use super::*;
use GgmlType::*;

#[test]
fn roundtrip_error_bounds() {
    let mut rng = Rng::new(7);
    for &(ty, levels) in &[
        (Q4_0, 8.0f32),
        (Q4_1, 15.0),
        (Q5_0, 16.0),
        (Q5_1, 31.0),
        (Q8_0, 127.0),
    ] {
        let n = 32 * 37;
        let x: Vec<f32> = (0..n).map(|_| rng.f32() * 4.0).collect();
        let mut b = vec![0u8; ty.row_bytes(n).unwrap()];
        quantize_row(ty, &x, &mut b);
        let y = deq(ty, &b, n);
        for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let lo = xb.iter().fold(f32::MAX, |a, &v| a.min(v));
            let hi = xb.iter().fold(f32::MIN, |a, &v| a.max(v));
            // Step of the grid; Q4_0/Q5_0 may clamp the far end by one step.
            let step = match ty {
                Q4_1 | Q5_1 => (hi - lo) / levels,
                _ => amax / levels,
            };
            let bound = match ty {
                Q4_0 | Q5_0 => step * 1.01,
                _ => step * 0.51,
            } + amax * 2e-3;
            for (a, b) in xb.iter().zip(yb) {
                assert!((a - b).abs() <= bound, "{ty}: {a} vs {b}, bound {bound}");
            }
        }
    }
}

#[test]
fn q8_1_sum_and_q8_k_layout() {
    let mut rng = Rng::new(11);
    let n = 512;
    let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
    let mut b = vec![0u8; Q8_1.row_bytes(n).unwrap()];
    for act in [false, true] {
        if act {
            quantize_row_act(Q8_1, &x, &mut b);
        } else {
            quantize_row(Q8_1, &x, &mut b);
        }
        for blk in b.chunks(36) {
            let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            let s = half::f16::from_le_bytes([blk[2], blk[3]]).to_f32();
            let sum: i32 = blk[4..].iter().map(|&q| q as i8 as i32).sum();
            let want = half::f16::from_f32(d * sum as f32).to_f32();
            assert!((s - want).abs() <= want.abs() * 2e-3 + 1e-6);
        }
    }
    let mut k = vec![0u8; Q8_K.row_bytes(n).unwrap()];
    quantize_row(Q8_K, &x, &mut k);
    for (blk, xb) in k.chunks(292).zip(x.chunks(256)) {
        let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let iscale = -127.0 / max;
        assert_eq!(d, 1.0 / iscale);
        for j in 0..256 {
            let want = (iscale * xb[j]).round_ties_even().min(127.0) as i32;
            assert_eq!(blk[4 + j] as i8 as i32, want);
        }
        for g in 0..16 {
            let s: i32 = blk[4 + 16 * g..20 + 16 * g]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            assert_eq!(
                i16::from_le_bytes([blk[260 + 2 * g], blk[261 + 2 * g]]) as i32,
                s
            );
        }
    }
    let y = deq(Q8_K, &k, n);
    for (a, b) in x.iter().zip(&y) {
        assert!((a - b).abs() <= 1.0 / 254.0 + 1e-6);
    }
    // Zero block.
    let mut z = vec![0xAAu8; 292];
    quantize_row(Q8_K, &[0.0; 256], &mut z);
    assert!(z.iter().all(|&b| b == 0));
}

#[test]
fn nearest_int_is_ties_even() {
    for (x, want) in [
        (0.5f32, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (126.6, 127),
        (-3.2, -3),
    ] {
        assert_eq!(nearest_int(x), want, "{x}");
    }
}

#[test]
fn act_quantizer_rounds_ties_to_even_ref_away() {
    // amax = 127 makes id exactly 1 (act) and d = 1 (ref); 2.5 is a tie.
    let mut x = [0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -3.5;
    let mut a = [0u8; 34];
    let mut r = [0u8; 34];
    quantize_row_act(Q8_0, &x, &mut a);
    quantize_row(Q8_0, &x, &mut r);
    assert_eq!((a[3] as i8, a[4] as i8), (2, -4));
    assert_eq!((r[3] as i8, r[4] as i8), (3, -4));
}

/// ggml's loop for the scale of the reference quantizers (Q4_0, Q5_0, Q8_K): the first element
/// of largest magnitude, from 0, skipping NaNs.
fn ggml_signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

#[test]
fn signed_absmax_is_ggmls_first_largest() {
    let nan = f32::NAN;
    let cases: [&[f32]; 9] = [
        &[1.0, -3.0, 3.0, 2.0],
        &[1.0, 3.0, -3.0, 2.0, 0.5, 0.5, 0.5, 0.5, -3.0, 3.0],
        &[-0.0, -0.0, 0.0],
        &[0.0; 40],
        &[nan, 2.0, -2.0],
        &[nan; 9],
        &[0.5, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, -7.0],
        &[f32::INFINITY, 1.0, f32::NEG_INFINITY],
        &[],
    ];
    let mut rng = Rng::new(99);
    let mut random: Vec<Vec<f32>> = Vec::new();
    for n in [8, 31, 32, 256] {
        // Few distinct magnitudes, so that ties of opposite signs are common.
        random.push((0..n).map(|_| ((rng.f32() * 4.0) as i32) as f32).collect());
    }
    for x in cases
        .iter()
        .copied()
        .chain(random.iter().map(|v| v.as_slice()))
    {
        let (want, got) = (ggml_signed_absmax(x), signed_absmax(x));
        assert_eq!(
            (want.0.to_bits(), want.1.to_bits()),
            (got.0.to_bits(), got.1.to_bits()),
            "{x:?}"
        );
    }
}

/// The AVX-512 Q8_K quantizer gives the scalar one's bytes: random blocks, and blocks with
/// NaNs, infinities, −0, ties of the rounding, tiny and huge values, and the largest magnitude
/// twice with both signs (the first one's sign is the scale's).
#[cfg(target_arch = "x86_64")]
#[test]
fn q8_k_avx512_quantizer_has_the_scalar_bytes() {
    if simd_level() < SimdLevel::Avx512 {
        eprintln!("skipped: no AVX-512");
        return;
    }
    let mut rng = Rng::new(23);
    let mut blocks: Vec<Vec<f32>> = (0..64)
        .map(|i| {
            let scale = [1.0, 1e-30, 1e30, 3.7][i % 4];
            (0..256).map(|_| rng.f32() * scale).collect()
        })
        .collect();
    let mut special = |at: &[(usize, f32)]| {
        let mut b: Vec<f32> = (0..256).map(|_| rng.f32()).collect();
        for &(i, v) in at {
            b[i] = v;
        }
        blocks.push(b);
    };
    special(&[(3, f32::NAN), (200, -f32::NAN)]);
    special(&[(17, f32::INFINITY)]);
    special(&[(40, f32::NEG_INFINITY), (41, f32::NAN)]);
    special(&[(9, -2.0), (100, 2.0)]);
    special(&[(9, 2.0), (100, -2.0)]);
    blocks.push(vec![-0.0; 256]);
    blocks.push(
        (0..256)
            .map(|i| if i == 5 { f32::NAN } else { 0.0 })
            .collect(),
    );
    // Ties: with max 127, iscale·x = −x, so the halves round to even.
    blocks.push((0..256).map(|i| (i as f32 - 128.0) * 0.5).collect());
    blocks.last_mut().unwrap()[255] = 127.0;
    for x in &blocks {
        let (mut want, mut got) = ([0u8; 292], [0u8; 292]);
        super::blocks::quantize_block_q8_k(x, &mut want);
        // SAFETY: AVX-512, checked above.
        unsafe { super::x86::quantize_block_q8_k(x, &mut got) };
        assert_eq!(got, want, "block starting {:?}", &x[..4]);
    }
}
