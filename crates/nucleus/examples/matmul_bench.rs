//! Micro benchmark of the quantized matmul: a 896-row × 4864-col weight matrix (the shape of a
//! Qwen2-0.5B `ffn_down`) times 1, 4, 16, 64 and 512 activation rows, in llama.cpp's arithmetic
//! (its one-row kernels, and its batched ones that `--exact` uses for a prompt's rows) and, for
//! the types nucleus repacks (Q8_0, Q5_0, Q4_0, IQ4_NL, MXFP4, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS),
//! in nucleus's interleaved one (`fast`), beside the machine's peak rate of 8-bit multiply-adds
//! (`vpmaddubsw` on every core, measured; and `vpdpbusd` where the CPU has AVX-512 VNNI).
//!
//! `cargo run --release -p nucleus --example matmul_bench [threads] [Q8_0,Q5_0,...]`;
//! `NUCLEUS_SIMD` caps the SIMD level, `NUCLEUS_AMX=0` keeps prompts off AMX tiles, and
//! `MATMUL_FAST_ONLY=1` times only the interleaved products, `MATMUL_CHAIN=pairs` takes Q4_K in
//! llama.cpp's gemm chain, `MATMUL_CHAIN=lanes` Q8_0 in its one-row kernel's (`--exact`'s).

mod common;

use std::time::Instant;

use nucleus::kernels::interleaved::{matmul_packed_chain, pack, Chain, PackedActs, PackedMatrix};
use nucleus::kernels::matmul::matmul_rows;
use nucleus::kernels::{matmul, PromptSlot, QMatrix, QuantizedActs, ThreadPool};
use nucleus::quant::quantize::quantize_rows;
use nucleus::quant::{simd_level, vec_dot_type, GgmlType};

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let pool = ThreadPool::new(threads);
    // MATMUL_SHAPE=rows,cols overrides the shape (e.g. 262144,640: gemma-3's output).
    let (rows, cols) = common::shape_from_env("MATMUL_SHAPE", (896, 4864));
    println!(
        "simd level {:?}, AMX {}, {threads} threads, W {rows}x{cols}",
        simd_level(),
        nucleus::quant::amx_status()
    );
    let fast_only = std::env::var("MATMUL_FAST_ONLY").is_ok_and(|v| v == "1");
    if let Some(peak) = peak_int8_macs(&pool) {
        println!(
            "peak: {:.1} G 8-bit MAC/s (vpmaddubsw on {threads} threads)",
            peak / 1e9
        );
    }
    if let Some(peak) = peak_vnni_macs(&pool) {
        println!(
            "peak: {:.1} G 8-bit MAC/s (vpdpbusd, 256-bit, on {threads} threads: the VNNI kernels' ceiling)",
            peak / 1e9
        );
    }
    let mut rnd = xorshift();
    let wf: Vec<f32> = (0..rows * cols).map(|_| rnd() * 0.1).collect();
    // MATMUL_ROWS=1,8,12 overrides the activation row counts.
    let row_counts: Vec<usize> = std::env::var("MATMUL_ROWS")
        .ok()
        .and_then(|v| v.split(',').map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4, 16, 64, 512]);
    let only: Option<String> = std::env::args().nth(2);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::IQ4_XS,
        GgmlType::Q3_K,
        GgmlType::Q5_0,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::IQ4_NL,
        GgmlType::MXFP4,
        GgmlType::F16,
    ] {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|t| t == ty.name()))
        {
            continue;
        }
        let data = weights(ty, &wf, rows, cols, &mut rnd);
        let w = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        let packed = pack(&w);
        for &nt in &row_counts {
            let x: Vec<f32> = (0..nt * cols).map(|_| rnd()).collect();
            println!(
                "{}",
                time_products(&pool, &w, packed.as_ref(), &x, nt, fast_only)
            );
        }
    }
}

