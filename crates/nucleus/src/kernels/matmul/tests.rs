use super::*;
use crate::kernels::test_rng::Rng;
use crate::quant::{biased_q8_0, dequantize_row, quantize_row};
use GgmlType::*;

fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let mut out = vec![0u8; rb * rows];
    if matches!(ty, Q4_K | Q5_K | Q6_K) {
        for b in out.iter_mut() {
            *b = (rng.next() >> 56) as u8;
        }
        let bs = ty.block_layout().1;
        for blk in out.chunks_exact_mut(bs) {
            let d = half::f16::from_f32(0.002 + 0.01 * rng.f32().abs()).to_le_bytes();
            let m = half::f16::from_f32(0.001 + 0.01 * rng.f32().abs()).to_le_bytes();
            if ty == Q6_K {
                blk[208..210].copy_from_slice(&d);
            } else {
                blk[0..2].copy_from_slice(&d);
                blk[2..4].copy_from_slice(&m);
            }
        }
    } else {
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
        for (r, dst) in out.chunks_exact_mut(rb).enumerate() {
            quantize_row(ty, &x[r * cols..(r + 1) * cols], dst);
        }
    }
    out
}

#[test]
fn matmul_matches_f64_reference() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let types = [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
    ];
    let mut scratch = QuantizedActs::new();
    for &ty in &types {
        let cols = if ty.block_size() == 256 { 512 } else { 96 };
        for &rows in &[1usize, 7, 37, 61] {
            let wdata = random_matrix(&mut rng, ty, rows, cols);
            let w = QMatrix {
                ty,
                data: &wdata,
                rows,
                cols,
            };
            let mut wd = vec![0f32; rows * cols];
            for r in 0..rows {
                let rb = ty.row_bytes(cols).unwrap();
                dequantize_row(
                    ty,
                    &wdata[r * rb..(r + 1) * rb],
                    &mut wd[r * cols..(r + 1) * cols],
                );
            }
            for &nt in &[1usize, 2, 3, 5, 8, 17] {
                let x: Vec<f32> = (0..nt * cols).map(|_| rng.f32() * 2.0).collect();
                for pool in &pools {
                    let mut y = vec![f32::NAN; nt * rows];
                    matmul_f32(pool, &w, &x, nt, &mut y, &mut scratch);
                    let vt = scratch.ty();
                    let mut xd = vec![0f32; cols];
                    for t in 0..nt {
                        dequantize_row(vt, scratch.row(t), &mut xd);
                        for r in 0..rows {
                            let wr = &wd[r * cols..(r + 1) * cols];
                            let exact: f64 =
                                wr.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
                            let mag: f64 = wr
                                .iter()
                                .zip(&xd)
                                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                                .sum();
                            let rel = if matches!(ty, Q4_1 | Q5_1) {
                                2e-3
                            } else {
                                2e-5
                            };
                            let got = y[t * rows + r] as f64;
                            assert!(
                                (got - exact).abs() <= rel * mag + 1e-5,
                                "{ty} rows={rows} nt={nt} threads={} t={t} r={r}: {got} vs {exact}",
                                pool.n_threads()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "matmul: activations are")]
fn wrong_act_type_panics() {
    let pool = ThreadPool::new(1);
    let data = vec![0u8; 18];
    let w = QMatrix {
        ty: Q4_0,
        data: &data,
        rows: 1,
        cols: 32,
    };
    let mut x = QuantizedActs::new();
    x.quantize(&[0.0; 32], 1, 32, Q8_1);
    matmul(&pool, &w, &x, &mut [0.0]);
}

#[test]
fn scratch_grows_only() {
    let mut x = QuantizedActs::new();
    x.quantize(&vec![1.0; 4 * 256], 4, 256, Q8_K);
    let cap = x.buf.len();
    x.quantize(&[1.0; 256], 1, 256, Q8_K);
    assert_eq!(x.buf.len(), cap);
    assert_eq!((x.n_tokens(), x.cols(), x.ty()), (1, 256, Q8_K));
}

/// Q8_0, Q5_0 and Q4_0 with many tokens take other kernels than one token does (rows unpacked
/// to Q8_0 per row chunk; with AVX-512 VNNI, tiles of rows by tokens over rows stored biased):
/// every output must be the one-row kernel's bits, the arithmetic of llama.cpp's
/// `ggml_vec_dot_*_q8_0`. Raw weight bytes reach -128 (which quantizing never writes); the
/// activations reach ±127; row and token counts leave partial tiles, block counts a tail of
/// fewer than four blocks.
#[test]
fn many_token_products_have_the_one_row_kernels_bits() {
    let mut rng = Rng(0x5eed_b1a5_0f0f_7777);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let mut scratch = QuantizedActs::new();
    eprintln!(
        "simd level {:?}, biased VNNI tiles: {}",
        crate::quant::simd_level(),
        biased_q8_0().is_some()
    );
    for ty in [Q8_0, Q5_0, Q4_0] {
        for &(rows, cols) in &[(5usize, 96usize), (13, 160), (37, 256), (6, 896)] {
            let rb = ty.row_bytes(cols).unwrap();
            let (bs, qs) = match ty {
                Q8_0 => (34, 2),
                Q5_0 => (22, 2),
                _ => (18, 2),
            };
            let mut wdata = vec![0u8; rb * rows];
            for blk in wdata.chunks_exact_mut(bs) {
                for b in blk[qs..].iter_mut() {
                    *b = (rng.next() >> 56) as u8;
                }
                let d = half::f16::from_f32(0.001 + 0.02 * rng.f32().abs());
                blk[..2].copy_from_slice(&d.to_le_bytes());
            }
            // A row of -128s (Q8_0) or of the smallest integers (Q4_0/Q5_0: all bits clear).
            for blk in wdata[..rb].chunks_exact_mut(bs) {
                blk[qs..].fill(if ty == Q8_0 { 0x80 } else { 0 });
            }
            let w = QMatrix {
                ty,
                data: &wdata,
                rows,
                cols,
            };
            for &nt in &[8usize, 9, 33, 70] {
                let mut x: Vec<f32> = (0..nt * cols).map(|_| rng.f32() * 3.0).collect();
                // One token at the extremes: every block ±127 after quantizing.
                for (i, v) in x[..cols].iter_mut().enumerate() {
                    *v = if i % 3 == 0 { -1.0 } else { 1.0 };
                }
                for pool in &pools {
                    let mut y = vec![f32::NAN; nt * rows];
                    matmul_f32(pool, &w, &x, nt, &mut y, &mut scratch);
                    for t in 0..nt {
                        for r in 0..rows {
                            let want = crate::quant::vec_dot(
                                ty,
                                &wdata[r * rb..(r + 1) * rb],
                                scratch.row(t),
                                cols,
                            );
                            let got = y[t * rows + r];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{ty} {rows}x{cols}, {nt} tokens, {} threads: t={t} r={r}: {got} vs {want}",
                                pool.n_threads()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Rows quantized by the pool's threads are the rows quantized one by one, byte for byte,
/// whatever the split (row counts that do not divide among the threads, a last run short).
#[test]
fn activations_quantized_in_the_pool_have_the_serial_bytes() {
    let mut rng = Rng(0x0a11_ce5e_edf0_0d42);
    for threads in [2, 3] {
        let pool = ThreadPool::new(threads);
        for (ty, cols) in [(Q8_0, 896), (Q8_K, 4864), (Q8_1, 640), (F16, 256)] {
            for n in [1, 5, 7, 64, 101] {
                let x: Vec<f32> = (0..n * cols).map(|_| 3.0 * rng.f32()).collect();
                let (mut serial, mut pooled) = (QuantizedActs::new(), QuantizedActs::new());
                serial.quantize(&x, n, cols, ty);
                pooled.quantize_in(&pool, &x, n, cols, ty);
                let rb = serial.row_bytes;
                assert_eq!(pooled.row_bytes, rb);
                assert!(
                    serial.buf[..n * rb] == pooled.buf[..n * rb],
                    "{ty} × {n} rows of {cols}, {threads} threads"
                );
            }
        }
    }
}

/// Rows gathered from a batch's quantization are the bytes of quantizing those rows alone, in
/// the order asked for, repeats included (a mixture of experts' tokens gathered per expert).
#[test]
fn gathered_rows_are_the_rows_quantized() {
    let mut rng = Rng(41);
    let (n, cols) = (7, 512);
    let x: Vec<f32> = (0..n * cols)
        .map(|i| rng.f32() * (1 + i % 9) as f32)
        .collect();
    for ty in [Q8_K, Q8_0] {
        let mut all = QuantizedActs::new();
        all.quantize(&x, n, cols, ty);
        let pick = [5usize, 0, 3, 3, 6];
        let mut got = QuantizedActs::new();
        got.gather(&all, pick.iter().copied());
        let rows: Vec<f32> = pick
            .iter()
            .flat_map(|&t| x[t * cols..(t + 1) * cols].iter().copied())
            .collect();
        let mut want = QuantizedActs::new();
        want.quantize(&rows, pick.len(), cols, ty);
        assert_eq!((got.n_tokens(), got.cols(), got.ty()), (5, cols, ty));
        for r in 0..pick.len() {
            assert_eq!(got.row(r), want.row(r), "{ty:?} row {r}");
        }
    }
}
