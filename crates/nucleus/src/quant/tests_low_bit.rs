//! Tests of Q2_K, Q3_K, IQ4_NL and IQ4_XS: dequantization against the `gguf` Python package,
//! and their extra kernels (repacked, tiled) and extreme scales, scalar against SIMD bit for bit.
//! (Their one-row kernels are also in `tests.rs`'s loops over every computable type.)

#![allow(clippy::needless_range_loop)]

use super::dispatch::{kernels_for, Kernels};
use super::tests::{
    check_exact, deq, put_f16, random_acts, random_row, run_kernel, scale_fields, test_sizes, Pick,
    Rng,
};
use super::*;
use GgmlType::*;

const LOW_BIT: [GgmlType; 4] = [Q2_K, Q3_K, IQ4_NL, IQ4_XS];

/// Random blocks dequantized by gguf-py (`scripts/gen_low_bit_fixtures.py`), with its last
/// block of each type at extreme scales: nucleus gives the same f32 bits for every value.
#[test]
fn dequantization_matches_gguf_py() {
    let blob: &[u8] = include_bytes!("testdata/low_bit_gguf_py.bin");
    let u32_at = |at: usize| u32::from_le_bytes(blob[at..at + 4].try_into().unwrap());
    let mut at = 0;
    let mut seen = Vec::new();
    while at < blob.len() {
        let ty = GgmlType::from_u32(u32_at(at)).expect("fixture names a known type");
        let n = u32_at(at + 4) as usize;
        let rb = ty.row_bytes(n).expect("whole blocks");
        let data = &blob[at + 8..at + 8 + rb];
        let want = &blob[at + 8 + rb..at + 8 + rb + 4 * n];
        let got = deq(ty, data, n);
        for (e, (g, w)) in got.iter().zip(want.chunks_exact(4)).enumerate() {
            let w = f32::from_le_bytes(w.try_into().unwrap());
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{ty} element {e}: {g} vs gguf-py {w}"
            );
        }
        seen.push(ty);
        at += 8 + rb + 4 * n;
    }
    assert_eq!(seen, LOW_BIT);
}

/// The kernels a matrix product picks for these types besides the one-row ones.
fn extra_kernels() -> [(&'static str, GgmlType, Pick<'static>); 7] {
    [
        ("q2_k_block_sums", Q2_K, &|k: &Kernels| k.q2_k_block_sums),
        ("q2_k_gemm", Q2_K, &|k: &Kernels| k.q2_k_gemm),
        ("q2_k_tiled", Q2_K, &|k: &Kernels| k.q2_k_tiled),
        ("q3_k_tiled", Q3_K, &|k: &Kernels| k.q3_k_tiled),
        ("iq4_xs_tiled", IQ4_XS, &|k: &Kernels| k.iq4_xs_tiled),
        ("iq4_nl_block_sums", IQ4_NL, &|k: &Kernels| {
            k.iq4_nl_block_sums
        }),
        ("mxfp4_block_sums", MXFP4, &|k: &Kernels| k.mxfp4_block_sums),
    ]
}

#[test]
fn simd_matches_scalar_low_bit_extra_kernels() {
    let mut rng = Rng::new(12);
    for (name, ty, pick) in extra_kernels() {
        for n in test_sizes(ty, 1) {
            let w = random_row(&mut rng, ty, n);
            check_exact(name, ty, pick, &w, n);
        }
    }
}

/// Weight scales at the ends of f16 (largest, negative, subnormal, zero) and activation scales
/// of 1e30 and 1e-30 (Q8_K) or the f16 ends (Q8_0): every kernel of every level gives the
/// scalar kernel's bits (or NaN where it does).
#[test]
fn simd_matches_scalar_at_extreme_scales() {
    let mut rng = Rng::new(13);
    let weight_scales = [65504.0f32, -65504.0, 6.0e-8, 0.0, -1.0];
    type Boxed = Box<dyn Fn(&Kernels) -> dispatch::DotFn>;
    let mut kernels: Vec<(&str, GgmlType, Boxed)> = LOW_BIT
        .iter()
        .map(|&ty| {
            (
                "dot",
                ty,
                Box::new(move |k: &Kernels| k.dot_fn(ty)) as Boxed,
            )
        })
        .collect();
    for (name, ty, pick) in extra_kernels() {
        kernels.push((name, ty, Box::new(pick)));
    }
    for (name, ty, pick) in &kernels {
        let n = 4 * ty.block_size().max(vec_dot_type(*ty).block_size());
        let vt = vec_dot_type(*ty);
        let (bb, xbb) = (ty.block_layout().1, vt.block_layout().1);
        for (case, &ws) in weight_scales.iter().enumerate() {
            let mut w = random_row(&mut rng, *ty, n);
            for (b, blk) in w.chunks_exact_mut(bb).enumerate() {
                for (f, &at) in scale_fields(*ty).iter().enumerate() {
                    let v = weight_scales[(case + b + f) % weight_scales.len()];
                    put_f16(blk, at, if b == 0 { ws } else { v });
                }
            }
            let xb = vt.row_bytes(n).unwrap();
            let mut acts = random_acts(&mut rng, vt, n);
            for (b, blk) in acts.chunks_exact_mut(xbb).enumerate() {
                if vt == Q8_K {
                    let d: f32 = if (b + case) % 2 == 0 { 1e30 } else { 1e-30 };
                    blk[0..4].copy_from_slice(&d.to_le_bytes());
                } else {
                    put_f16(blk, 0, if (b + case) % 2 == 0 { 65504.0 } else { 6.0e-8 });
                }
            }
            let scalar = pick(kernels_for(SimdLevel::Scalar).unwrap());
            let mut want = [0f32; 1];
            run_kernel(scalar, *ty, &w, &acts, xb, n, &mut want);
            for level in available_levels() {
                let mut got = [0f32; 1];
                run_kernel(
                    pick(kernels_for(level).unwrap()),
                    *ty,
                    &w,
                    &acts,
                    xb,
                    n,
                    &mut got,
                );
                let same =
                    got[0].to_bits() == want[0].to_bits() || (got[0].is_nan() && want[0].is_nan());
                assert!(
                    same,
                    "{name} ({ty}) case {case} {level:?}: {} vs scalar {}",
                    got[0], want[0]
                );
            }
        }
    }
}

