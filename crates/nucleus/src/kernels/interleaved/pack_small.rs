//! The packing of the 32-value types a catalog model is mostly made of (Q8_0, Q5_0, Q4_0,
//! IQ4_NL): a row group's blocks in one loop, the transposes in SIMD registers. Their blocks
//! are small (18–34 bytes a row), so the block-by-block packing spent most of its time on the
//! frame around each block, not on moving the bytes (pack_bench: Q8_0 1.7 GB/s, Q5_0 and Q4_0
//! under 1). The bytes are those of `pack::pack_block` (`tests::small_groups_pack_as_blocks_do`).

use std::arch::x86_64::*;

use super::interleave::{store_transposed_avx2, store_transposed_sse2};
use super::pack::{prefetch_ahead, q5_0_fifth_bits};
use super::GROUP_ROWS;
use crate::quant::{simd_level, GgmlType, SimdLevel};

/// Packs the group whose rows are `rows` (each `out.len() / 8 / group_block_bytes × block
/// bytes` long) into `out`, when `ty` has a packing here and the machine its instructions;
/// false otherwise (the caller packs block by block).
pub(super) fn pack_group(ty: GgmlType, rows: [&[u8]; GROUP_ROWS], out: &mut [u8]) -> bool {
    let (block, group_block) = match ty {
        GgmlType::Q8_0 if simd_level() >= SimdLevel::Avx2 => (34, 16 + 256),
        GgmlType::Q5_0 => (22, 16 + 128 + 32),
        GgmlType::Q4_0 | GgmlType::IQ4_NL => (18, 16 + 128),
        _ => return false,
    };
    let blocks = out.len() / group_block;
    assert!(
        out.len() == blocks * group_block && rows.iter().all(|r| r.len() == blocks * block),
        "a group's rows and its packed bytes disagree"
    );
    match ty {
        // SAFETY: AVX2 is present (checked above); the lengths were checked above.
        GgmlType::Q8_0 => unsafe { q8_0_avx2(rows, out) },
        // SAFETY: the lengths were checked above (SSE2 is part of x86_64).
        GgmlType::Q5_0 => unsafe { nibbles_sse2::<22>(rows, out) },
        // SAFETY: as above.
        _ => unsafe { nibbles_sse2::<18>(rows, out) },
    }
    true
}

/// Each row's two scale bytes at `at` to `dst[2j..2j + 2]`.
///
/// # Safety
/// `rows[j][at..at + 2]` and `dst[..16]` are in bounds.
#[inline(always)]
unsafe fn scales(rows: &[&[u8]; GROUP_ROWS], at: usize, dst: *mut u8) {
    for (j, row) in rows.iter().enumerate() {
        // SAFETY: in bounds by the caller's contract; the two do not overlap (`dst` is the
        // packed matrix's memory, `rows` the file's).
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr().add(at), dst.add(2 * j), 2) };
    }
}

/// Q8_0 (34 bytes a block: the f16 scale, 32 values): the scales, then the values' eight
/// words of the eight rows transposed.
///
/// # Safety
/// AVX2 is present; every row holds `34 × blocks` bytes and `out` `272 × blocks`.
#[target_feature(enable = "avx2")]
unsafe fn q8_0_avx2(rows: [&[u8]; GROUP_ROWS], out: &mut [u8]) {
    for (b, dst) in out.chunks_exact_mut(16 + 256).enumerate() {
        let at = 34 * b;
        prefetch_ahead(rows, at, 34);
        // SAFETY: bytes `at..at + 34` of every row are in bounds (the contract) and `dst`
        // holds 272; unaligned loads.
        let v = unsafe {
            scales(&rows, at, dst.as_mut_ptr());
            std::array::from_fn(|r| _mm256_loadu_si256(rows[r].as_ptr().add(at + 2).cast()))
        };
        store_transposed_avx2(v, &mut dst[16..]);
    }
}

/// Q4_0 and IQ4_NL (`B` = 18: the scale, 16 bytes of nibbles) and Q5_0 (`B` = 22: the scale,
/// the 32 fifth bits, 16 bytes of nibbles). The file's nibble byte i holds values i and
/// i + 16, which the layout puts in one byte too (chunk i / 4, place 4j + i % 4): four words
/// of the eight rows transposed. Q5_0's fifth bits follow: byte 4j + m, bit k holding value
/// 4k + m's.
///
/// # Safety
/// Every row holds `B × blocks` bytes and `out` the packed group's bytes for `blocks`.
unsafe fn nibbles_sse2<const B: usize>(rows: [&[u8]; GROUP_ROWS], out: &mut [u8]) {
    let group_block = if B == 22 { 16 + 128 + 32 } else { 16 + 128 };
    for (b, dst) in out.chunks_exact_mut(group_block).enumerate() {
        let at = B * b;
        prefetch_ahead(rows, at, B);
        // SAFETY: bytes `at..at + B` of every row are in bounds (the contract) and `dst` holds
        // `group_block`; unaligned loads.
        let v = unsafe {
            scales(&rows, at, dst.as_mut_ptr());
            std::array::from_fn(|r| _mm_loadu_si128(rows[r].as_ptr().add(at + B - 16).cast()))
        };
        store_transposed_sse2(v, &mut dst[16..]);
        if B == 22 {
            for (j, row) in rows.iter().enumerate() {
                let qh = u32::from_le_bytes(row[at + 2..at + 6].try_into().unwrap());
                dst[16 + 128 + 4 * j..][..4].copy_from_slice(&q5_0_fifth_bits(qh));
            }
        }
    }
}
