//! Q4_K matrices in the interleaved layout, computed with the arithmetic of the one-row Q4_K
//! kernel that both arithmetics use (llama.cpp's repacked Q4_K gemv, `BLOCK_SUMS` in
//! `quant/x86/k_quants.rs`, `quant::scalar_k::dot_q4_k`): per super-block of 256 inputs, the
//! exact integer sum `isum = Σ_j scale_j·Σ q·x` and min sum `imin = Σ_j min_j·bsum_j`, then
//!
//! ```text
//! acc = fma(isum, d·dy, acc);   acc_min = fma(imin, dmin·dy, acc_min);   out = acc − acc_min
//! ```
//!
//! Integer sums are exact in any order, so a row computed here has the bits of the one-row
//! kernel: repacking Q4_K changes no result, only the speed (eight rows per instruction,
//! the weights read once for four tokens).
//!
//! Layout of one group of eight rows and one super-block (1184 bytes, the file's 1152 plus the
//! scales and mins unpacked to bytes):
//! - `0..16`: the rows' d (f16), `16..32`: their dmin (f16);
//! - `32..96`: the 6-bit scales, byte `32 + 8j + r` = scale of sub-block `j` of row `r`;
//! - `96..160`: the 6-bit mins in pairs, byte `96 + 16p + 2r + e` = min of sub-block `2p + e`;
//! - `160..1184`: the nibbles, 32 bytes per (sub-block pair `p`, chunk `c` of four): byte
//!   `4r + m` of `160 + 256p + 32c` holds value `64p + 4c + m` of row `r` in its low nibble
//!   (sub-block `2p`) and value `64p + 32 + 4c + m` in its high nibble (sub-block `2p + 1`).

use super::{GroupView, Tile, GROUP_ROWS};

/// Inputs per super-block.
pub(crate) const QK_K: usize = 256;
/// Bytes of a Q4_K super-block in the file.
const FILE_BLOCK: usize = 144;
/// Bytes of one group's super-block in the interleaved layout.
pub(crate) const GROUP_BLOCK: usize = 1184;
/// Bytes of a Q8_K activation block: f32 d, 256 values, 16 i16 sums of 16.
pub(crate) const ACT_BLOCK: usize = 292;
pub(crate) const SCALES: usize = 32;
pub(crate) const MINS: usize = 96;
pub(crate) const NIBBLES: usize = 160;

/// Writes group-block `dst` (GROUP_BLOCK bytes) from the eight file blocks `rows[r]`.
pub(crate) fn pack_group_block(rows: [&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    pack_group_block_with(rows, 16, dst)
}

/// [`pack_group_block`] for blocks whose 128 bytes of nibbles start at `nibbles_at` (Q5_K's
/// after its fifth bits), their d, dmin and 12 scale bytes first as in Q4_K's.
pub(crate) fn pack_group_block_with(rows: [&[u8]; GROUP_ROWS], nibbles_at: usize, dst: &mut [u8]) {
    let (mut scales, mut mins) = ([0u64; GROUP_ROWS], [0u64; GROUP_ROWS]);
    for (r, b) in rows.iter().enumerate() {
        dst[2 * r..2 * r + 2].copy_from_slice(&b[0..2]);
        dst[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&b[2..4]);
        (scales[r], mins[r]) = scales_mins(&b[4..16]);
    }
    super::interleave::interleave_bytes(scales, &mut dst[SCALES..]);
    super::interleave::interleave_pairs(mins, &mut dst[MINS..]);
    // File: byte l of pair p's 32 holds value 64p + l (low) and 64p + 32 + l (high), so the
    // file's word 8p + c is chunk c of pair p.
    let nibbles = rows.map(|b| &b[nibbles_at..nibbles_at + FILE_BLOCK - 16]);
    super::interleave::interleave_rows(nibbles, 32, &mut dst[NIBBLES..]);
}

/// The eight 6-bit scales and mins of a K-quant super-block's 12 bytes, byte `j` of each
/// word being sub-block `j`'s (`quant::scale_min_k4`, four bytes at a time).
fn scales_mins(q: &[u8]) -> (u64, u64) {
    let [a, b, c]: [u32; 3] = super::interleave::words(q);
    let low = |x: u32| x & 0x3F3F_3F3F;
    let high = |x: u32, top: u32| x & 0x0F0F_0F0F | (top >> 6 & 0x0303_0303) << 4;
    let word = |lo: u32, hi: u32| lo as u64 | (hi as u64) << 32;
    (word(low(a), high(c, a)), word(low(b), high(c >> 4, b)))
}

#[cfg(test)]
#[test]
fn scales_and_mins_four_at_a_time_are_scale_min_k4s() {
    use crate::quant::scale_min_k4;
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..1000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let q: [u8; 12] = std::array::from_fn(|i| (seed.rotate_left(5 * i as u32) >> 13) as u8);
        let (s, m) = scales_mins(&q);
        for j in 0..8 {
            assert_eq!(
                scale_min_k4(j, &q),
                ((s >> (8 * j)) as u8, (m >> (8 * j)) as u8)
            );
        }
    }
}

