//! The 512-bit prompt kernels ([`super::wide`]) at the edges of their integer ranges (every
//! weight and activation at its extreme, where partial sums kept in 16 bits would overflow
//! first), and their speed.

use super::pack::pack;
use super::*;
use crate::kernels::matmul::{matmul, matmul_rows, PromptSlot, QMatrix, QuantizedActs};

/// Q4_K rows whose nibbles are all 15 and whose six-bit scales and mins are all 63.
fn q4_k_at_the_top(rows: usize, cols: usize) -> Vec<u8> {
    let mut data = vec![0xFFu8; rows * cols / 256 * 144];
    for (i, b) in data.chunks_exact_mut(144).enumerate() {
        let d = half::f16::from_f32(0.001 * (1 + i % 3) as f32);
        b[0..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&half::f16::from_f32(0.0005).to_le_bytes());
    }
    data
}

/// `data` as a Q4_K matrix of `rows × cols`.
fn q4_k_matrix(data: &[u8], rows: usize, cols: usize) -> QMatrix<'_> {
    QMatrix {
        ty: GgmlType::Q4_K,
        data,
        rows,
        cols,
    }
}

/// Activations that quantize to Q8_K's extremes (ggml's Q8_K takes −127 to 127): token `t`'s
/// blocks all −127 (even `t`) or all 127 but the first value (odd `t`: that one a little larger
/// in magnitude and negative, the rest positive).
fn acts_at_the_extremes(nt: usize, cols: usize) -> QuantizedActs {
    let xf: Vec<f32> = (0..nt * cols)
        .map(|i| match ((i / cols) % 2, i % 256) {
            (0, _) => -1.0,
            (_, 0) => -1.001,
            _ => 1.0,
        })
        .collect();
    let mut x = QuantizedActs::new();
    x.quantize(&xf, nt, cols, GgmlType::Q8_K);
    x
}

/// Every Q4_K nibble and scale at its top and every activation at ±127: the largest integer
/// sums a Q4_K prompt kernel meets (±30480 a half sub-block, before the scales), where partial
/// sums kept in 16 bits would overflow first (a kernel that packed two halves' sums into one
/// lane's 16-bit halves passed the random tests with a split of 8 and 24 values, and failed
/// here). Every token count and both chains give the one-row kernels' bits (the default chain)
/// and `--exact`'s gemm's (the pairs).
#[test]
fn q4_k_prompts_at_the_extremes_keep_the_one_row_bits() {
    let pool = ThreadPool::new(2);
    let (rows, cols) = (32, 1024);
    let data = q4_k_at_the_top(rows, cols);
    let qm = q4_k_matrix(&data, rows, cols);
    let w = pack(&qm).unwrap();
    let none = PackedActs::new();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for nt in [2, 33, 40] {
        let x = acts_at_the_extremes(nt, cols);
        let q = x.row(0);
        assert!(
            q[4..260].iter().all(|&b| b as i8 == -127),
            "token 0 at −127"
        );
        let q = x.row(1);
        assert!(q[5..260].iter().all(|&b| b as i8 == 127), "token 1 at 127");
        let mut want = vec![0f32; nt * rows];
        matmul(&pool, &qm, &x, &mut want);
        let mut got = vec![0f32; nt * rows];
        matmul_packed_with(
            &pool,
            &mut [(&w, &mut got)],
            &x,
            &none,
            true,
            Chain::Default,
        );
        assert_eq!(bits(&got), bits(&want), "{nt} tokens, default chain");
        matmul_rows(&pool, &qm, &x, &mut want, &vec![PromptSlot::BATCHED; nt]);
        let pairs = Chain::Q4kPairs;
        matmul_packed_with(&pool, &mut [(&w, &mut got)], &x, &none, true, pairs);
        assert_eq!(bits(&got), bits(&want), "{nt} tokens, pairs chain");
    }
}

/// G multiply-adds a second of one thread in a prompt's Q4_K product (4096 × 4096, 64 tokens,
/// the weights hot in the caches), each chain: `cargo test --release -p nucleus --lib
/// wide_q4_k_speed -- --ignored --nocapture`. The 512-bit kernels with AVX-512 VNNI; where AMX
/// runs, the tiles (the products' own choice).
#[test]
#[ignore]
fn wide_q4_k_speed() {
    let pool = ThreadPool::new(1);
    let (rows, cols, nt) = (4096, 4096, 64);
    let mut rng = crate::kernels::test_rng::Rng(3);
    let data = super::tests::random_q4_k(&mut rng, rows, cols);
    let qm = q4_k_matrix(&data, rows, cols);
    let w = pack(&qm).unwrap();
    let x = super::tests::wide_q8_k_acts(&mut rng, nt, cols);
    let none = PackedActs::new();
    let mut y = vec![0f32; nt * rows];
    for chain in [Chain::Q4kPairs, Chain::Default] {
        let mut best = f64::MAX;
        for _ in 0..12 {
            let t = std::time::Instant::now();
            matmul_packed_with(&pool, &mut [(&w, &mut y)], &x, &none, true, chain);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let gmacs = (rows * cols * nt) as f64 / best / 1e9;
        println!("{chain:?}: {gmacs:.1} G MAC/s ({:.2} ms)", best * 1e3);
    }
}
