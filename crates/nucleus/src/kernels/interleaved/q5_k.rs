//! Q5_K matrices in the interleaved layout, computed with the arithmetic of llama.cpp's tiled
//! Q4_K/Q5_K kernel (`quant::scalar_k::dot_q5_k_tiled`, which `--exact` takes for a prompt's
//! rows): per super-block of 256 inputs the exact integer sums `isum = Σ_j scale_j·Σ q·x` and
//! `imin = Σ_j min_j·bsum_j` over the eight sub-blocks of 32, then
//!
//! ```text
//! r = fma(−dmin, imin, isum · d);   acc = fma(r, dy, acc)
//! ```
//!
//! the same chain for every output, prompt or generated: batch-invariant by construction, and
//! a prompt's products have `--exact`'s bits. (The one-row kernel, `--exact`'s for generated
//! tokens, keeps eight partial sums per output: in the interleaved layout, where one lane is
//! one row, that would cost a multiply per four values and row more.)
//!
//! Layout of one group of eight rows and one super-block ([`GROUP_BLOCK`] = 1440 bytes, the
//! file's 8 × 176 plus the scales and mins unpacked to bytes): bytes `0..1184` as
//! [`super::q4_k`]'s (d, dmin, scales, mins, the low four bits of every value), then the fifth
//! bits, 64 bytes per pair `p` of sub-blocks at `1184 + 64p`: bit `c` of byte `4r + m` is that
//! of value `64p + 4c + m` of row `r` (sub-block `2p`), bit `c` of byte `32 + 4r + m` that of
//! value `64p + 32 + 4c + m` (sub-block `2p + 1`): chunk `c` of the nibbles finds its fifth bits
//! in the same places, bit `c`.

use super::q4_k::{ACT_BLOCK, MINS, NIBBLES, SCALES};
use super::{GroupView, Tile, GROUP_ROWS};

/// Bytes of a Q5_K super-block in the file: d, dmin (f16), scales[12], qh[32], qs[128].
const FILE_BLOCK: usize = 176;
/// Where the fifth bits start in a group's super-block.
pub(crate) const HIGH: usize = super::q4_k::GROUP_BLOCK;
/// Bytes of one group's super-block in the interleaved layout.
pub(crate) const GROUP_BLOCK: usize = HIGH + 256;

/// Writes group-block `dst` (GROUP_BLOCK bytes) from the eight file blocks `rows[r]`. In the
/// file (ggml's `block_q5_K`) value `64p + l` of a block has its low four bits in the low
/// nibble of `qs[32p + l]` and its fifth at bit `2p` of `qh[l]`; value `64p + 32 + l` the high
/// nibble and bit `2p + 1`.
pub(crate) fn pack_group_block(rows: [&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    super::q4_k::pack_group_block_with(rows, 48, dst);
    // Row r's word 2p + e: the fifth bits of sub-block 2p + e, place m in its byte m.
    let mut high = [[0u8; 32]; GROUP_ROWS];
    for (r, b) in rows.iter().enumerate() {
        debug_assert_eq!(b.len(), FILE_BLOCK);
        let qh: &[u8; 32] = b[16..48].try_into().unwrap();
        #[cfg(target_arch = "x86_64")]
        if crate::quant::simd_level() >= crate::quant::SimdLevel::Avx2 {
            // SAFETY: AVX2 is present (`simd_level` checked the CPU).
            high[r] = unsafe { fifth_bits_avx2(qh) };
            continue;
        }
        high[r] = fifth_bits(qh);
    }
    super::interleave::interleave_words(&high, &mut dst[HIGH..]);
}

/// A block's fifth bits `qh` as the layout keeps them: byte `4b + m` holds, at bit `c`, the
/// bit of value `32b + 4c + m` (bit `b` of `qh[4c + m]`).
fn fifth_bits(qh: &[u8; 32]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for m in 0..4 {
        // Byte c of `x` is qh[4c + m]: bit b of it is the fifth bit of value 32b + 4c + m,
        // so the transpose's byte b holds sub-block b's bits of chunks c = 0..8.
        let x = (0..8).fold(0u64, |x, c| x | (qh[4 * c + m] as u64) << (8 * c));
        for (b, byte) in transpose_bits(x).to_le_bytes().into_iter().enumerate() {
            out[4 * b + m] = byte;
        }
    }
    out
}

/// [`fifth_bits`] with AVX2: the bytes ordered `8m + c`, then one `vpmovmskb` per bit plane.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fifth_bits_avx2(qh: &[u8; 32]) -> [u8; 32] {
    use std::arch::x86_64::*;
    // SAFETY: 32 bytes read from and written to arrays of 32 (unaligned).
    unsafe {
        let x = _mm256_loadu_si256(qh.as_ptr().cast());
        // In each 128-bit lane (c = 0..4 or 4..8): byte 4c + m to dword m, byte c % 4 of it.
        let by_m = _mm256_setr_epi8(
            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6,
            10, 14, 3, 7, 11, 15,
        );
        let x = _mm256_shuffle_epi8(x, by_m);
        // Dwords (lane, m) to 2m + lane: byte 8m + c holds qh[4c + m].
        let mut y = _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let mut out = [0u8; 32];
        for b in (0..8).rev() {
            // Bit b of every byte is at bit 7: the mask's bit 8m + c.
            let mask = _mm256_movemask_epi8(y) as u32;
            out[4 * b..4 * b + 4].copy_from_slice(&mask.to_le_bytes());
            y = _mm256_add_epi8(y, y);
        }
        out
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
#[test]
fn fifth_bits_with_avx2_are_the_scalar_ones() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx2 {
        return;
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..256 {
        let qh: [u8; 32] = std::array::from_fn(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 56) as u8
        });
        // SAFETY: AVX2 checked above.
        assert_eq!(unsafe { fifth_bits_avx2(&qh) }, fifth_bits(&qh));
    }
}

