//! Round trips through the dequantizers, and the checks of `quantize_rows`. Byte equality with
//! llama-quantize is tested on committed fixtures in `tests/suite/quantize.rs`.

use super::*;
use crate::quant::dequantize_row;
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};

fn sample(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let u = (rng.next_u32() >> 8) as f32 / (1 << 24) as f32 - 0.5;
            // A few outliers per row, as real weights have.
            if i % 97 == 0 {
                8.0 * u
            } else {
                u
            }
        })
        .collect()
}

/// Root-mean-square error of a round trip, relative to the values' RMS.
fn relative_rmse(ty: GgmlType, x: &[f32]) -> f32 {
    let mut q = vec![0u8; ty.row_bytes(x.len()).unwrap()];
    quantize_rows(ty, x, x.len(), &mut q).unwrap();
    let mut back = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut back);
    let err: f32 = x.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum();
    let rms: f32 = x.iter().map(|a| a * a).sum();
    (err / rms).sqrt()
}

#[test]
fn k_quants_round_trip_within_their_precision() {
    let x = sample(4096, 7);
    // Bounds a little above what each type's bits give on uniform values with outliers.
    for (ty, bound) in [
        (GgmlType::Q4_K, 0.12),
        (GgmlType::Q5_K, 0.06),
        (GgmlType::Q6_K, 0.03),
    ] {
        let e = relative_rmse(ty, &x);
        assert!(e < bound, "{ty}: relative RMSE {e}");
    }
    // More bits, less error.
    assert!(relative_rmse(GgmlType::Q6_K, &x) < relative_rmse(GgmlType::Q5_K, &x));
    assert!(relative_rmse(GgmlType::Q5_K, &x) < relative_rmse(GgmlType::Q4_K, &x));
}

#[test]
fn zero_rows_quantize_to_zero_blocks() {
    let x = vec![0f32; 256];
    for ty in [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let mut q = vec![0xAAu8; ty.row_bytes(256).unwrap()];
        quantize_rows(ty, &x, 256, &mut q).unwrap();
        assert!(q.iter().all(|&b| b == 0), "{ty}: {q:?}");
    }
}

#[test]
fn bad_shapes_are_errors() {
    let x = vec![1f32; 96];
    let mut q = vec![0u8; 1024];
    let err = quantize_rows(GgmlType::Q4_K, &x, 96, &mut q).unwrap_err();
    assert!(err.contains("96") && err.contains("Q4_K"), "{err}");
    let err = quantize_rows(GgmlType::Q8_0, &x, 96, &mut q).unwrap_err();
    assert!(err.contains("bytes"), "{err}");
    let err = quantize_rows(GgmlType::IQ2_XXS, &x, 96, &mut q).unwrap_err();
    assert!(err.contains("IQ2_XXS"), "{err}");
}

/// MXFP4 blocks as gguf-py quantizes them (`scripts/gen_mxfp4_fixture.py`: magnitudes from
/// 2^-130 to 2^20, zeros, exact ties between table entries): the same bytes.
#[test]
fn mxfp4_matches_gguf_py() {
    let blob: &[u8] = include_bytes!("../testdata/mxfp4_quantize_gguf_py.bin");
    let n = u32::from_le_bytes(blob[0..4].try_into().unwrap()) as usize;
    let x: Vec<f32> = blob[4..4 + 4 * n]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let want = &blob[4 + 4 * n..];
    let mut got = vec![0u8; GgmlType::MXFP4.row_bytes(n).unwrap()];
    quantize_rows(GgmlType::MXFP4, &x, n, &mut got).unwrap();
    assert_eq!(got.len(), want.len());
    for (b, (g, w)) in got.chunks_exact(17).zip(want.chunks_exact(17)).enumerate() {
        assert_eq!(g, w, "block {b}");
    }
}
