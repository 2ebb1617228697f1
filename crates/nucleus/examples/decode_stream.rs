//! How close the one-row (decode) products come to the machine's read bandwidth, type by type,
//! on matrices that stream from DRAM as a real model's do: `copies` packed copies of one
//! matrix (together far larger than the last-level cache), each multiplied by one activation
//! row in turn, timed against a plain read of the same packed bytes by the same threads.
//!
//! `cargo run --release -p nucleus --example decode_stream [threads] [Q4_K,Q5_K,Q6_K,IQ4_XS,Q3_K,Q8_0,Q5_0,Q4_0,IQ4_NL,MXFP4]`;
//! `DECODE_SHAPE=rows,cols` (default 18944,3584: a Qwen2.5-7B `ffn_up`), `DECODE_MB` the
//! total size of the copies (default 1024), `NUCLEUS_HUGE_PAGES=1` packs into 2 MiB pages,
//! `DECODE_CHAIN=default` takes Q4_K in one FMA per super-block instead of the model's chain
//! (one per pair of sub-blocks).
//!
//! A decode step reads each weight once: `product GB/s ÷ read GB/s` is the share of the
//! bandwidth the kernel itself leaves unused, before any of the forward pass's other costs.

mod common;

use std::time::Instant;

use nucleus::kernels::interleaved::{matmul_packed_chain, pack, Chain, PackedActs, PackedMatrix};
use nucleus::kernels::{QMatrix, QuantizedActs, ThreadPool};
use nucleus::quant::quantize::quantize_rows;
use nucleus::quant::{simd_level, vec_dot_type, GgmlType};

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let only = std::env::args().nth(2).unwrap_or("Q4_K,Q6_K,Q8_0".into());
    let pool = ThreadPool::new(threads);
    let (rows, cols) = common::shape_from_env("DECODE_SHAPE", (18944, 3584));
    let total_mb: usize = std::env::var("DECODE_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    // The chain the model's own arithmetic takes for Q4_K here (`Chain::fast`);
    // DECODE_CHAIN=default: one FMA per super-block, DECODE_CHAIN=pairs: one per pair.
    let chain = match std::env::var("DECODE_CHAIN").as_deref() {
        Ok("default") => Chain::Default,
        Ok("pairs") => Chain::Q4kPairs,
        _ => Chain::fast(),
    };
    println!(
        "simd level {:?}, {threads} threads, W {rows}x{cols}, copies totalling {total_mb} MB, huge pages {}, chain {chain:?}",
        simd_level(),
        nucleus::kernels::interleaved::huge_pages::wanted()
    );
    for name in only.split(',') {
        let Some(ty) = TYPES.into_iter().find(|t| t.name() == name) else {
            eprintln!("decode_stream: {name}: not one of Q4_K, Q5_K, Q6_K, IQ4_XS, Q3_K, Q8_0, Q5_0, Q4_0, IQ4_NL, MXFP4");
            std::process::exit(2);
        };
        let data = random_matrix(ty, rows, cols);
        let w = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        let one = pack(&w).expect("a packable shape");
        let copies = (total_mb << 20).div_ceil(one.bytes()).max(2);
        let mats: Vec<PackedMatrix> = (0..copies).map(|_| pack(&w).unwrap()).collect();
        drop(one);
        let bytes: usize = mats.iter().map(|m| m.bytes()).sum();
        let read = best_of(5, || read_all(&pool, &mats));
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 7919) % 255) as f32 / 128.0 - 1.0)
            .collect();
        let mut acts = QuantizedActs::new();
        acts.quantize(&x, 1, cols, vec_dot_type(ty));
        let mut pa = PackedActs::new();
        if acts.ty() == GgmlType::Q8_0 {
            pa.prepare(&acts);
        }
        let mut y = vec![0f32; rows];
        let product = best_of(5, || {
            for m in &mats {
                matmul_packed_chain(&pool, m, &acts, &pa, &mut y, chain);
            }
        });
        let (rg, pg) = (bytes as f64 / read / 1e9, bytes as f64 / product / 1e9);
        println!(
            "{:>5}: {copies} copies, {:.0} MB packed: read {rg:5.1} GB/s, one-row products {pg:5.1} GB/s ({:.0} % of the read)",
            ty.name(),
            bytes as f64 / 1e6,
            100.0 * pg / rg
        );
    }
}