/// The reference kernel: the arithmetic of the module doc, per output.
///
/// # Safety
/// As [`super::TileFn`], the activations being Q8_K rows of `tile.blocks` super-blocks.
pub(crate) unsafe fn tile_scalar(group: &GroupView, t: &Tile) {
    // SAFETY: forwarded.
    unsafe { tile_scalar_chain::<false>(group, t) }
}

/// [`tile_scalar`] with the float chain of llama.cpp's repacked Q4_K gemm (`PAIRS`), which
/// `--exact` takes for a prompt's rows in whole groups of four
/// (`quant::scalar_k::dot_q4_k_gemm`): one FMA per pair of sub-blocks instead of one per
/// super-block, on the same integer sums.
///
/// # Safety
/// As [`tile_scalar`].
pub(crate) unsafe fn tile_scalar_pairs(group: &GroupView, t: &Tile) {
    // SAFETY: forwarded.
    unsafe { tile_scalar_chain::<true>(group, t) }
}

/// # Safety
/// As [`tile_scalar`].
unsafe fn tile_scalar_chain<const PAIRS: bool>(group: &GroupView, t: &Tile) {
    for n in 0..t.nx {
        // SAFETY: the caller guarantees token n's activation row and 8 output floats.
        let (x, out) = unsafe {
            (
                std::slice::from_raw_parts(t.x.add(n * t.x_stride), t.blocks * ACT_BLOCK),
                std::slice::from_raw_parts_mut(t.out.add(n * t.out_stride), GROUP_ROWS),
            )
        };
        let (mut acc, mut acc_min) = ([0f32; GROUP_ROWS], [0f32; GROUP_ROWS]);
        for b in 0..t.blocks {
            let g = &group.values[group.stride * b..group.stride * b + GROUP_BLOCK];
            let xb = &x[ACT_BLOCK * b..ACT_BLOCK * (b + 1)];
            let dy = f32::from_le_bytes(xb[0..4].try_into().unwrap());
            let xq = |i: usize| xb[4 + i] as i8 as i32;
            let bsum = |j: usize| {
                let s = |k: usize| i16::from_le_bytes([xb[260 + 2 * k], xb[261 + 2 * k]]) as i32;
                s(2 * j) + s(2 * j + 1)
            };
            for r in 0..GROUP_ROWS {
                // Per pair of sub-blocks: the scaled integer sum and the min sum.
                let mut pairs = [(0i32, 0i32); 4];
                for j in 0..8 {
                    let (p, high) = (j / 2, j % 2 == 1);
                    let mut sub = 0i32;
                    for i in 0..32 {
                        let byte = g[NIBBLES + 256 * p + 32 * (i / 4) + 4 * r + i % 4];
                        let q = if high { byte >> 4 } else { byte & 0xF } as i32;
                        sub += q * xq(64 * p + 32 * high as usize + i);
                    }
                    pairs[p].0 += g[SCALES + 8 * j + r] as i32 * sub;
                    pairs[p].1 += g[MINS + 16 * p + 2 * r + j % 2] as i32 * bsum(j);
                }
                let f16 = |at: usize| half::f16::from_le_bytes([g[at], g[at + 1]]).to_f32();
                let (d, dmin) = (f16(2 * r) * dy, f16(16 + 2 * r) * dy);
                if PAIRS {
                    for (isum, imin) in pairs {
                        acc[r] = (isum as f32).mul_add(d, acc[r]);
                        acc_min[r] = (imin as f32).mul_add(dmin, acc_min[r]);
                    }
                } else {
                    let isum: i32 = pairs.iter().map(|p| p.0).sum();
                    let imin: i32 = pairs.iter().map(|p| p.1).sum();
                    acc[r] = (isum as f32).mul_add(d, acc[r]);
                    acc_min[r] = (imin as f32).mul_add(dmin, acc_min[r]);
                }
            }
        }
        for r in 0..GROUP_ROWS {
            out[r] = acc[r] - acc_min[r];
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{sub_block_sums, tile_avx2, tile_avx2_pairs};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// [`tile_scalar`]'s bits with AVX2: eight rows in the lanes of a register, four values of
    /// each per `vpmaddubsw` (a nibble times an 8-bit activation: a pair sums to at most
    /// 2·15·128, a sub-block's eight chunks to 30,720, within 16 bits), each sub-block's sum
    /// scaled by `vpmaddwd`, the min sums by `vpmaddwd` with the activations' pair sums. With
    /// AVX-512 VNNI a sub-block's sum comes from `vpdpbusd` in 32 bits (at most 61,440) and is
    /// scaled by `vpmulld`: the same integers.
    ///
    /// # Safety
    /// As [`tile_scalar`]; the CPU has AVX2, FMA and F16C.
    pub(crate) unsafe fn tile_avx2(group: &GroupView, tile: &Tile) {
        assert!(group.values.len() >= group.stride * (tile.blocks - 1) + GROUP_BLOCK);
        kernel_by_level!(tile_sums, group, &GroupView, tile)
    }

    /// [`tile_avx2`] with [`super::tile_scalar_pairs`]'s float chain (the same bits).
    ///
    /// # Safety
    /// As [`tile_avx2`].
    pub(crate) unsafe fn tile_avx2_pairs(group: &GroupView, tile: &Tile) {
        assert!(group.values.len() >= group.stride * (tile.blocks - 1) + GROUP_BLOCK);
        kernel_by_level!(tile_pairs, group, &GroupView, tile)
    }

    #[inline(always)]
    unsafe fn tile_sums<const VNNI: bool, const NX: usize>(group: &GroupView, t: &Tile) {
        // SAFETY: forwarded.
        unsafe { tile_nx::<VNNI, NX, false>(group, t) }
    }

    #[inline(always)]
    unsafe fn tile_pairs<const VNNI: bool, const NX: usize>(group: &GroupView, t: &Tile) {
        // SAFETY: forwarded.
        unsafe { tile_nx::<VNNI, NX, true>(group, t) }
    }

    /// The eight sub-blocks' activation sums of the Q8_K block at `block` (each the pair of its
    /// 16-value sums, i16), in order: sub-blocks `2p` and `2p + 1` in 32-bit lane `p`.
    ///
    /// # Safety
    /// `block` is a Q8_K block ([`ACT_BLOCK`] bytes); the caller has AVX2.
    #[inline(always)]
    pub(crate) unsafe fn sub_block_sums(block: *const u8) -> __m128i {
        // SAFETY: the block's 16 sums at 260 (the caller's contract).
        unsafe {
            let bs = _mm256_loadu_si256(block.add(260) as *const __m256i);
            _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            )
        }
    }

    /// `PAIRS`: one FMA per pair of sub-blocks (llama.cpp's gemm) instead of one per
    /// super-block (its gemv).
    #[inline(always)]
    unsafe fn tile_nx<const VNNI: bool, const NX: usize, const PAIRS: bool>(
        group: &GroupView,
        t: &Tile,
    ) {
        let mut acc = [_mm256_setzero_ps(); NX];
        let mut acc_min = [_mm256_setzero_ps(); NX];
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
                let dy = |n: usize| _mm256_set1_ps((xb(n) as *const f32).read_unaligned());
                let d_dy: [__m256; NX] = std::array::from_fn(|n| _mm256_mul_ps(d, dy(n)));
                let dmin_dy: [__m256; NX] = std::array::from_fn(|n| _mm256_mul_ps(dmin, dy(n)));
                // A pair's scaled sum: into the block's integer sum, or (PAIRS) into the float
                // accumulator at once.
                let mut isum = [_mm256_setzero_si256(); NX];
                for p in 0..4 {
                    let s = pair_sums::<VNNI, NX>(g, &xb, p);
                    for n in 0..NX {
                        if PAIRS {
                            acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[n]), d_dy[n], acc[n]);
                        } else {
                            isum[n] = _mm256_add_epi32(isum[n], s[n]);
                        }
                    }
                }
                for n in 0..NX {
                    let q8s = sub_block_sums(xb(n));
                    // Pair p's two sums in every 32-bit lane: a shuffle each, no trip through
                    // a general register.
                    let q8s = _mm256_castsi128_si256(q8s);
                    let mut imin = _mm256_setzero_si256();
                    for p in 0..4 {
                        let pair = _mm256_permutevar8x32_epi32(q8s, _mm256_set1_epi32(p as i32));
                        let mins =
                            _mm256_cvtepu8_epi16(_mm_loadu_si128(g.add(MINS + 16 * p) as *const _));
                        let m = _mm256_madd_epi16(mins, pair);
                        if PAIRS {
                            acc_min[n] =
                                _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dmin_dy[n], acc_min[n]);
                        } else {
                            imin = _mm256_add_epi32(imin, m);
                        }
                    }
                    if !PAIRS {
                        acc[n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[n]), d_dy[n], acc[n]);
                        acc_min[n] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), dmin_dy[n], acc_min[n]);
                    }
                }
            }
            for n in 0..NX {
                _mm256_storeu_ps(
                    t.out.add(n * t.out_stride),
                    _mm256_sub_ps(acc[n], acc_min[n]),
                );
            }
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
        let mut s_lo = [_mm256_setzero_si256(); NX];
        let mut s_hi = [_mm256_setzero_si256(); NX];
        let mut out = [_mm256_setzero_si256(); NX];
        // SAFETY: the super-block's GROUP_BLOCK bytes at g and each token's block at xb(n)
        // (the caller's contract, as in tile_nx).
        unsafe {
            for c in 0..8 {
                let w = _mm256_loadu_si256(g.add(NIBBLES + 256 * p + 32 * c) as *const _);
                let lo = _mm256_and_si256(w, m4);
                // VNNI: the high nibbles left in place (16 times their value: a product of
                // four is at most 4·240·128, eight chunks' sum within 2^20), the sum divided
                // by 16 after the chunks, exactly: a shift fewer per chunk.
                let hi = if VNNI {
                    _mm256_andnot_si256(m4, w)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16(w, 4), m4)
                };
                for n in 0..NX {
                    let x = xb(n).add(4 + 64 * p + 4 * c);
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
                    let s_hi = _mm256_srai_epi32::<4>(s_hi[n]);
                    out[n] = _mm256_add_epi32(
                        _mm256_mullo_epi32(s_lo[n], sc_lo),
                        _mm256_mullo_epi32(s_hi, sc_hi),
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
                    out[n] = _mm256_add_epi32(
                        _mm256_madd_epi16(s_lo[n], sc_lo),
                        _mm256_madd_epi16(s_hi[n], sc_hi),
                    );
                }
            }
        }
        out
    }
}
