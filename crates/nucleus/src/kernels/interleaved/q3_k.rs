//! Q3_K matrices in the interleaved layout, computed with the arithmetic of llama.cpp's tiled
//! Q3_K kernel (`quant::scalar_low_bit::dot_q3_k_tiled`, which `--exact` takes for a prompt's
//! rows): per super-block of 256 inputs the exact integer sum `isum = Σ_k s_k·Σ q·x` over the
//! sixteen sub-blocks of 16 (`s_k` the signed six-bit scale less 32, `q` in −4..=3), then
//!
//! ```text
//! acc = fma(isum · d, dy, acc)
//! ```
//!
//! the same chain for every output, prompt or generated (Q6_K's, [`super::q6_k`]). The values
//! are kept unsigned, `u = q + 4` (0..=7), and each sub-block's sum takes 4 times its
//! activations' sum off.
//!
//! Layout of one group of eight rows and one super-block ([`GROUP_BLOCK`] = 912 bytes, the
//! file's 8 × 110 with the scales unpacked to bytes), chunk `k` (0..64) being values
//! `4k..4k + 4` of each row, byte `4r + m` of a 32-byte vector standing for value `4k + m` of
//! row `r`:
//! - `0..16`: the rows' d (f16);
//! - `16..144`: the scales, byte `16 + 8j + r` = scale − 32 (i8) of sub-block `j` of row `r`;
//! - `144..656`: the low two bits of `u`, sixteen vectors: bits `2(k % 4)..` of vector `k / 4`;
//! - `656..912`: the third bit of `u`, eight vectors: bit `k % 8` of vector `k / 8`.

use super::interleave::{interleave_bytes, interleave_words, put, words};
use super::q4_k::ACT_BLOCK;
use super::{GroupView, Tile, GROUP_ROWS};

/// Bytes of a Q3_K super-block in the file: hmask[32], qs[64], scales[12], d (f16).
const FILE_BLOCK: usize = 110;
pub(crate) const SCALES: usize = 16;
pub(crate) const LOW: usize = 144;
pub(crate) const HIGH: usize = LOW + 16 * 32;
/// Bytes of one group's super-block in the interleaved layout.
pub(crate) const GROUP_BLOCK: usize = HIGH + 8 * 32;

