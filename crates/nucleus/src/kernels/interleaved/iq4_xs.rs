//! IQ4_XS matrices in the interleaved layout, computed with the arithmetic of llama.cpp's tiled
//! IQ4_XS kernel (`quant::scalar_low_bit::dot_iq4_xs_tiled`, which `--exact` takes for a
//! prompt's rows): per super-block of 256 inputs the exact integer sum
//! `isum = Σ_j (ls_j − 32)·Σ kvalues[q]·x` over the eight sub-blocks of 32, then
//!
//! ```text
//! acc = fma(isum · d, dy, acc)
//! ```
//!
//! the same chain for every output, prompt or generated (Q6_K's, [`super::q6_k`]): a prompt's
//! products have `--exact`'s bits, and a token's do not depend on the others'.
//!
//! Layout of one group of eight rows and one super-block ([`GROUP_BLOCK`] = 1104 bytes, the
//! file's 8 × 136 with the scales unpacked to bytes):
//! - `0..16`: the rows' d (f16);
//! - `16..80`: the scales, byte `16 + 8j + r` = `ls − 32` (i8) of sub-block `j` of row `r`;
//! - `80..1104`: the nibbles (indices into `kvalues_iq4nl`), as Q4_K's are laid out: 32 bytes
//!   per (pair `p` of sub-blocks, chunk `c` of four), byte `4r + m` of `80 + 256p + 32c` holding
//!   value `64p + 4c + m` of row `r` in its low nibble and value `64p + 32 + 4c + m` in its high
//!   one. (The file keeps sub-block `j`'s values `32j + l` and `32j + 16 + l` in byte
//!   `16j + l`.)

use super::interleave::{interleave_bytes, interleave_words, put, words};
use super::q4_k::ACT_BLOCK;
use super::{GroupView, Tile, GROUP_ROWS};
use crate::quant::KVALUES_IQ4NL;

/// Bytes of an IQ4_XS super-block in the file: d (f16), scales_h (u16), scales_l[4], qs[128].
const FILE_BLOCK: usize = 136;
pub(crate) const SCALES: usize = 16;
pub(crate) const NIBBLES: usize = 80;
/// Bytes of one group's super-block in the interleaved layout.
pub(crate) const GROUP_BLOCK: usize = NIBBLES + GROUP_ROWS * 128;

