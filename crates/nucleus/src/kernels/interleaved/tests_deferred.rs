//! A matrix that waits to be packed ([`PackedMatrix::deferred`]) computes the packed matrix's
//! bits: every type, token count, float chain and kernel family (scalar, AVX2, 512-bit, AMX
//! tiles emulated), and after [`PackedMatrix::finish`] it holds the bytes [`pack`] writes.

use std::sync::{Arc, Mutex};

use super::pack::pack;
use super::tests::{matrix, wide_q8_k_acts};
use super::*;
use crate::kernels::test_rng::Rng;

/// Rows held in memory, standing in for a mapped file; records what was released.
#[derive(Debug)]
struct Rows {
    data: Vec<u8>,
    released: Arc<Mutex<usize>>,
}

impl Rows {
    fn boxed(data: &[u8]) -> Box<Rows> {
        Box::new(Rows {
            data: data.to_vec(),
            released: Default::default(),
        })
    }
}

impl FileRows for Rows {
    fn bytes(&self) -> &[u8] {
        &self.data
    }
    fn release(&self, _offset: usize, len: usize) {
        *self.released.lock().unwrap() += len;
    }
}

const TYPES: [GgmlType; 10] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::MXFP4,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

/// `nt` token rows of the activation type `ty`'s packed products read, and their prepared sums.
fn acts_for(rng: &mut Rng, ty: GgmlType, nt: usize, cols: usize) -> (QuantizedActs, PackedActs) {
    if packed_act_type(ty) == GgmlType::Q8_K {
        (wide_q8_k_acts(rng, nt, cols), PackedActs::new())
    } else {
        super::tests::acts(rng, nt, cols)
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn a_waiting_matrix_computes_the_packed_bits() {
    let mut rng = Rng(41);
    let pool = ThreadPool::new(2);
    for ty in TYPES {
        let cols = if pack::block_len(ty) == 256 { 768 } else { 160 };
        // 136 rows: 17 groups, an odd count (the 512-bit kernels' pairs leave one).
        let rows = 136;
        let data = matrix(&mut rng, ty, rows, cols);
        let packed = super::tests::packed(ty, &data, rows, cols);
        let waiting = PackedMatrix::deferred(ty, rows, cols, Rows::boxed(&data)).unwrap();
        for nt in [1, 3, 4, 5, 9, 17, 40] {
            let (x, xa) = acts_for(&mut rng, ty, nt, cols);
            for (simd, chain, ask) in [
                (true, Chain::Default, TileAsk::Auto),
                (false, Chain::Default, TileAsk::Auto),
                (true, Chain::Q4kPairs, TileAsk::Auto),
                (true, Chain::Default, TileAsk::Emulated),
                (true, Chain::Q4kPairs, TileAsk::Emulated),
            ] {
                let mut want = vec![f32::NAN; nt * rows];
                let mut got = vec![f32::NAN; nt * rows];
                matmul_packed_tiles(
                    &pool,
                    &mut [(&packed, &mut want)],
                    &x,
                    &xa,
                    simd,
                    chain,
                    ask,
                );
                matmul_packed_tiles(
                    &pool,
                    &mut [(&waiting, &mut got)],
                    &x,
                    &xa,
                    simd,
                    chain,
                    ask,
                );
                assert!(!waiting.is_packed(), "a product must not pack the matrix");
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{ty} {nt} tokens, simd {simd}, {chain:?}, {ask:?}"
                );
            }
        }
        waiting.finish();
        assert!(waiting.is_packed());
        assert_eq!(waiting.raw(), packed.raw(), "{ty}: the packed bytes");
    }
}

#[test]
fn finishing_releases_every_row_once_and_sizes_are_checked() {
    let mut rng = Rng(42);
    let (ty, rows, cols) = (GgmlType::Q4_K, 64, 512);
    let data = matrix(&mut rng, ty, rows, cols);
    let released = Arc::new(Mutex::new(0));
    let source = Box::new(Rows {
        data: data.clone(),
        released: Arc::clone(&released),
    });
    let w = PackedMatrix::deferred(ty, rows, cols, source).unwrap();
    // Two threads finish it at once: one packs, the other waits, and the rows are read once.
    std::thread::scope(|s| {
        s.spawn(|| w.finish());
        s.spawn(|| w.finish());
    });
    assert_eq!(
        *released.lock().unwrap(),
        data.len(),
        "every row released once"
    );
    assert_eq!(w.raw(), pack(&w.file_rows().unwrap()).unwrap().raw());
    let short = Rows::boxed(&data[..data.len() - 1]);
    assert!(PackedMatrix::deferred(ty, rows, cols, short).is_none());
    assert!(PackedMatrix::deferred(ty, rows + 1, cols, Rows::boxed(&data)).is_none());
}

#[test]
fn matrices_in_one_arena_hold_the_bytes_pack_writes() {
    let mut rng = Rng(7);
    // Two matrices of every type, of different shapes, packed side by side in one arena from
    // two threads at once (as `Weights::finish_packing` does), each into its own part.
    let sources: Vec<(GgmlType, usize, usize, Vec<u8>)> = TYPES
        .iter()
        .flat_map(|&ty| [(ty, 16, 512), (ty, 24, 768)])
        .map(|(ty, rows, cols)| (ty, rows, cols, matrix(&mut rng, ty, rows, cols)))
        .collect();
    let mut waiting: Vec<PackedMatrix> = sources
        .iter()
        .map(|(ty, rows, cols, data)| {
            PackedMatrix::deferred(*ty, *rows, *cols, Rows::boxed(data)).unwrap()
        })
        .collect();
    let lens: Vec<usize> = waiting.iter().map(|w| w.bytes()).collect();
    let (offsets, end) = huge_pages::part_offsets(&lens).unwrap();
    assert!(offsets.iter().all(|o| o % 64 == 0), "parts on cache lines");
    let arena = huge_pages::Arena::of_len(end);
    for (w, &offset) in waiting.iter_mut().zip(&offsets) {
        // SAFETY: `part_offsets` laid the parts side by side in the arena's `end` bytes.
        unsafe { w.place_in(Arc::clone(&arena), offset) };
    }
    std::thread::scope(|s| {
        for half in waiting.chunks(waiting.len() / 2) {
            s.spawn(move || half.iter().rev().for_each(|w| w.finish()));
        }
    });
    let base = arena.base_address();
    for ((w, (ty, rows, cols, data)), &offset) in waiting.iter().zip(&sources).zip(&offsets) {
        let alone = pack(&crate::kernels::matmul::QMatrix {
            ty: *ty,
            data,
            rows: *rows,
            cols: *cols,
        })
        .unwrap();
        assert_eq!(w.raw(), alone.raw(), "{ty} {rows}x{cols}: the packed bytes");
        assert_eq!(
            w.raw().as_ptr() as usize,
            base + offset,
            "{ty}: in its part"
        );
    }
}
