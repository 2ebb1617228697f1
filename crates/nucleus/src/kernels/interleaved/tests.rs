//! The interleaved arithmetic: the packing keeps every value, the SIMD kernels compute the
//! scalar kernels' bits, a token's outputs do not depend on the other tokens of the product, and
//! the products are the dot products to rounding.

use super::pack::{can_pack, pack, unpack_group_scalar};
use super::*;
use crate::kernels::matmul::QMatrix;
use crate::kernels::test_rng::Rng;
use crate::quant::dequantize_row;
use crate::quant::quantize::quantize_rows;

/// A random `rows × cols` matrix of `ty`, with rows of different magnitudes.
pub(super) fn matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let mut data = vec![0u8; rows * rb];
    if ty == GgmlType::MXFP4 {
        // Random codes; exponents from 2^-24 to 2^15 (every one f16 holds), and an all-zero
        // block with exponent 0 now and then (gpt-oss's files have them).
        for (i, b) in data.chunks_exact_mut(17).enumerate() {
            let mut byte = || ((rng.f32() + 1.0) * 128.0) as u8;
            b[0] = if i % 13 == 5 { 0 } else { 104 + byte() % 40 };
            for v in &mut b[1..] {
                *v = if i % 13 == 5 { 0x80 } else { byte() };
            }
        }
        return data;
    }
    for r in 0..rows {
        let scale = 0.01 * (1 + r % 7) as f32;
        let f: Vec<f32> = (0..cols).map(|_| rng.f32() * scale).collect();
        quantize_rows(ty, &f, cols, &mut data[r * rb..(r + 1) * rb]).unwrap();
    }
    data
}

pub(super) fn acts(rng: &mut Rng, n: usize, cols: usize) -> (QuantizedActs, PackedActs) {
    let x: Vec<f32> = (0..n * cols)
        .map(|i| rng.f32() * (1 + i % 5) as f32)
        .collect();
    let mut q = QuantizedActs::new();
    q.quantize(&x, n, cols, GgmlType::Q8_0);
    let mut p = PackedActs::new();
    p.prepare(&q);
    (q, p)
}

/// `data` (`rows` rows of `cols` values of `ty`) repacked; the shape must pack.
pub(super) fn packed(ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> PackedMatrix {
    pack(&QMatrix {
        ty,
        data,
        rows,
        cols,
    })
    .unwrap()
}

/// The types computed in the arithmetic of the module doc.
const TYPES: [GgmlType; 5] = [
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::MXFP4,
];

#[test]
fn mxfp4_out_of_f16_range_is_not_packed() {
    let mut rng = Rng(12);
    let mut data = matrix(&mut rng, GgmlType::MXFP4, 8, 64);
    let w = |data: &[u8]| {
        let q = QMatrix {
            ty: GgmlType::MXFP4,
            data,
            rows: 8,
            cols: 64,
        };
        pack(&q).is_some()
    };
    assert!(w(&data));
    data[17 * 3] = 144; // 2^16: past f16's largest power of two
    assert!(!w(&data));
    data[17 * 3] = 103; // 2^-25: below its smallest
    assert!(!w(&data));
}

#[test]
fn packing_keeps_every_value_and_scale() {
    let mut rng = Rng(11);
    for ty in TYPES {
        let (rows, cols) = (16, 96);
        let data = matrix(&mut rng, ty, rows, cols);
        let w = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        let p = pack(&w).unwrap();
        // MXFP4's one-byte scales widen to f16 (18 bytes a block for 17).
        let want = if ty == GgmlType::MXFP4 {
            data.len() / 17 * 18
        } else {
            data.len()
        };
        assert_eq!(p.bytes(), want, "{ty}: the packed matrix's size");
        let blocks = cols / QK;
        let rb = ty.row_bytes(cols).unwrap();
        for g in 0..rows / GROUP_ROWS {
            let (mut scales, mut unpacked) = (vec![0f32; 8 * blocks], vec![0u8; 256 * blocks]);
            let src = p.group(g);
            let view = GroupView::new(
                ty,
                blocks,
                src,
                &mut scales,
                &mut unpacked,
                unpack_group_scalar,
            );
            let (scales, values, stride) = (view.scales, view.values, view.stride);
            for j in 0..GROUP_ROWS {
                let r = g * GROUP_ROWS + j;
                let mut want = vec![0f32; cols];
                dequantize_row(ty, &data[r * rb..(r + 1) * rb], &mut want);
                for (i, &wv) in want.iter().enumerate() {
                    let b = i / QK;
                    let v = values[stride * b + 32 * (i % QK / 4) + 4 * j + i % 4];
                    let q = match ty {
                        GgmlType::Q5_0 => v as i32 - 16,
                        GgmlType::Q4_0 => v as i32 - 8,
                        _ => v as i8 as i32,
                    };
                    assert_eq!(q as f32 * scales[8 * b + j], wv, "{ty} row {r} value {i}");
                }
            }
        }
    }
}

/// The group packings of the 32-value types (`pack_small`: one loop a group, SIMD transposes)
/// write the bytes of the block-by-block packing, for row lengths of 1 to 40 blocks.
#[test]
fn small_groups_pack_as_blocks_do() {
    use super::pack::{group_block_bytes, pack_group_by_blocks};
    let mut rng = Rng(29);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::IQ4_NL,
    ] {
        for blocks in [1, 2, 3, 7, 28, 40] {
            let cols = QK * blocks;
            let data = matrix(&mut rng, ty, 16, cols);
            let p = packed(ty, &data, 16, cols);
            let rb = ty.row_bytes(cols).unwrap();
            for g in 0..2 {
                let rows = std::array::from_fn(|j| &data[(8 * g + j) * rb..][..rb]);
                let mut want = vec![0xA5u8; blocks * group_block_bytes(ty)];
                pack_group_by_blocks(ty, rows, &mut want);
                assert!(p.group(g) == want, "{ty}, {blocks} blocks, group {g}");
            }
        }
    }
}

