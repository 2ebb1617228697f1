//! Micro benchmark of the quantized matmul: a 896-row × 4864-col weight matrix (the shape of a
//! Qwen2-0.5B `ffn_down`) times n_tokens activation rows.
//!
//! `cargo run --release -p nucleus --example matmul_bench [threads] [Q8_0,Q5_0,...]`; `NUCLEUS_SIMD` caps the
//! SIMD level.

use std::time::Instant;

use nucleus::kernels::{matmul, QMatrix, QuantizedActs, ThreadPool};
use nucleus::quant::{quantize_row, simd_level, vec_dot_type, GgmlType};

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let pool = ThreadPool::new(threads);
    // MATMUL_SHAPE=rows,cols overrides the shape (e.g. 262144,640: gemma-3's output).
    let (rows, cols) = std::env::var("MATMUL_SHAPE")
        .ok()
        .and_then(|v| {
            let (r, c) = v.split_once(',')?;
            Some((r.trim().parse().ok()?, c.trim().parse().ok()?))
        })
        .unwrap_or((896usize, 4864usize));
    println!(
        "simd level {:?}, {threads} threads, W {rows}x{cols}",
        simd_level()
    );
    let mut seed = 0x2545F4914F6CDD1Du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    let wf: Vec<f32> = (0..rows * cols).map(|_| rnd() * 0.1).collect();
    let only: Option<String> = std::env::args().nth(2);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_0,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::F16,
    ] {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|t| t == ty.name()))
        {
            continue;
        }
        let rb = ty.row_bytes(cols).unwrap();
        let mut data = vec![0u8; rb * rows];
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
            // No K-quant quantizer yet: random bits with sane scales.
            for b in data.iter_mut() {
                *b = (rnd().to_bits() >> 7) as u8;
            }
            let bs = ty.block_layout().1;
            let at = if ty == GgmlType::Q6_K { 208 } else { 0 };
            for blk in data.chunks_exact_mut(bs) {
                blk[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                if ty == GgmlType::Q4_K {
                    blk[2..4].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
            }
        } else {
            for (r, dst) in data.chunks_exact_mut(rb).enumerate() {
                quantize_row(ty, &wf[r * cols..(r + 1) * cols], dst);
            }
        }
        let w = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        for nt in [1usize, 4, 64] {
            let x: Vec<f32> = (0..nt * cols).map(|_| rnd()).collect();
            let mut acts = QuantizedActs::new();
            acts.quantize(&x, nt, cols, vec_dot_type(ty));
            let mut y = vec![0f32; nt * rows];
            for _ in 0..3 {
                matmul(&pool, &w, &acts, &mut y);
            }
            // The fastest of many calls: robust against other processes on a busy machine.
            let mut s = f64::INFINITY;
            let t = Instant::now();
            while t.elapsed().as_secs_f64() < 0.7 {
                let t1 = Instant::now();
                matmul(&pool, &w, &acts, &mut y);
                s = s.min(t1.elapsed().as_secs_f64());
            }
            let flops = 2.0 * (rows * cols * nt) as f64;
            let t_q = Instant::now();
            for _ in 0..10 {
                acts.quantize(&x, nt, cols, vec_dot_type(ty));
            }
            let sq = t_q.elapsed().as_secs_f64() / 10.0;
            println!(
                "{:>5} nt={nt:>3}: {:8.1} us  {:7.1} GFLOP/s  {:6.1} GB/s weights  (act quantize {:.1} us)",
                ty.name(),
                s * 1e6,
                flops / s / 1e9,
                data.len() as f64 / s / 1e9,
                sq * 1e6
            );
        }
    }
}