/// Writes group-block `dst` (GROUP_BLOCK bytes) from the eight file blocks `rows[r]`. Every
/// byte is written before any is read (fresh memory: see `pack::packed_store`).
pub(crate) fn pack_group_block(rows: [&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    // Row r's words: vector v of the low plane, of the high plane.
    let (mut low, mut high) = ([[0u8; 64]; GROUP_ROWS], [[0u8; 32]; GROUP_ROWS]);
    let mut scales = [[0u64; GROUP_ROWS]; 2];
    for (r, b) in rows.iter().enumerate() {
        debug_assert_eq!(b.len(), FILE_BLOCK);
        dst[2 * r..2 * r + 2].copy_from_slice(&b[108..110]);
        let s = crate::quant::q3_k_scales(b);
        for (h, half) in scales.iter_mut().enumerate() {
            half[r] = u64::from_le_bytes(std::array::from_fn(|j| s[8 * h + j] as i8 as u8));
        }
        // In the file value e = 128h + 32s + l has its two low bits at bits 2s of qs[32h + l]
        // and its third (u's: set when q ≥ 0) at bit 4h + s of hmask[l]. Its chunk is
        // k = 32h + 8s + c with c = l / 4: low vector 8h + 2s + c / 4 (bits 2(c % 4)), high
        // vector 4h + s (bit c). Four places (l = 4c..4c + 4) at a time.
        let (hmask, qs): ([u32; 8], [u32; 16]) = (words(b), words(&b[32..]));
        for h in 0..2 {
            for s in 0..4 {
                let (mut lo, mut hi, mut third) = (0, 0, 0);
                for c in 0..4 {
                    lo |= (qs[8 * h + c] >> (2 * s) & 0x0303_0303) << (2 * c);
                    hi |= (qs[8 * h + 4 + c] >> (2 * s) & 0x0303_0303) << (2 * c);
                }
                for (c, m) in hmask.iter().enumerate() {
                    third |= (m >> (4 * h + s) & 0x0101_0101) << c;
                }
                put(&mut low[r], 8 * h + 2 * s, lo);
                put(&mut low[r], 8 * h + 2 * s + 1, hi);
                put(&mut high[r], 4 * h + s, third);
            }
        }
    }
    interleave_bytes(scales[0], &mut dst[SCALES..]);
    interleave_bytes(scales[1], &mut dst[SCALES + 64..]);
    interleave_words(&low, &mut dst[LOW..]);
    interleave_words(&high, &mut dst[HIGH..]);
}

/// Value `u` (0..=7) of chunk `k`, place `4r + m`, of the group-block `g`.
fn value(g: &[u8], k: usize, at: usize) -> u8 {
    let low = (g[LOW + 32 * (k / 4) + at] >> (2 * (k % 4))) & 3;
    let high = (g[HIGH + 32 * (k / 8) + at] >> (k % 8)) & 1;
    low | high << 2
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
            for j in 0..16 {
                let sub: i32 = (0..16)
                    .map(|i| {
                        let (k, m) = (4 * j + i / 4, i % 4);
                        (value(g, k, 4 * r + m) as i32 - 4) * xq(16 * j + i)
                    })
                    .sum();
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

    /// [`tile_scalar`]'s bits with AVX2: eight rows in the lanes of a register, the unsigned
    /// values (at most 7) by the activations with `vpmaddubsw` (a sub-block's four chunks sum
    /// to at most 4·2·7·128, within 16 bits), widened by `vpmaddwd`; with VNNI `vpdpbusd`.
    /// Each sub-block's sum less 4 times its activations' sum, times its scale (`vpmulld`).
    ///
    /// # Safety
    /// As [`tile_scalar`]; the CPU has AVX2, FMA and F16C.
    pub(crate) unsafe fn tile_avx2(group: &GroupView, tile: &Tile) {
        assert!(group.values.len() >= group.stride * (tile.blocks - 1) + GROUP_BLOCK);
        kernel_by_level!(tile_nx, group, &GroupView, tile)
    }

    /// Bit `c` of each byte of `h` moved to bit 2 (0x04). A 16-bit shift moves no other byte's
    /// bit to bit 2: left by at most 2, right by at most 5.
    #[inline(always)]
    unsafe fn third_bit(h: __m256i, c: usize) -> __m256i {
        let m = _mm256_set1_epi8(0x04);
        match c {
            0 => _mm256_and_si256(_mm256_slli_epi16::<2>(h), m),
            1 => _mm256_and_si256(_mm256_slli_epi16::<1>(h), m),
            2 => _mm256_and_si256(h, m),
            3 => _mm256_and_si256(_mm256_srli_epi16::<1>(h), m),
            4 => _mm256_and_si256(_mm256_srli_epi16::<2>(h), m),
            5 => _mm256_and_si256(_mm256_srli_epi16::<3>(h), m),
            6 => _mm256_and_si256(_mm256_srli_epi16::<4>(h), m),
            _ => _mm256_and_si256(_mm256_srli_epi16::<5>(h), m),
        }
    }

    /// The low two bits at bits `2i` of each byte of `l`, moved to bits 0..2.
    #[inline(always)]
    unsafe fn low_bits(l: __m256i, i: usize) -> __m256i {
        let m = _mm256_set1_epi8(0x03);
        match i {
            0 => _mm256_and_si256(l, m),
            1 => _mm256_and_si256(_mm256_srli_epi16::<2>(l), m),
            2 => _mm256_and_si256(_mm256_srli_epi16::<4>(l), m),
            _ => _mm256_and_si256(_mm256_srli_epi16::<6>(l), m),
        }
    }

    #[inline(always)]
    unsafe fn tile_nx<const VNNI: bool, const NX: usize>(group: &GroupView, t: &Tile) {
        let mut acc = [_mm256_setzero_ps(); NX];
        let ones = _mm256_set1_epi16(1);
        // SAFETY (all reads below): super-block b < blocks of the group (GROUP_BLOCK bytes at
        // stride·b, checked by the caller); token n < nx's Q8_K block b (ACT_BLOCK bytes) in its
        // row (the caller's contract).
        unsafe {
            let bcast = |p: *const u8| _mm256_set1_epi32((p as *const i32).read_unaligned());
            for b in 0..t.blocks {
                let g = group.values.as_ptr().add(group.stride * b);
                crate::kernels::interleaved::x86::prefetch_block(g, GROUP_BLOCK);
                let xb = |n: usize| t.x.add(n * t.x_stride + ACT_BLOCK * b);
                // 4 times each sub-block's activation sum (the i16 sums of 16), per token.
                let mut offsets = [[0i32; 16]; NX];
                for (n, o) in offsets.iter_mut().enumerate() {
                    let bs = _mm256_loadu_si256(xb(n).add(260) as *const __m256i);
                    let lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(bs));
                    let hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(bs));
                    _mm256_storeu_si256(o.as_mut_ptr() as *mut _, _mm256_slli_epi32::<2>(lo));
                    _mm256_storeu_si256(
                        o.as_mut_ptr().add(8) as *mut _,
                        _mm256_slli_epi32::<2>(hi),
                    );
                }
                let mut isum = [_mm256_setzero_si256(); NX];
                let mut high = _mm256_setzero_si256();
                // j indexes the sub-blocks, their scales and every token's offsets.
                #[allow(clippy::needless_range_loop)]
                for j in 0..16 {
                    let low = _mm256_loadu_si256(g.add(LOW + 32 * j) as *const _);
                    if j % 2 == 0 {
                        high = _mm256_loadu_si256(g.add(HIGH + 32 * (j / 2)) as *const _);
                    }
                    let mut s = [_mm256_setzero_si256(); NX];
                    for i in 0..4 {
                        let k = 4 * j + i;
                        let u = _mm256_or_si256(low_bits(low, i), third_bit(high, k % 8));
                        for n in 0..NX {
                            let x = bcast(xb(n).add(4 + 4 * k));
                            s[n] = if VNNI {
                                _mm256_dpbusd_epi32(s[n], u, x)
                            } else {
                                _mm256_add_epi16(s[n], _mm256_maddubs_epi16(u, x))
                            };
                        }
                    }
                    let sc =
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64(g.add(SCALES + 8 * j) as *const _));
                    for n in 0..NX {
                        let sum = if VNNI {
                            s[n]
                        } else {
                            _mm256_madd_epi16(s[n], ones)
                        };
                        let sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(offsets[n][j]));
                        isum[n] = _mm256_add_epi32(isum[n], _mm256_mullo_epi32(sum, sc));
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
