//! Micro benchmark of load-time repacking: one matrix of the shape of a Qwen2.5-7B `attn_q`
//! (3584 × 3584) per type, in GB/s of the file's bytes. A load packs such matrices one per
//! thread, so this packs on one thread (`pack` spreads matrices from 16 MiB over the cores).
//! Each round packs into new memory, as a load does (`fresh`: the first round's pages are the
//! kernel's fresh ones; later rounds' may come back from the allocator), and again into the
//! same memory (`reused`: the packing's own work, without the first touch of the pages).
//!
//! `cargo run --release -p nucleus --example pack_bench [Q4_K,Q5_K,...] [rounds]`;
//! `PACK_SHAPE=rows,cols` overrides the shape.

mod common;

use std::time::Instant;

use nucleus::kernels::interleaved::pack;
use nucleus::kernels::QMatrix;
use nucleus::quant::quantize::quantize_rows;
use nucleus::quant::GgmlType;

fn main() {
    let (rows, cols) = common::shape_from_env("PACK_SHAPE", (3584, 3584));
    let only: Option<String> = std::env::args().nth(1);
    let types = [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q3_K,
        GgmlType::IQ4_XS,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
    ];
    let rounds: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    // One quantized row, repeated: the packing's cost does not depend on the values.
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let row: Vec<f32> = (0..cols)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    println!("W {rows}x{cols}, {rounds} rounds");
    for ty in types {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|t| t == ty.name()))
        {
            continue;
        }
        let mut one = vec![0u8; ty.row_bytes(cols).expect("whole blocks")];
        quantize_rows(ty, &row, cols, &mut one).unwrap_or_else(|e| panic!("{ty:?}: {e}"));
        let data = one.repeat(rows);
        let w = QMatrix {
            ty,
            data: &data,
            rows,
            cols,
        };
        let gb = data.len() as f64 / 1e9;
        let (mut fresh, mut reused) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            let p = pack(&w).unwrap_or_else(|| panic!("{ty:?} is not packed"));
            fresh.push(gb / t.elapsed().as_secs_f64());
            let t = Instant::now();
            let again = nucleus::kernels::interleaved::repack_into(&w, p).expect("same shape");
            reused.push(gb / t.elapsed().as_secs_f64());
            drop(again);
        }
        let range = |v: &[f64]| {
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
            format!("{lo:.2}–{hi:.2}")
        };
        println!(
            "{ty:?}: {:.3} GB: fresh {} GB/s, reused {} GB/s",
            gb,
            range(&fresh),
            range(&reused)
        );
    }
}
