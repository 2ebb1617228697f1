//! The transpose every packing ends with: eight rows' four-byte words interleaved, row `r`'s
//! word `k` to bytes `32k + 4r..32k + 4r + 4` (chunk `k`, places `4r..4r + 4` of every chunked
//! layout here). With AVX2, eight words of the eight rows at a time (an 8×8 transpose in
//! registers): it was half of a K-quant file's packing time, word by word.

use super::GROUP_ROWS;
use crate::quant::{simd_level, SimdLevel};

/// Interleaves the first `words` four-byte words of each of `rows` into `dst[..32 * words]`.
/// Every byte of that stretch of `dst` is written, none read (it may be fresh memory: see
/// `pack::packed_store`).
///
/// # Panics
/// When a row is shorter than `4 * words` bytes or `dst` than `32 * words`.
#[inline]
pub(super) fn interleave_rows(rows: [&[u8]; GROUP_ROWS], words: usize, dst: &mut [u8]) {
    let rows = rows.map(|r| &r[..4 * words]);
    let dst = &mut dst[..32 * words];
    #[cfg(target_arch = "x86_64")]
    if words.is_multiple_of(8) && simd_level() >= SimdLevel::Avx2 {
        // SAFETY: AVX2 is present (`simd_level` checked the CPU); the lengths were cut above.
        unsafe { interleave_avx2(rows, dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if words.is_multiple_of(4) {
        interleave_sse2(rows, dst);
        return;
    }
    interleave_scalar(rows, dst);
}

/// [`interleave_rows`] of words held in arrays: row `r`'s word `k` is `words[r][4k..4k + 4]`.
#[inline]
pub(super) fn interleave_words<const B: usize>(words: &[[u8; B]; GROUP_ROWS], dst: &mut [u8]) {
    interleave_rows(words.each_ref().map(|w| w.as_slice()), B / 4, dst)
}

/// The `N` little-endian words of `bytes[..4 * N]`.
#[inline(always)]
pub(super) fn words<const N: usize>(bytes: &[u8]) -> [u32; N] {
    let bytes = &bytes[..4 * N];
    std::array::from_fn(|k| u32::from_le_bytes(bytes[4 * k..4 * k + 4].try_into().unwrap()))
}

/// Stores `v` as word `k` of `words`.
#[inline(always)]
pub(super) fn put<const B: usize>(words: &mut [u8; B], k: usize, v: u32) {
    words[4 * k..4 * k + 4].copy_from_slice(&v.to_le_bytes());
}

/// Eight rows' eight bytes interleaved: byte `j` of `rows[r]` (little-endian) to `dst[8j + r]`
/// (a K-quant group-block's scales, sub-block `j` of row `r`).
#[inline]
pub(super) fn interleave_bytes(rows: [u64; GROUP_ROWS], dst: &mut [u8]) {
    interleave_units::<1>(rows, dst)
}

/// Eight rows' four pairs of bytes interleaved: pair `p` of `rows[r]` (bytes `2p, 2p + 1`) to
/// `dst[16p + 2r..]` (a Q4_K group-block's mins).
#[inline]
pub(super) fn interleave_pairs(rows: [u64; GROUP_ROWS], dst: &mut [u8]) {
    interleave_units::<2>(rows, dst)
}

/// Eight rows' eight bytes as units of `W` bytes (1 or 2), interleaved: unit `k` of `rows[r]`
/// to `dst[8W·k + W·r..]`. With SSE2 a transpose in three rounds of unpacking, each round's
/// elements twice the last's.
#[inline(always)]
fn interleave_units<const W: usize>(rows: [u64; GROUP_ROWS], dst: &mut [u8]) {
    let dst: &mut [u8; 64] = (&mut dst[..64]).try_into().unwrap();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SAFETY: SSE2 is part of x86_64; `dst` holds 64 bytes (unaligned stores).
        unsafe {
            // Round `i` interleaves elements of W << i bytes, low or high halves.
            let lo = |i: u32, a, b| match W << i {
                1 => _mm_unpacklo_epi8(a, b),
                2 => _mm_unpacklo_epi16(a, b),
                4 => _mm_unpacklo_epi32(a, b),
                _ => _mm_unpacklo_epi64(a, b),
            };
            let hi = |i: u32, a, b| match W << i {
                2 => _mm_unpackhi_epi16(a, b),
                4 => _mm_unpackhi_epi32(a, b),
                _ => _mm_unpackhi_epi64(a, b),
            };
            let v = rows.map(|r| _mm_cvtsi64_si128(r as i64));
            let x: [__m128i; 4] = std::array::from_fn(|i| lo(0, v[2 * i], v[2 * i + 1]));
            let (y0, y1) = (lo(1, x[0], x[1]), hi(1, x[0], x[1]));
            let (y2, y3) = (lo(1, x[2], x[3]), hi(1, x[2], x[3]));
            let z = [lo(2, y0, y2), hi(2, y0, y2), lo(2, y1, y3), hi(2, y1, y3)];
            for (i, z) in z.iter().enumerate() {
                _mm_storeu_si128(dst.as_mut_ptr().add(16 * i).cast(), *z);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    units_scalar::<W>(rows, dst);
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn units_scalar<const W: usize>(rows: [u64; GROUP_ROWS], dst: &mut [u8; 64]) {
    for (k, out) in dst.chunks_exact_mut(W * GROUP_ROWS).enumerate() {
        for (r, unit) in out.chunks_exact_mut(W).enumerate() {
            unit.copy_from_slice(&rows[r].to_le_bytes()[W * k..W * k + W]);
        }
    }
}

fn interleave_scalar(rows: [&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    for (k, chunk) in dst.chunks_exact_mut(32).enumerate() {
        for (r, place) in chunk.chunks_exact_mut(4).enumerate() {
            place.copy_from_slice(&rows[r][4 * k..4 * k + 4]);
        }
    }
}

/// Four words of the eight rows at a time (Q4_0's and Q5_0's 16 bytes of nibbles a block).
#[cfg(target_arch = "x86_64")]
fn interleave_sse2(rows: [&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    for (q, out) in dst.chunks_exact_mut(128).enumerate() {
        let rows: [&[u8]; GROUP_ROWS] = rows.map(|r| &r[16 * q..16 * q + 16]);
        // SAFETY: SSE2 is part of x86_64; every row slice holds 16 bytes (unaligned loads).
        let v = std::array::from_fn(|r| unsafe { _mm_loadu_si128(rows[r].as_ptr().cast()) });
        store_transposed_sse2(v, out);
    }
}

/// Eight rows' four words (row `r` in `v[r]`) to `dst[..128]` as four chunks of eight words
/// (word `k` of row `r` at `32k + 4r`): two 4×4 transposes, rows 0–3 and rows 4–7.
///
/// # Panics
/// When `dst` is shorter than 128 bytes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn store_transposed_sse2(v: [std::arch::x86_64::__m128i; GROUP_ROWS], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    let dst = &mut dst[..128];
    // SAFETY: SSE2 is part of x86_64; `dst` holds 128 bytes (unaligned stores).
    unsafe {
        let quad = |v: &[__m128i]| {
            let a0 = _mm_unpacklo_epi32(v[0], v[1]);
            let a1 = _mm_unpackhi_epi32(v[0], v[1]);
            let a2 = _mm_unpacklo_epi32(v[2], v[3]);
            let a3 = _mm_unpackhi_epi32(v[2], v[3]);
            [
                _mm_unpacklo_epi64(a0, a2),
                _mm_unpackhi_epi64(a0, a2),
                _mm_unpacklo_epi64(a1, a3),
                _mm_unpackhi_epi64(a1, a3),
            ]
        };
        let (lo, hi) = (quad(&v[..4]), quad(&v[4..]));
        for k in 0..4 {
            _mm_storeu_si128(dst.as_mut_ptr().add(32 * k).cast(), lo[k]);
            _mm_storeu_si128(dst.as_mut_ptr().add(32 * k + 16).cast(), hi[k]);
        }
    }
}

/// # Safety
/// AVX2 must be available; every row holds `dst.len() / 8` bytes, a multiple of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn interleave_avx2(rows: [&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    for (q, out) in dst.chunks_exact_mut(256).enumerate() {
        // SAFETY: bytes 32q..32q + 32 of every row are in bounds (`rows[r].len() ==
        // dst.len() / 8`); unaligned loads.
        let v: [__m256i; 8] = std::array::from_fn(|r| unsafe {
            _mm256_loadu_si256(rows[r].as_ptr().add(32 * q).cast())
        });
        store_transposed_avx2(v, out);
    }
}

/// Eight rows' eight words (row `r` in `v[r]`) to `dst[..256]` as eight chunks of eight
/// words (word `k` of row `r` at `32k + 4r`): the 8×8 transpose of [`crate::kernels::tile`].
///
/// # Panics
/// When `dst` is shorter than 256 bytes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn store_transposed_avx2(v: [std::arch::x86_64::__m256i; GROUP_ROWS], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    let dst = &mut dst[..256];
    // The words moved by the float transpose's shuffles, which move bits and compute nothing.
    let mut words = [_mm256_setzero_ps(); GROUP_ROWS];
    for (w, &r) in words.iter_mut().zip(&v) {
        *w = _mm256_castsi256_ps(r);
    }
    for (k, t) in crate::kernels::tile::transpose8(words).iter().enumerate() {
        // SAFETY: `dst` holds 256 bytes (unaligned stores).
        unsafe {
            _mm256_storeu_si256(dst.as_mut_ptr().add(32 * k).cast(), _mm256_castps_si256(*t))
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_interleaving_has_the_scalar_bytes() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for words in [4usize, 6, 8, 12, 16, 32, 40] {
            let rows: Vec<Vec<u8>> = (0..GROUP_ROWS)
                .map(|_| {
                    (0..4 * words + 3)
                        .map(|_| {
                            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                            (seed >> 56) as u8
                        })
                        .collect()
                })
                .collect();
            let rows: [&[u8]; GROUP_ROWS] = std::array::from_fn(|r| rows[r].as_slice());
            let (mut fast, mut slow) = (vec![0xAAu8; 32 * words + 5], vec![0xAAu8; 32 * words + 5]);
            interleave_rows(rows, words, &mut fast);
            interleave_scalar(rows.map(|r| &r[..4 * words]), &mut slow[..32 * words]);
            assert_eq!(fast, slow, "{words} words");
            // Word k of row r lands at 32k + 4r; nothing past the stretch is written.
            for (k, r) in (0..words).flat_map(|k| (0..GROUP_ROWS).map(move |r| (k, r))) {
                assert_eq!(
                    slow[32 * k + 4 * r..32 * k + 4 * r + 4],
                    rows[r][4 * k..4 * k + 4]
                );
            }
            assert!(slow[32 * words..].iter().all(|&b| b == 0xAA));
        }
    }

    #[test]
    fn bytes_and_pairs_land_in_their_places() {
        let rows: [u64; GROUP_ROWS] = std::array::from_fn(|r| {
            u64::from_le_bytes(std::array::from_fn(|j| (16 * r + j) as u8))
        });
        let (mut bytes, mut pairs) = ([0u8; 64], [0u8; 64]);
        interleave_bytes(rows, &mut bytes);
        interleave_pairs(rows, &mut pairs);
        for (r, j) in (0..GROUP_ROWS).flat_map(|r| (0..8).map(move |j| (r, j))) {
            assert_eq!(bytes[8 * j + r], (16 * r + j) as u8);
            assert_eq!(pairs[16 * (j / 2) + 2 * r + j % 2], (16 * r + j) as u8);
        }
        // The other machines' paths.
        let (mut b, mut p) = ([0u8; 64], [0u8; 64]);
        units_scalar::<1>(rows, &mut b);
        units_scalar::<2>(rows, &mut p);
        assert_eq!((b, p), (bytes, pairs));
    }
}
