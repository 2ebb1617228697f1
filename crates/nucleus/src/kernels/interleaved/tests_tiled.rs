//! The types that llama.cpp computes a prompt of with its tiled kernel on x86 (Q3_K, Q5_K, Q6_K,
//! IQ4_XS): repacked, every token count gives that kernel's bits, with the SIMD kernels and the
//! scalar ones: the same bits for a token alone and among many.

use super::pack::pack;
use super::tests::{random_q6_k, wide_q8_k_acts};
use super::*;
use crate::kernels::matmul::{matmul_rows, PromptSlot, QMatrix};
use crate::kernels::test_rng::Rng;

/// Random blocks of `bytes` for `rows × cols` values: `fill(i, block)` sets block `i`'s scales
/// after its bytes were drawn at random (every seventh block's are zeros instead, for the
/// types whose extremes sit there).
fn random_blocks(
    rng: &mut Rng,
    (rows, cols, bytes): (usize, usize, usize),
    fill: impl Fn(usize, &mut [u8]),
) -> Vec<u8> {
    let mut byte = || ((rng.f32() + 1.0) * 128.0) as u8;
    let mut data = vec![0u8; rows * cols / 256 * bytes];
    for (i, b) in data.chunks_exact_mut(bytes).enumerate() {
        for v in b.iter_mut() {
            *v = byte();
        }
        fill(i, b);
    }
    data
}

/// Random Q5_K rows: scales of different sizes, any six-bit scales and mins, any values; every
/// seventh block at the extremes (every value 31, every scale and min 63), where the 16-bit
/// sums of the AVX2 kernel come closest to their limit.
pub(super) fn random_q5_k(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    random_blocks(rng, (rows, cols, 176), |i, b| {
        if i % 7 == 3 {
            b.fill(0xFF);
        }
        let d = half::f16::from_f32(0.001 * (1 + i % 13) as f32);
        let dmin = half::f16::from_f32(0.0005 * (1 + i % 5) as f32);
        b[0..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&dmin.to_le_bytes());
    })
}

/// Random IQ4_XS rows: any nibbles and six-bit scales (−32..=31 once offset); every seventh
/// block at the extremes (every index 1, the table's −127, and the scale −32).
pub(super) fn random_iq4_xs(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    random_blocks(rng, (rows, cols, 136), |i, b| {
        if i % 7 == 3 {
            b[2..8].fill(0);
            b[8..].fill(0x11);
        }
        let d = half::f16::from_f32(0.0005 * (1 + i % 11) as f32);
        b[0..2].copy_from_slice(&d.to_le_bytes());
    })
}

/// Random Q3_K rows: any values and six-bit scales; every seventh block at the extremes
/// (every value −4, every scale −32).
fn random_q3_k(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    random_blocks(rng, (rows, cols, 110), |i, b| {
        if i % 7 == 3 {
            b[..108].fill(0);
        }
        let d = half::f16::from_f32(0.0005 * (1 + i % 11) as f32);
        b[108..110].copy_from_slice(&d.to_le_bytes());
    })
}

/// Repacked `ty` (random rows from `random`, `group_block` bytes a packed group-block) computes
/// what `--exact` computes for a prompt's rows (`matmul_rows` with every row a prompt's: the
/// tiled kernel), bit for bit, for 1 to 100 tokens: the 256-bit kernels for few, the 512-bit
/// ones past their threshold where the CPU has AVX-512 VNNI, and the scalar ones.
fn packed_has_the_tiled_kernels_bits(
    ty: GgmlType,
    random: fn(&mut Rng, usize, usize) -> Vec<u8>,
    group_block: usize,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let pool = ThreadPool::new(2);
    for (rows, cols) in [(8, 256), (24, 768), (64, 4864)] {
        let data = random(&mut rng, rows, cols);
        let qm = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        let w = pack(&qm).unwrap();
        assert_eq!(w.bytes(), rows / 8 * cols / 256 * group_block);
        for nt in [1, 2, 3, 4, 5, 8, 9, 17, 40, 100] {
            let x = wide_q8_k_acts(&mut rng, nt, cols);
            let none = PackedActs::new();
            let mut want = vec![0f32; nt * rows];
            matmul_rows(&pool, &qm, &x, &mut want, &vec![PromptSlot::BATCHED; nt]);
            let (mut simd, mut scalar) = (vec![0f32; nt * rows], vec![0f32; nt * rows]);
            for (out, simd) in [(&mut simd, true), (&mut scalar, false)] {
                matmul_packed_with(&pool, &mut [(&w, out)], &x, &none, simd, Chain::Default);
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&scalar),
                bits(&want),
                "{ty} {rows}x{cols}, {nt}: scalar"
            );
            assert_eq!(bits(&simd), bits(&want), "{ty} {rows}x{cols}, {nt}: SIMD");
        }
    }
}

/// Q5_K: per super-block r = fma(−dmin, imin, isum·d), then one FMA with dy.
#[test]
fn q5_k_packed_has_the_tiled_kernels_bits() {
    packed_has_the_tiled_kernels_bits(GgmlType::Q5_K, random_q5_k, 1440, 17);
}

/// IQ4_XS: per super-block `fma(isum·d, dy, acc)`.
#[test]
fn iq4_xs_packed_has_the_tiled_kernels_bits() {
    packed_has_the_tiled_kernels_bits(GgmlType::IQ4_XS, random_iq4_xs, 1104, 18);
}

/// Q3_K: per super-block `fma(isum·d, dy, acc)`.
#[test]
fn q3_k_packed_has_the_tiled_kernels_bits() {
    packed_has_the_tiled_kernels_bits(GgmlType::Q3_K, random_q3_k, 912, 19);
}

/// Q6_K (`dot_q6_k_batched`): per super-block `fma(isum·d, dy, acc)`; the file's bytes,
/// rearranged (1680 = 8 × 210 a group-block).
#[test]
fn q6_k_packed_has_the_tiled_kernels_bits() {
    packed_has_the_tiled_kernels_bits(GgmlType::Q6_K, random_q6_k, 1680, 16);
}