/// Each extra kernel computes the same dot product as the one-row kernel, to rounding.
#[test]
fn low_bit_kernel_variants_agree() {
    let mut rng = Rng::new(14);
    let scalar = kernels_for(SimdLevel::Scalar).expect("the scalar kernels are always there");
    for (name, ty, pick) in extra_kernels() {
        let n = 1024;
        let w = random_row(&mut rng, ty, n);
        let x = random_acts(&mut rng, vec_dot_type(ty), n);
        let want = vec_dot(ty, &w, &x, n);
        let mut got = [0f32];
        run_kernel(pick(scalar), ty, &w, &x, x.len(), n, &mut got);
        assert!(
            (got[0] - want).abs() <= want.abs() * 1e-5 + 1e-4,
            "{name}: {} vs {want}",
            got[0]
        );
    }
}

/// Hand-built blocks with known values: the scale packing of Q3_K (6 bits over two fields)
/// and IQ4_XS (low nibbles and a u16 of high bits), and Q2_K's mins.
#[test]
fn dequant_low_bit_known() {
    // Q3_K: scales k = 0..16 chosen as (5k + 3) % 64; value e has low bits e % 4 and the
    // third bit set for even e (value e % 4), clear for odd e (value e % 4 − 4).
    let scales: Vec<u8> = (0..16).map(|k| ((5 * k + 3) % 64) as u8).collect();
    let mut b = [0u8; 110];
    for e in 0..256 {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        b[32 + 32 * h + l] |= ((e % 4) as u8) << (2 * s);
        if e % 2 == 0 {
            b[l] |= 1 << (4 * h + s);
        }
    }
    for k in 0..16 {
        b[96 + k % 8] |= (scales[k] & 0xF) << (4 * (k / 8));
        b[104 + k % 4] |= (scales[k] >> 4) << (2 * (k / 4));
    }
    put_f16(&mut b, 108, 0.5);
    let y = deq(Q3_K, &b, 256);
    for e in 0..256 {
        let q = (e % 4) as f32 - if e % 2 == 0 { 0.0 } else { 4.0 };
        let want = 0.5 * (scales[e / 16] as f32 - 32.0) * q;
        assert_eq!(y[e], want, "Q3_K element {e}");
    }
    // IQ4_XS: sub-block scales (7ib + 1) % 64, nibble of value e = e % 16.
    let mut b = [0u8; 136];
    put_f16(&mut b, 0, 0.25);
    let mut sh = 0u16;
    for ib in 0..8 {
        let ls = ((7 * ib + 1) % 64) as u8;
        b[4 + ib / 2] |= (ls & 0xF) << (4 * (ib % 2));
        sh |= ((ls >> 4) as u16) << (2 * ib);
        for j in 0..16 {
            b[8 + 16 * ib + j] = (j as u8) | (((j as u8 + 16) % 16) << 4);
        }
    }
    b[2..4].copy_from_slice(&sh.to_le_bytes());
    let y = deq(IQ4_XS, &b, 256);
    let kv = blocks_low_bit::KVALUES_IQ4NL;
    for e in 0..256 {
        let ls = ((7 * (e / 32) + 1) % 64) as f32 - 32.0;
        let want = 0.25 * ls * kv[e % 16] as f32;
        assert_eq!(y[e], want, "IQ4_XS element {e}");
    }
    // Q2_K: scale i and min 15 − i for 16-value group i, value e = (e / 3) % 4.
    let mut b = [0u8; 84];
    for i in 0..16 {
        b[i] = (i as u8) | ((15 - i as u8) << 4);
    }
    for e in 0..256 {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        b[16 + 32 * h + l] |= (((e / 3) % 4) as u8) << (2 * s);
    }
    put_f16(&mut b, 80, 2.0);
    put_f16(&mut b, 82, 0.5);
    let y = deq(Q2_K, &b, 256);
    for e in 0..256 {
        let (sc, mn) = ((e / 16) as f32, (15 - e / 16) as f32);
        let want = 2.0 * sc * ((e / 3) % 4) as f32 - 0.5 * mn;
        assert_eq!(y[e], want, "Q2_K element {e}");
    }
}

/// MXFP4 against the OCP Microscaling spec (v1.0, §5.3.3, E2M1): the 16 codes are 0, 0.5, 1,
/// 1.5, 2, 3, 4, 6 and their negatives (code 8 is −0), times the block's 2^(e − 127).
#[test]
fn mxfp4_dequantizes_as_the_ocp_spec_says() {
    const E2M1: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    for e in [1u8, 2, 100, 127, 130, 200] {
        let mut block = [0u8; 17];
        block[0] = e;
        for (i, b) in block[1..].iter_mut().enumerate() {
            *b = (i as u8) | (((15 - i) as u8) << 4);
        }
        let got = deq(MXFP4, &block, 32);
        let scale = 2f64.powi(e as i32 - 127);
        for (k, &g) in got.iter().enumerate() {
            let code = if k < 16 { k } else { 15 - (k - 16) };
            assert_eq!(g as f64, E2M1[code] as f64 * scale, "e {e}, value {k}");
        }
    }
}