/// The 8×8 bit matrix `x` (row `i` = byte `i`, column `j` = its bit `j`) transposed: bit `j`
/// of byte `i` moves to bit `i` of byte `j` (Hacker's Delight, `transpose8`, on one word).
fn transpose_bits(mut x: u64) -> u64 {
    let mut t = (x ^ (x >> 7)) & 0x00AA_00AA_00AA_00AA;
    x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000_CCCC_0000_CCCC;
    x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x0000_0000_F0F0_F0F0;
    x ^ t ^ (t << 28)
}

#[cfg(test)]
#[test]
fn transposed_bits_move_from_row_to_column() {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let t = transpose_bits(seed);
        for (i, j) in (0..8).flat_map(|i| (0..8).map(move |j| (i, j))) {
            assert_eq!((seed >> (8 * i + j)) & 1, (t >> (8 * j + i)) & 1);
        }
    }
}

/// The reference kernel: the arithmetic of the module doc, per output.
///
/// # Safety
/// As [`super::TileFn`], the activations being Q8_K rows of `tile.blocks` super-blocks.
pub(crate) unsafe fn tile_scalar(group: &GroupView, t: &Tile) {
    // SAFETY: forwarded.
    unsafe {
        super::scalar::k_quant_tiles(group, t, GROUP_BLOCK, |g, xb, r, acc| {
            let dy = f32::from_le_bytes(xb[0..4].try_into().unwrap());
            let xq = |i: usize| xb[4 + i] as i8 as i32;
            let bsum = |j: usize| {
                let s = |k: usize| i16::from_le_bytes([xb[260 + 2 * k], xb[261 + 2 * k]]) as i32;
                s(2 * j) + s(2 * j + 1)
            };
            let (mut isum, mut imin) = (0i32, 0i32);
            for j in 0..8 {
                let (p, high) = (j / 2, j % 2);
                let mut sub = 0i32;
                for i in 0..32 {
                    let (c, m) = (i / 4, i % 4);
                    let byte = g[NIBBLES + 256 * p + 32 * c + 4 * r + m];
                    let fifth = (g[HIGH + 64 * p + 32 * high + 4 * r + m] >> c) & 1;
                    let q = (byte >> (4 * high)) & 0xF | fifth << 4;
                    sub += q as i32 * xq(64 * p + 32 * high + i);
                }
                isum += g[SCALES + 8 * j + r] as i32 * sub;
                imin += g[MINS + 16 * p + 2 * r + high] as i32 * bsum(j);
            }
            let f16 = |at: usize| half::f16::from_le_bytes([g[at], g[at + 1]]).to_f32();
            let (d, dmin) = (f16(2 * r), f16(16 + 2 * r));
            let rsum = (-dmin).mul_add(imin as f32, isum as f32 * d);
            *acc = rsum.mul_add(dy, *acc);
        })
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::tile_avx2;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`tile_scalar`]'s bits with AVX2: eight rows in the lanes of a register, four values of
    /// each per `vpmaddubsw` (a five-bit value times an 8-bit activation: a pair sums to at
    /// most 2·31·128, four chunks to 31,744, within 16 bits, so a sub-block's two halves are
    /// scaled by `vpmaddwd` apart), the min sums by `vpmaddwd` with the activations' pair sums.
    /// With AVX-512 VNNI a sub-block's sum comes from `vpdpbusd` in 32 bits and is scaled by
    /// `vpmulld`: the same integers.
    ///
    /// # Safety
    /// As [`tile_scalar`]; the CPU has AVX2, FMA and F16C.
    pub(crate) unsafe fn tile_avx2(group: &GroupView, tile: &Tile) {
        assert!(group.values.len() >= group.stride * (tile.blocks - 1) + GROUP_BLOCK);
        kernel_by_level!(tile_nx, group, &GroupView, tile)
    }

    #[inline(always)]
    unsafe fn tile_nx<const VNNI: bool, const NX: usize>(group: &GroupView, t: &Tile) {
        let mut acc = [_mm256_setzero_ps(); NX];
        // SAFETY (all reads below): super-block b < blocks of the group (GROUP_BLOCK bytes at
        // stride·b, checked by the caller); token n < nx's Q8_K block b (ACT_BLOCK bytes) in its
        // row (the caller's contract).
        unsafe {
            for b in 0..t.blocks {
                let g = group.values.as_ptr().add(group.stride * b);
                crate::kernels::interleaved::x86::prefetch_block(g, GROUP_BLOCK);
                let xb = |n: usize| t.x.add(n * t.x_stride + ACT_BLOCK * b);
                let d = _mm256_cvtph_ps(_mm_loadu_si128(g as *const _));
                let dmin = _mm256_cvtph_ps(_mm_loadu_si128(g.add(16) as *const _));
                let mut isum = [_mm256_setzero_si256(); NX];
                for p in 0..4 {
                    let s = pair_sums::<VNNI, NX>(g, &xb, p);
                    for n in 0..NX {
                        isum[n] = _mm256_add_epi32(isum[n], s[n]);
                    }
                }
                for n in 0..NX {
                    let q8s = _mm256_castsi128_si256(super::super::q4_k::sub_block_sums(xb(n)));
                    let mut imin = _mm256_setzero_si256();
                    for p in 0..4 {
                        let pair = _mm256_permutevar8x32_epi32(q8s, _mm256_set1_epi32(p as i32));
                        let mins =
                            _mm256_cvtepu8_epi16(_mm_loadu_si128(g.add(MINS + 16 * p) as *const _));
                        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins, pair));
                    }
                    let dy = _mm256_set1_ps((xb(n) as *const f32).read_unaligned());
                    let r = _mm256_fnmadd_ps(
                        dmin,
                        _mm256_cvtepi32_ps(imin),
                        _mm256_mul_ps(_mm256_cvtepi32_ps(isum[n]), d),
                    );
                    acc[n] = _mm256_fmadd_ps(r, dy, acc[n]);
                }
            }
            for (n, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(t.out.add(n * t.out_stride), *acc);
            }
        }
    }

    /// The fifth bits of chunk `c` from a plane `h` of them (bit `c` of each byte), moved to
    /// bit 4 (0x10) of each byte. A 16-bit shift moves no other byte's bit to bit 4: left by
    /// at most 4, right by at most 3.
    #[inline(always)]
    unsafe fn fifth_bits(h: __m256i, c: usize) -> __m256i {
        let m = _mm256_set1_epi8(0x10);
        match c {
            0 => _mm256_and_si256(_mm256_slli_epi16::<4>(h), m),
            1 => _mm256_and_si256(_mm256_slli_epi16::<3>(h), m),
            2 => _mm256_and_si256(_mm256_slli_epi16::<2>(h), m),
            3 => _mm256_and_si256(_mm256_slli_epi16::<1>(h), m),
            4 => _mm256_and_si256(h, m),
            5 => _mm256_and_si256(_mm256_srli_epi16::<1>(h), m),
            6 => _mm256_and_si256(_mm256_srli_epi16::<2>(h), m),
            _ => _mm256_and_si256(_mm256_srli_epi16::<3>(h), m),
        }
    }

    /// Pair `p` (sub-blocks 2p, 2p + 1) of the super-block at `g`, for each token `n` (its Q8_K
    /// block at `xb(n)`): row r's `sc·Σ q·x` over both sub-blocks, in 32-bit lane r.
    #[inline(always)]
    unsafe fn pair_sums<const VNNI: bool, const NX: usize>(
        g: *const u8,
        xb: &impl Fn(usize) -> *const u8,
        p: usize,
    ) -> [__m256i; NX] {
        let m4 = _mm256_set1_epi8(0x0F);
        let bcast = |p: *const u8| {
            // SAFETY: 4 bytes of a token's block (the caller's contract).
            unsafe { _mm256_set1_epi32((p as *const i32).read_unaligned()) }
        };
        // Sums of chunks 0..4 and 4..8 apart (AVX2: each within 16 bits), low and high
        // sub-block.
        let mut s = [[[_mm256_setzero_si256(); NX]; 2]; 2];
        let mut out = [_mm256_setzero_si256(); NX];
        // SAFETY: the super-block's GROUP_BLOCK bytes at g and each token's block at xb(n)
        // (the caller's contract, as in tile_nx).
        unsafe {
            let h_lo = _mm256_loadu_si256(g.add(HIGH + 64 * p) as *const _);
            let h_hi = _mm256_loadu_si256(g.add(HIGH + 64 * p + 32) as *const _);
            for c in 0..8 {
                let w = _mm256_loadu_si256(g.add(NIBBLES + 256 * p + 32 * c) as *const _);
                let lo = _mm256_or_si256(_mm256_and_si256(w, m4), fifth_bits(h_lo, c));
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                let hi = _mm256_or_si256(hi, fifth_bits(h_hi, c));
                let half = if VNNI { 0 } else { c / 4 };
                for n in 0..NX {
                    let x = xb(n).add(4 + 64 * p + 4 * c);
                    let [s_lo, s_hi] = &mut s[half];
                    if VNNI {
                        s_lo[n] = _mm256_dpbusd_epi32(s_lo[n], lo, bcast(x));
                        s_hi[n] = _mm256_dpbusd_epi32(s_hi[n], hi, bcast(x.add(32)));
                    } else {
                        s_lo[n] = _mm256_add_epi16(s_lo[n], _mm256_maddubs_epi16(lo, bcast(x)));
                        s_hi[n] =
                            _mm256_add_epi16(s_hi[n], _mm256_maddubs_epi16(hi, bcast(x.add(32))));
                    }
                }
            }
            let scales = |j: usize| _mm_loadl_epi64(g.add(SCALES + 8 * j) as *const _);
            if VNNI {
                // Row r's scale in 32-bit lane r.
                let (sc_lo, sc_hi) = (
                    _mm256_cvtepu8_epi32(scales(2 * p)),
                    _mm256_cvtepu8_epi32(scales(2 * p + 1)),
                );
                for n in 0..NX {
                    out[n] = _mm256_add_epi32(
                        _mm256_mullo_epi32(s[0][0][n], sc_lo),
                        _mm256_mullo_epi32(s[0][1][n], sc_hi),
                    );
                }
            } else {
                // Row r's scale in 16-bit lanes 2r and 2r + 1.
                let scale = |j: usize| {
                    let s = scales(j);
                    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s, s))
                };
                let (sc_lo, sc_hi) = (scale(2 * p), scale(2 * p + 1));
                for n in 0..NX {
                    let lo = _mm256_add_epi32(
                        _mm256_madd_epi16(s[0][0][n], sc_lo),
                        _mm256_madd_epi16(s[1][0][n], sc_lo),
                    );
                    let hi = _mm256_add_epi32(
                        _mm256_madd_epi16(s[0][1][n], sc_hi),
                        _mm256_madd_epi16(s[1][1][n], sc_hi),
                    );
                    out[n] = _mm256_add_epi32(lo, hi);
                }
            }
        }
        out
    }
}