/// A xorshift generator of floats in [-1, 1).
fn xorshift() -> impl FnMut() -> f32 {
    let mut seed = 0x2545F4914F6CDD1Du64;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A `rows`×`cols` matrix of `ty`: `wf` quantized, or random bits with sane scales for the
/// types nucleus has no quantizer for.
fn weights(
    ty: GgmlType,
    wf: &[f32],
    rows: usize,
    cols: usize,
    rnd: &mut impl FnMut() -> f32,
) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let mut data = vec![0u8; rb * rows];
    if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) {
        // No K-quant quantizer yet: random bits with sane scales.
        for b in data.iter_mut() {
            *b = (rnd().to_bits() >> 7) as u8;
        }
        let bs = ty.block_layout().1;
        let at = if ty == GgmlType::Q6_K { 208 } else { 0 };
        for blk in data.chunks_exact_mut(bs) {
            blk[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            if ty != GgmlType::Q6_K {
                blk[2..4].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
        }
    } else if ty == GgmlType::MXFP4 {
        // No MXFP4 quantizer: random nibbles under scale bytes 120 to 127 (2^(e − 128) on
        // the doubled values: weights below 6 in size).
        for blk in data.chunks_exact_mut(17) {
            blk[0] = 120 + (rnd().to_bits() >> 7) as u8 % 8;
            for b in &mut blk[1..] {
                *b = (rnd().to_bits() >> 7) as u8;
            }
        }
    } else {
        quantize_rows(ty, wf, cols, &mut data).expect("a type nucleus quantizes");
    }
    data
}

/// One line of timings for `nt` activation rows `x`: llama.cpp's one-row and batched kernels
/// (unless `fast_only`) and nucleus's interleaved ones where the type packs.
fn time_products(
    pool: &ThreadPool,
    w: &QMatrix,
    packed: Option<&PackedMatrix>,
    x: &[f32],
    nt: usize,
    fast_only: bool,
) -> String {
    let (ty, rows, cols) = (w.ty, w.rows, w.cols);
    let mut acts = QuantizedActs::new();
    acts.quantize(x, nt, cols, vec_dot_type(ty));
    let mut y = vec![0f32; nt * rows];
    let macs = (rows * cols * nt) as f64;
    let s = if fast_only {
        f64::NAN
    } else {
        fastest(|| matmul(pool, w, &acts, &mut y))
    };
    let mut line = format!(
        "{:>5} rows={nt:>3}: one-row kernels {:8.1} us {:6.1} G MAC/s",
        ty.name(),
        s * 1e6,
        macs / s / 1e9
    );
    if !fast_only && (packed.is_none() || nt > 1) {
        // llama.cpp's batched kernels for every row (a prompt's arithmetic).
        let slots = vec![PromptSlot::BATCHED; nt];
        let b = fastest(|| matmul_rows(pool, w, &acts, &mut y, &slots));
        line += &format!(
            " | batched kernels {:8.1} us {:6.1} G MAC/s ({:.2}x)",
            b * 1e6,
            macs / b / 1e9,
            s / b
        );
    }
    if let Some(p) = packed {
        let mut pa = PackedActs::new();
        if acts.ty() == GgmlType::Q8_0 {
            pa.prepare(&acts);
        }
        // The chain nucleus's own arithmetic takes here (`Chain::fast`); `MATMUL_CHAIN=pairs`:
        // Q4_K in llama.cpp's gemm chain, `MATMUL_CHAIN=default`: one FMA per super-block,
        // `MATMUL_CHAIN=lanes`: Q8_0 in llama.cpp's eight lanes (`--exact`'s).
        let chain = match std::env::var("MATMUL_CHAIN").as_deref() {
            Ok("pairs") => Chain::Q4kPairs,
            Ok("lanes") => Chain::Q8Lanes,
            Ok("default") => Chain::Default,
            _ => Chain::fast(),
        };
        let f = fastest(|| matmul_packed_chain(pool, p, &acts, &pa, &mut y, chain));
        line += &format!(
            " | fast {:8.1} us {:6.1} G MAC/s ({:.2}x)",
            f * 1e6,
            macs / f / 1e9,
            s / f
        );
    }
    line
}

/// The fastest of many calls (robust against other processes on a busy machine), in seconds.
fn fastest(mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut s = f64::INFINITY;
    let t = Instant::now();
    while t.elapsed().as_secs_f64() < 0.7 {
        let t1 = Instant::now();
        f();
        s = s.min(t1.elapsed().as_secs_f64());
    }
    s
}

/// Iterations of each ceiling loop, on every thread.
#[cfg(target_arch = "x86_64")]
const PEAK_ITERS: u64 = 50_000_000;

/// Multiply-adds per second with every thread of the pool running `body(PEAK_ITERS)`, which
/// issues `macs_per_iter` of them an iteration.
#[cfg(target_arch = "x86_64")]
fn macs_per_second(pool: &ThreadPool, macs_per_iter: u64, body: impl Fn(u64) -> i32 + Sync) -> f64 {
    let t = Instant::now();
    pool.run(|_, _| {
        std::hint::black_box(body(PEAK_ITERS));
    });
    let s = t.elapsed().as_secs_f64();
    (pool.n_threads() as u64 * PEAK_ITERS * macs_per_iter) as f64 / s
}

/// 8-bit multiply-adds per second with every thread of the pool issuing independent
/// `vpmaddubsw` (32 each): the ceiling of the AVX2 integer products.
fn peak_int8_macs(pool: &ThreadPool) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return Some(macs_per_second(pool, 8 * 32, |n| unsafe {
            maddubs_loop(n)
        }));
    }
    let _ = pool;
    None
}

/// The same with `vpdpbusd` on 256-bit registers (32 multiply-adds each), where the CPU has
/// AVX-512 VNNI: the ceiling of the kernels' VNNI bodies.
fn peak_vnni_macs(pool: &ThreadPool) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= nucleus::quant::SimdLevel::Avx512Vnni {
        // SAFETY: AVX-512 VNNI and VL are present (the level never exceeds the CPU's).
        return Some(macs_per_second(pool, 12 * 32, |n| unsafe {
            dpbusd_loop(n)
        }));
    }
    let _ = pool;
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
unsafe fn dpbusd_loop(iters: u64) -> i32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
    // Twelve chains: enough to cover the instruction's latency at two per cycle.
    let mut acc = [_mm256_setzero_si256(); 12];
    for _ in 0..iters {
        for r in acc.iter_mut() {
            *r = _mm256_dpbusd_epi32(*r, a, b);
        }
    }
    let mut s = 0;
    for r in acc {
        s ^= _mm256_extract_epi32(r, 0);
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn maddubs_loop(iters: u64) -> i32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_epi8(3);
    let mut acc = [_mm256_set1_epi8(1); 8];
    for _ in 0..iters {
        for r in acc.iter_mut() {
            *r = _mm256_maddubs_epi16(a, *r);
        }
    }
    let mut s = 0;
    for r in acc {
        s ^= _mm256_extract_epi32(r, 0);
    }
    s
}