#[test]
fn only_the_repacked_types_with_whole_groups_are_packed() {
    assert!(can_pack(GgmlType::Q5_0, 896, 4864));
    assert!(can_pack(GgmlType::Q4_0, 896, 896));
    assert!(can_pack(GgmlType::IQ4_NL, 4864, 896));
    assert!(
        !can_pack(GgmlType::IQ4_NL, 4, 896),
        "rows not a multiple of 8"
    );
    assert!(!can_pack(GgmlType::Q4_1, 896, 896));
    assert!(can_pack(GgmlType::IQ4_XS, 256, 256));
    assert!(
        !can_pack(GgmlType::IQ4_XS, 8, 896),
        "rows of part of a super-block"
    );
    assert!(
        !can_pack(GgmlType::Q5_0, 12, 64),
        "rows not a multiple of 8"
    );
    assert!(can_pack(GgmlType::Q4_K, 896, 4864));
    assert!(
        !can_pack(GgmlType::Q4_K, 8, 96),
        "rows of part of a super-block"
    );
    assert!(can_pack(GgmlType::Q5_K, 8960, 1536));
    assert!(
        !can_pack(GgmlType::Q5_K, 8, 896),
        "rows of part of a super-block"
    );
    assert!(can_pack(GgmlType::Q3_K, 256, 256));
    assert!(!can_pack(GgmlType::Q2_K, 256, 256));
    assert!(can_pack(GgmlType::Q6_K, 256, 256));
    assert!(
        !can_pack(GgmlType::Q6_K, 8, 896),
        "rows of part of a super-block"
    );
    assert!(!can_pack(GgmlType::Q8_0, 0, 32));
}

/// `nt` rows of Q8_K activations with a wide range, so that some quantize to the extremes.
pub(super) fn wide_q8_k_acts(rng: &mut Rng, nt: usize, cols: usize) -> QuantizedActs {
    let xf: Vec<f32> = (0..nt * cols)
        .map(|i| rng.f32() * (1 + i % 7) as f32 * if i % 97 == 0 { 50.0 } else { 1.0 })
        .collect();
    let mut x = QuantizedActs::new();
    x.quantize(&xf, nt, cols, GgmlType::Q8_K);
    x
}