/// The types measured: the repacked ones of real K-quant files, and the 32-value block types
/// (MXFP4: gpt-oss's experts).
const TYPES: [GgmlType; 10] = [
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
    GgmlType::Q3_K,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::MXFP4,
];

/// Random weights of `ty` with sane scales.
fn random_matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut seed = 0x2545F4914F6CDD1Du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let rb = ty.row_bytes(cols).expect("whole blocks");
    let mut data = vec![0u8; rb * rows];
    if ty == GgmlType::Q8_0 {
        let wf: Vec<f32> = (0..rows * cols)
            .map(|_| (rnd() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            .collect();
        quantize_rows(ty, &wf, cols, &mut data).expect("Q8_0 quantizes");
        return data;
    }
    for b in data.iter_mut() {
        *b = (rnd() >> 56) as u8;
    }
    let (_, bs) = ty.block_layout();
    // Where each block keeps its f16 scale (and Q4_K's and Q5_K's dmin after it).
    let at = match ty {
        GgmlType::Q6_K => 208,
        GgmlType::Q3_K => 108,
        _ => 0,
    };
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    for blk in data.chunks_exact_mut(bs) {
        if ty == GgmlType::MXFP4 {
            blk[0] = 120; // E8M0: 2^-7
            continue;
        }
        blk[at..at + 2].copy_from_slice(&scale);
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
            blk[2..4].copy_from_slice(&scale);
        }
    }
    data
}

/// Every byte of `mats` read once, each matrix split between the pool's threads as the
/// products split it (contiguous halves).
fn read_all(pool: &ThreadPool, mats: &[PackedMatrix]) {
    for m in mats {
        let raw = m.raw();
        pool.run(|i, n| {
            let per = raw.len().div_ceil(n).next_multiple_of(64);
            let part = &raw[(i * per).min(raw.len())..((i + 1) * per).min(raw.len())];
            std::hint::black_box(sum_bytes(part));
        });
    }
}

/// A reduction over `b` that the compiler cannot drop, with the widest loads the CPU has (the
/// loop of `scripts/machine_limits.c`).
fn sum_bytes(b: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F is present (checked above).
        return unsafe { sum_bytes_avx512(b) };
    }
    let mut acc = [0u64; 8];
    let mut chunks = b.chunks_exact(64);
    for c in &mut chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            *a ^= u64::from_le_bytes(c[8 * k..8 * k + 8].try_into().unwrap());
        }
    }
    acc.iter()
        .fold(chunks.remainder().len() as u64, |s, a| s ^ a)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_bytes_avx512(b: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let mut chunks = b.chunks_exact(256);
    for c in &mut chunks {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: bytes 64k..64k + 64 lie in the 256-byte chunk `c`.
            *a = _mm512_add_epi64(*a, unsafe {
                _mm512_loadu_si512(c.as_ptr().add(64 * k) as *const _)
            });
        }
    }
    let s = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    _mm512_reduce_add_epi64(s) as u64 ^ chunks.remainder().len() as u64
}

/// The fastest of at least `n` timed calls (more while under a second has passed: the
/// cache-resident sizes take milliseconds), after one warm-up, in seconds.
fn best_of(n: usize, mut f: impl FnMut()) -> f64 {
    f();
    let (t0, mut best, mut done) = (Instant::now(), f64::INFINITY, 0);
    while done < n || t0.elapsed().as_secs_f64() < 1.0 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        done += 1;
    }
    best
}
