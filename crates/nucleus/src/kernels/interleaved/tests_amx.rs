//! The AMX tile path ([`super::amx`]): the same bits as the vector and scalar kernels for
//! every type it takes, with the tiles emulated (any AVX-512 machine) and, where the CPU has
//! AMX, with the instructions; and a token's outputs do not depend on the others in its
//! prompt, nor on whether they came alone (decode, vector kernels) or among many (tiles).

use super::tests::{acts, matrix, packed, random_q4_k, random_q6_k, wide_q8_k_acts};
use super::*;
use crate::kernels::test_rng::Rng;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// One product of `w` by `x`: `how` 0 scalar, 1 vectors or hardware tiles (as chosen for
/// this CPU), 2 emulated tiles.
fn product(
    w: &PackedMatrix,
    x: &QuantizedActs,
    acts: &PackedActs,
    chain: Chain,
    how: u8,
) -> Vec<f32> {
    let pool = ThreadPool::new(2);
    let mut y = vec![0f32; x.n_tokens() * w.rows()];
    matmul_packed_tiles(
        &pool,
        &mut [(w, &mut y)],
        x,
        acts,
        how != 0,
        chain,
        how == 2,
    );
    y
}

/// The rows of tokens `t` alone (one-token products: the decode kernels).
fn one_at_a_time(w: &PackedMatrix, x: &QuantizedActs, chain: Chain) -> Vec<f32> {
    let (nt, cols) = (x.n_tokens(), x.cols());
    let mut out = Vec::new();
    for t in 0..nt {
        let one = x.copy_row(t);
        let mut a = PackedActs::new();
        if one.ty() == GgmlType::Q8_0 {
            a.prepare(&one);
        }
        out.extend(product(w, &one, &a, chain, 1));
        assert_eq!(one.cols(), cols);
    }
    out
}

fn check(w: &PackedMatrix, x: &QuantizedActs, acts: &PackedActs, chain: Chain, what: &str) {
    let nt = x.n_tokens();
    assert_eq!(
        tile_use(w.ty(), nt, true, true),
        TileUse::Emulated,
        "{what}: the tiles must be what is tested"
    );
    let want = bits(&product(w, x, acts, chain, 0));
    assert_eq!(
        bits(&product(w, x, acts, chain, 2)),
        want,
        "{what}: emulated tiles"
    );
    assert_eq!(
        bits(&product(w, x, acts, chain, 1)),
        want,
        "{what}: this CPU's path"
    );
    assert_eq!(
        bits(&one_at_a_time(w, x, chain)),
        want,
        "{what}: one token at a time"
    );
}

const TOKENS: [usize; 5] = [5, 16, 17, 33, 40];

#[test]
fn tiles_have_the_vector_kernels_bits_for_32_value_blocks() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx512 {
        eprintln!("skipped: the tile folds need AVX-512");
        return;
    }
    let mut rng = Rng(41);
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::IQ4_NL,
        GgmlType::MXFP4,
    ] {
        for (rows, cols) in [(8, 32), (24, 96), (64, 896)] {
            let data = matrix(&mut rng, ty, rows, cols);
            let w = packed(ty, &data, rows, cols);
            for nt in TOKENS {
                let (x, a) = acts(&mut rng, nt, cols);
                check(
                    &w,
                    &x,
                    &a,
                    Chain::Default,
                    &format!("{ty:?} {rows}x{cols}, {nt} tokens"),
                );
            }
        }
    }
}

#[test]
fn tiles_have_the_vector_kernels_bits_for_q4_k_and_q6_k() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx512 {
        eprintln!("skipped: the tile folds need AVX-512");
        return;
    }
    let mut rng = Rng(42);
    let none = PackedActs::new();
    for (rows, cols) in [(8, 256), (24, 768), (64, 4864)] {
        for nt in TOKENS {
            let x = wide_q8_k_acts(&mut rng, nt, cols);
            let ty = GgmlType::Q4_K;
            let data = random_q4_k(&mut rng, rows, cols);
            let w = packed(ty, &data, rows, cols);
            for chain in [Chain::Default, Chain::Q4kPairs] {
                check(
                    &w,
                    &x,
                    &none,
                    chain,
                    &format!("Q4_K {chain:?} {rows}x{cols}, {nt} tokens"),
                );
            }
            let ty = GgmlType::Q6_K;
            let data = random_q6_k(&mut rng, rows, cols);
            let w = packed(ty, &data, rows, cols);
            check(
                &w,
                &x,
                &none,
                Chain::Default,
                &format!("Q6_K {rows}x{cols}, {nt} tokens"),
            );
        }
    }
}

/// The tiles take full-range values without saturating: weights and activations of −128 and
/// 127 (Q8_0), the largest Q6_K scales.
#[test]
fn tiles_take_extreme_values() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx512 {
        return;
    }
    let (rows, cols, nt) = (16, 256, 20);
    let mut data = vec![0u8; rows * cols / 32 * 34];
    for (i, b) in data.chunks_exact_mut(34).enumerate() {
        b[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        for (k, v) in b[2..].iter_mut().enumerate() {
            *v = if (i + k) % 3 == 0 { 0x80 } else { 0x7F };
        }
    }
    let w = packed(GgmlType::Q8_0, &data, rows, cols);
    let xf: Vec<f32> = (0..nt * cols)
        .map(|i| if i % 5 == 0 { -1.0 } else { 1.0 })
        .collect();
    let mut x = QuantizedActs::new();
    x.quantize(&xf, nt, cols, GgmlType::Q8_0);
    let mut a = PackedActs::new();
    a.prepare(&x);
    check(&w, &x, &a, Chain::Default, "Q8_0 at ±127/−128");
}

/// What `nucleus bench` reports: on this CPU, the tiles run exactly when the CPU lists
/// AMX-INT8 and the kernel grants the tile state (or are off by `NUCLEUS_AMX=0`).
#[test]
fn amx_is_used_only_where_the_cpu_has_it() {
    #[cfg(target_arch = "x86_64")]
    {
        let cpu_has = std::arch::x86_64::__cpuid_count(7, 0).edx & (1 << 25) != 0;
        if !cpu_has {
            assert!(!amx::uses_amx());
            assert!(amx::amx_refusal().is_some());
        }
        if amx::uses_amx() {
            assert_eq!(
                tile_use(GgmlType::Q4_K, 512, true, false),
                TileUse::Hardware
            );
            assert_eq!(tile_use(GgmlType::Q8_0, 32, true, false), TileUse::Hardware);
            assert_eq!(tile_use(GgmlType::Q8_0, 4, true, false), TileUse::No);
            assert_eq!(tile_use(GgmlType::F16, 32, true, false), TileUse::No);
        } else {
            assert_eq!(tile_use(GgmlType::Q4_K, 32, true, false), TileUse::No);
        }
        eprintln!("AMX: {}", amx::amx_refusal().unwrap_or("on"));
    }
}