/// Random Q4_K rows: scales of different sizes, any six-bit scales and mins, any nibbles.
pub(super) fn random_q4_k(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut byte = || ((rng.f32() + 1.0) * 128.0) as u8;
    let mut data = vec![0u8; rows * cols / 256 * 144];
    for (i, b) in data.chunks_exact_mut(144).enumerate() {
        let d = half::f16::from_f32(0.001 * (1 + i % 13) as f32);
        let dmin = half::f16::from_f32(0.0005 * (1 + i % 5) as f32);
        b[0..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&dmin.to_le_bytes());
        for v in &mut b[4..] {
            *v = byte();
        }
    }
    data
}

/// Repacked Q4_K computes what the one-row Q4_K kernel computes, bit for bit, for every token
/// count, with the SIMD kernels and the scalar ones; and it keeps every value.
#[test]
fn q4_k_packed_has_the_one_row_kernels_bits() {
    let mut rng = Rng(15);
    let pool = ThreadPool::new(2);
    let ty = GgmlType::Q4_K;
    for (rows, cols) in [(8, 256), (24, 768), (64, 4864)] {
        let data = random_q4_k(&mut rng, rows, cols);
        let qm = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        let w = pack(&qm).unwrap();
        assert_eq!(w.bytes(), rows / 8 * cols / 256 * 1184);
        for nt in [1, 2, 3, 4, 5, 9, 40] {
            let x = wide_q8_k_acts(&mut rng, nt, cols);
            let none = PackedActs::new();
            let mut want = vec![0f32; nt * rows];
            crate::kernels::matmul::matmul(&pool, &qm, &x, &mut want);
            let (mut simd, mut scalar) = (vec![0f32; nt * rows], vec![0f32; nt * rows]);
            matmul_packed_with(
                &pool,
                &mut [(&w, &mut simd)],
                &x,
                &none,
                true,
                Chain::Default,
            );
            matmul_packed_with(
                &pool,
                &mut [(&w, &mut scalar)],
                &x,
                &none,
                false,
                Chain::Default,
            );
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&scalar),
                bits(&want),
                "{rows}x{cols}, {nt} tokens: scalar"
            );
            assert_eq!(bits(&simd), bits(&want), "{rows}x{cols}, {nt} tokens: SIMD");
        }
    }
}

/// Repacked Q4_K with the pairs chain computes what `--exact` computes for a prompt's rows in
/// whole groups of four (llama.cpp's repacked Q4_K gemm, one FMA per pair of sub-blocks), bit
/// for bit, with the SIMD kernels and the scalar ones; and it is not the default chain's result
/// (the test would not see a kernel that ignored the chain).
#[test]
fn q4_k_packed_pairs_have_the_gemms_bits() {
    use crate::kernels::matmul::{matmul_rows, PromptSlot};
    let mut rng = Rng(16);
    let pool = ThreadPool::new(2);
    let ty = GgmlType::Q4_K;
    let mut differs = 0;
    for (rows, cols) in [(8, 256), (24, 768), (64, 4864)] {
        let data = random_q4_k(&mut rng, rows, cols);
        let qm = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        let w = pack(&qm).unwrap();
        for nt in [1, 3, 4, 8, 9, 40] {
            let x = wide_q8_k_acts(&mut rng, nt, cols);
            let none = PackedActs::new();
            let mut want = vec![0f32; nt * rows];
            matmul_rows(&pool, &qm, &x, &mut want, &vec![PromptSlot::BATCHED; nt]);
            let (mut simd, mut scalar, mut sums) = (
                vec![0f32; nt * rows],
                vec![0f32; nt * rows],
                vec![0f32; nt * rows],
            );
            let pairs = Chain::Q4kPairs;
            matmul_packed_with(&pool, &mut [(&w, &mut simd)], &x, &none, true, pairs);
            matmul_packed_with(&pool, &mut [(&w, &mut scalar)], &x, &none, false, pairs);
            matmul_packed_with(
                &pool,
                &mut [(&w, &mut sums)],
                &x,
                &none,
                true,
                Chain::Default,
            );
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&scalar), bits(&want), "{rows}x{cols}, {nt}: scalar");
            assert_eq!(bits(&simd), bits(&want), "{rows}x{cols}, {nt}: SIMD");
            differs += bits(&sums)
                .iter()
                .zip(bits(&want))
                .filter(|(a, b)| *a != b)
                .count();
        }
    }
    assert!(differs > 0, "the two chains gave the same bits everywhere");
}