/// Writes group-block `dst` (GROUP_BLOCK bytes) from the eight file blocks `rows[r]`.
pub(crate) fn pack_group_block(rows: [&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    let (mut nibbles, mut scales) = ([[0u8; 128]; GROUP_ROWS], [0u64; GROUP_ROWS]);
    for (r, b) in rows.iter().enumerate() {
        debug_assert_eq!(b.len(), FILE_BLOCK);
        dst[2 * r..2 * r + 2].copy_from_slice(&b[0..2]);
        let s = crate::quant::iq4_xs_scales(b);
        scales[r] = u64::from_le_bytes(std::array::from_fn(|j| s[j] as i8 as u8));
        // Chunk c of pair p takes values 64p + 4c.. (sub-block 2p, places 4c..) and 64p + 32 +
        // 4c.. (sub-block 2p + 1): from the file bytes 16·(2p) + 4(c % 4).. and 16·(2p + 1) +
        // 4(c % 4).., their low nibbles for c < 4, their high ones after. Four at a time.
        let qs: [u32; 32] = words(&b[8..]);
        const LOW: u32 = 0x0F0F_0F0F;
        for p in 0..4 {
            for c in 0..8 {
                let (lo, hi) = (qs[8 * p + c % 4], qs[8 * p + 4 + c % 4]);
                let packed = if c < 4 {
                    (lo & LOW) | (hi & LOW) << 4
                } else {
                    (lo >> 4 & LOW) | (hi & !LOW)
                };
                put(&mut nibbles[r], 8 * p + c, packed);
            }
        }
    }
    interleave_bytes(scales, &mut dst[SCALES..]);
    interleave_words(&nibbles, &mut dst[NIBBLES..]);
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
            let mut isum = 0i32;
            for j in 0..8 {
                let (p, high) = (j / 2, j % 2);
                let mut sub = 0i32;
                for i in 0..32 {
                    let (c, m) = (i / 4, i % 4);
                    let byte = g[NIBBLES + 256 * p + 32 * c + 4 * r + m];
                    let q = (byte >> (4 * high)) & 0xF;
                    sub += KVALUES_IQ4NL[q as usize] as i32 * xq(64 * p + 32 * high + i);
                }
                isum += g[SCALES + 8 * j + r] as i8 as i32 * sub;
            }
            let d = half::f16::from_le_bytes([g[2 * r], g[2 * r + 1]]).to_f32();
            *acc = (isum as f32 * d).mul_add(dy, *acc);
        })
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::tile_avx2;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`tile_scalar`]'s bits with AVX2: eight rows in the lanes of a register, the nibbles
    /// looked up with `vpshufb`. AVX2: `vpmaddubsw` of |x| by w carrying x's sign (|w| ≤ 127;
    /// |x| ≤ 128, as a Q8_K activation may be −128: a pair sums to at most 2·128·127, within
    /// 16 bits), widened by `vpmaddwd` each chunk. VNNI: `vpdpbusd` of w + 128 (unsigned, one
    /// lookup per chunk for every token) by x, and 128 times each sub-block's activation sum
    /// taken off. The same 32-bit integers either way.
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
        let m4 = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        // The table, signed (AVX2) or plus 128 (VNNI).
        let mut table = [0u8; 16];
        for (t, k) in table.iter_mut().zip(KVALUES_IQ4NL) {
            *t = if VNNI {
                (k as i16 + 128) as u8
            } else {
                k as u8
            };
        }
        // SAFETY (all reads below): super-block b < blocks of the group (GROUP_BLOCK bytes at
        // stride·b, checked by the caller); token n < nx's Q8_K block b (ACT_BLOCK bytes) in its
        // row (the caller's contract); the table's 16 bytes.
        unsafe {
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const _));
            let bcast = |p: *const u8| _mm256_set1_epi32((p as *const i32).read_unaligned());
            for b in 0..t.blocks {
                let g = group.values.as_ptr().add(group.stride * b);
                crate::kernels::interleaved::x86::prefetch_block(g, GROUP_BLOCK);
                let xb = |n: usize| t.x.add(n * t.x_stride + ACT_BLOCK * b);
                // VNNI: 128 times each sub-block's activation sum, per token.
                let mut offsets = [[0i32; 8]; NX];
                if VNNI {
                    for (n, o) in offsets.iter_mut().enumerate() {
                        let q8s = super::super::q4_k::sub_block_sums(xb(n));
                        let s = _mm256_slli_epi32::<7>(_mm256_cvtepi16_epi32(q8s));
                        _mm256_storeu_si256(o.as_mut_ptr() as *mut _, s);
                    }
                }
                let mut isum = [_mm256_setzero_si256(); NX];
                // p indexes the pairs of sub-blocks in the weights and in the offsets.
                #[allow(clippy::needless_range_loop)]
                for p in 0..4 {
                    let mut s = [[_mm256_setzero_si256(); NX]; 2];
                    for c in 0..8 {
                        let w = _mm256_loadu_si256(g.add(NIBBLES + 256 * p + 32 * c) as *const _);
                        let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(w, m4));
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                        let hi = _mm256_shuffle_epi8(table, hi);
                        for n in 0..NX {
                            let x = xb(n).add(4 + 64 * p + 4 * c);
                            for (h, v) in [lo, hi].into_iter().enumerate() {
                                let xs = bcast(x.add(32 * h));
                                s[h][n] = if VNNI {
                                    _mm256_dpbusd_epi32(s[h][n], v, xs)
                                } else {
                                    let pr = _mm256_maddubs_epi16(
                                        _mm256_abs_epi8(xs),
                                        _mm256_sign_epi8(v, xs),
                                    );
                                    _mm256_add_epi32(s[h][n], _mm256_madd_epi16(pr, ones))
                                };
                            }
                        }
                    }
                    let scale = |j: usize| {
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64(g.add(SCALES + 8 * j) as *const _))
                    };
                    let (sc_lo, sc_hi) = (scale(2 * p), scale(2 * p + 1));
                    for n in 0..NX {
                        let (mut lo, mut hi) = (s[0][n], s[1][n]);
                        if VNNI {
                            lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(offsets[n][2 * p]));
                            hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(offsets[n][2 * p + 1]));
                        }
                        let both = _mm256_add_epi32(
                            _mm256_mullo_epi32(lo, sc_lo),
                            _mm256_mullo_epi32(hi, sc_hi),
                        );
                        isum[n] = _mm256_add_epi32(isum[n], both);
                    }
                }
                let d = _mm256_cvtph_ps(_mm_loadu_si128(g as *const _));
                for n in 0..NX {
                    let dy = _mm256_set1_ps((xb(n) as *const f32).read_unaligned());
                    let r = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[n]), d);
                    acc[n] = _mm256_fmadd_ps(r, dy, acc[n]);
                }
            }
            for (n, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(t.out.add(n * t.out_stride), *acc);
            }
        }
    }
}