#[test]
fn simd_matches_scalar_and_tokens_do_not_depend_on_each_other() {
    let mut rng = Rng(12);
    let pool = ThreadPool::new(2);
    for ty in TYPES {
        for (rows, cols) in [(8, 32), (16, 96), (64, 4864), (136, 896)] {
            let data = matrix(&mut rng, ty, rows, cols);
            let w = packed(ty, &data, rows, cols);
            // Nine tokens: tiles of four and a last one; 37: past a block of many tokens;
            // 133: past the most that read Q5_0 as stored.
            for nt in [9, 37, 133] {
                let (x, xa) = acts(&mut rng, nt, cols);
                let (mut simd, mut scalar) = (vec![0f32; nt * rows], vec![0f32; nt * rows]);
                matmul_packed_with(&pool, &mut [(&w, &mut simd)], &x, &xa, true, Chain::Default);
                matmul_packed_with(
                    &pool,
                    &mut [(&w, &mut scalar)],
                    &x,
                    &xa,
                    false,
                    Chain::Default,
                );
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&simd),
                    bits(&scalar),
                    "{ty} {rows}x{cols}: SIMD vs scalar"
                );
                // Each token alone gives the bits it got among nine.
                for t in 0..nt {
                    let mut one = QuantizedActs::new();
                    let row_floats: Vec<f32> = {
                        let mut f = vec![0f32; cols];
                        dequantize_row(GgmlType::Q8_0, x.row(t), &mut f);
                        f
                    };
                    // Requantizing a dequantized Q8_0 row gives the same bytes.
                    one.quantize(&row_floats, 1, cols, GgmlType::Q8_0);
                    assert_eq!(one.row(0), x.row(t));
                    let mut oa = PackedActs::new();
                    oa.prepare(&one);
                    let mut y = vec![0f32; rows];
                    matmul_packed(&pool, &w, &one, &oa, &mut y);
                    assert_eq!(
                        bits(&y),
                        bits(&simd[t * rows..(t + 1) * rows]),
                        "{ty} token {t}"
                    );
                }
                // And two or three at a time (decode's tile of a few tokens).
                for (t0, n) in [(0, 2), (3, 3), (6, 3)] {
                    let f: Vec<f32> = (t0..t0 + n)
                        .flat_map(|t| {
                            let mut f = vec![0f32; cols];
                            dequantize_row(GgmlType::Q8_0, x.row(t), &mut f);
                            f
                        })
                        .collect();
                    let mut few = QuantizedActs::new();
                    few.quantize(&f, n, cols, GgmlType::Q8_0);
                    let mut fa = PackedActs::new();
                    fa.prepare(&few);
                    let mut y = vec![0f32; n * rows];
                    matmul_packed(&pool, &w, &few, &fa, &mut y);
                    let want = &simd[t0 * rows..(t0 + n) * rows];
                    assert_eq!(bits(&y), bits(want), "{ty} tokens {t0}..{}", t0 + n);
                }
            }
        }
    }
}

#[test]
fn products_are_the_dot_products_to_rounding() {
    let mut rng = Rng(13);
    let pool = ThreadPool::new(1);
    for ty in TYPES {
        let (rows, cols, nt) = (24, 2048, 3);
        let data = matrix(&mut rng, ty, rows, cols);
        let w = packed(ty, &data, rows, cols);
        let (x, xa) = acts(&mut rng, nt, cols);
        let mut y = vec![0f32; nt * rows];
        matmul_packed(&pool, &w, &x, &xa, &mut y);
        let rb = ty.row_bytes(cols).unwrap();
        for t in 0..nt {
            let mut xf = vec![0f32; cols];
            dequantize_row(GgmlType::Q8_0, x.row(t), &mut xf);
            for r in 0..rows {
                let mut wf = vec![0f32; cols];
                dequantize_row(ty, &data[r * rb..(r + 1) * rb], &mut wf);
                let exact: f64 = wf.iter().zip(&xf).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wf
                    .iter()
                    .zip(&xf)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let got = y[t * rows + r] as f64;
                assert!(
                    (got - exact).abs() <= 1e-5 * mag,
                    "{ty} token {t} row {r}: {got} vs {exact} (magnitude {mag})"
                );
            }
        }
    }
}

/// Several matrices in one pass give the bits of one call each, for one token and for many.
#[test]
fn products_in_one_pass_match_one_call_each() {
    let mut rng = Rng(14);
    let pool = ThreadPool::new(2);
    let cols = 896;
    let shapes = [
        (GgmlType::Q5_0, 896),
        (GgmlType::Q5_0, 128),
        (GgmlType::Q8_0, 136),
        (GgmlType::Q4_0, 64),
        (GgmlType::IQ4_NL, 72),
    ];
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(ty, rows)| matrix(&mut rng, ty, rows, cols))
        .collect();
    let ws: Vec<PackedMatrix> = shapes
        .iter()
        .zip(&data)
        .map(|(&(ty, rows), d)| packed(ty, d, rows, cols))
        .collect();
    for nt in [1, 3, 37] {
        let (x, xa) = acts(&mut rng, nt, cols);
        let mut together: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; nt * w.rows()]).collect();
        {
            let mut products: Vec<(&PackedMatrix, &mut [f32])> = ws
                .iter()
                .zip(together.iter_mut())
                .map(|(w, y)| (w, y.as_mut_slice()))
                .collect();
            matmul_packed_many(&pool, &mut products, &x, &xa, Chain::Default);
        }
        for (w, got) in ws.iter().zip(&together) {
            let mut alone = vec![0f32; nt * w.rows()];
            matmul_packed(&pool, w, &x, &xa, &mut alone);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got), bits(&alone), "{} rows, {nt} tokens", w.rows());
        }
    }
}

/// The largest integer sums the kernels meet: every weight of a row at one end of its range
/// (Q4_0's nibble 15, IQ4_NL's −127, Q5_0's 31, Q8_0's ±127) against activations all at ±127,
/// which bring the 16-bit sums of `vpmaddubsw` nearest to saturation (IQ4_NL's pairs to 32,258,
/// Q4_0's eight chunks to 30,480). A saturated sum would be off by thousands.
#[test]
fn extreme_values_do_not_saturate() {
    let pool = ThreadPool::new(1);
    let (rows, cols) = (16, 256);
    // Rows of blocks whose bytes after the f16 scale are all one pattern.
    let patterns = [0x00u8, 0xFF, 0x81, 0x7F, 0x88, 0x11, 0xF0, 0x0F];
    let mut rng = Rng(16);
    for ty in TYPES {
        let bb = ty.block_layout().1;
        let mut data = vec![0u8; rows * ty.row_bytes(cols).unwrap()];
        // MXFP4's scale is one byte (2^(e − 128)); the others' an f16.
        let at = if ty == GgmlType::MXFP4 { 1 } else { 2 };
        for (i, block) in data.chunks_exact_mut(bb).enumerate() {
            let row = i / (cols / QK);
            if ty == GgmlType::MXFP4 {
                block[0] = 122; // 1/64
            } else {
                block[0..2].copy_from_slice(&half::f16::from_f32(1.0 / 64.0).to_le_bytes());
            }
            let p = patterns[row % patterns.len()];
            for v in &mut block[at..] {
                *v = if row < 8 {
                    p
                } else {
                    (rng.f32() * 128.0) as i8 as u8
                };
            }
        }
        let w = packed(ty, &data, rows, cols);
        // All +1, all -1, alternating signs: every activation quantizes to ±127. Twice, so
        // that the kernels for more than one tile of tokens meet them too.
        let tokens: [fn(usize) -> f32; 6] = [
            |_| 1.0,
            |_| -1.0,
            |i| if i % 2 == 0 { 1.0 } else { -1.0 },
            |_| 1.0,
            |_| -1.0,
            |i| if i % 2 == 0 { 1.0 } else { -1.0 },
        ];
        let nt = tokens.len();
        let xf: Vec<f32> = tokens.iter().flat_map(|f| (0..cols).map(f)).collect();
        let mut x = QuantizedActs::new();
        x.quantize(&xf, nt, cols, GgmlType::Q8_0);
        let mut xa = PackedActs::new();
        xa.prepare(&x);
        let rb = ty.row_bytes(cols).unwrap();
        for simd in [true, false] {
            for n in [1, nt] {
                let mut y = vec![0f32; n * rows];
                let mut one = QuantizedActs::new();
                one.quantize(&xf[..n * cols], n, cols, GgmlType::Q8_0);
                let mut oa = PackedActs::new();
                oa.prepare(&one);
                matmul_packed_with(&pool, &mut [(&w, &mut y)], &one, &oa, simd, Chain::Default);
                for t in 0..n {
                    let mut xd = vec![0f32; cols];
                    dequantize_row(GgmlType::Q8_0, x.row(t), &mut xd);
                    for r in 0..rows {
                        let mut wd = vec![0f32; cols];
                        dequantize_row(ty, &data[r * rb..(r + 1) * rb], &mut wd);
                        let exact: f64 =
                            wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let got = y[t * rows + r] as f64;
                        assert!(
                            (got - exact).abs() <= 1e-5 * exact.abs().max(1.0),
                            "{ty} simd={simd} {n} tokens, token {t} row {r}: {got} vs {exact}"
                        );
                    }
                }
            }
        }
    }
}

/// Packed Q4_0, IQ4_NL and MXFP4 compute what llama.cpp's kernels for its repacked Q4_0,
/// IQ4_NL and MXFP4 matrices compute (the one-row kernels `--exact` uses for matrices of whole groups of 8 rows:
/// one `fma(isum, dw·dx, acc)` per block, in block order), bit for bit, for every token count,
/// with the SIMD kernels and the scalar ones.
#[test]
fn q4_0_and_iq4_nl_packed_have_llama_cpps_repacked_bits() {
    let mut rng = Rng(17);
    let pool = ThreadPool::new(2);
    for ty in [GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::MXFP4] {
        for (rows, cols) in [(8, 32), (24, 896), (64, 4864)] {
            let data = matrix(&mut rng, ty, rows, cols);
            let qm = QMatrix {
                ty,
                data: &data,
                rows,
                cols,
            };
            let w = pack(&qm).unwrap();
            for nt in [1, 2, 3, 4, 5, 9, 40] {
                let (x, xa) = acts(&mut rng, nt, cols);
                let mut want = vec![0f32; nt * rows];
                crate::kernels::matmul::matmul(&pool, &qm, &x, &mut want);
                let (mut simd, mut scalar) = (vec![0f32; nt * rows], vec![0f32; nt * rows]);
                matmul_packed_with(&pool, &mut [(&w, &mut simd)], &x, &xa, true, Chain::Default);
                matmul_packed_with(
                    &pool,
                    &mut [(&w, &mut scalar)],
                    &x,
                    &xa,
                    false,
                    Chain::Default,
                );
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                let at = format!("{ty} {rows}x{cols}, {nt} tokens");
                assert_eq!(bits(&scalar), bits(&want), "{at}: scalar");
                assert_eq!(bits(&simd), bits(&want), "{at}: SIMD");
            }
        }
    }
}

/// Random Q6_K rows: scales of both signs, any six-bit values.
pub(super) fn random_q6_k(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut byte = || ((rng.f32() + 1.0) * 128.0) as u8;
    let mut data = vec![0u8; rows * cols / 256 * 210];
    for (i, b) in data.chunks_exact_mut(210).enumerate() {
        for v in &mut b[..208] {
            *v = byte();
        }
        // Scales up to ±127 (the extremes included), as llama-quantize writes them.
        b[192] = 0x81;
        b[193] = 0x7F;
        let d = half::f16::from_f32(0.0002 * (1 + i % 11) as f32);
        b[208..210].copy_from_slice(&d.to_le_bytes());
    }
    data
}
