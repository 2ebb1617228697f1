//! A work item's weights in the layout of the AMX kernels ([`super::amx`]): four groups' 32
//! rows as two B tiles per block, values as bytes (K-quants: times their sub-blocks' scales, in
//! two planes), with their per-row scales beside them.

use std::arch::x86_64::*;

use super::amx::TILE_M;
use super::lines::Lines;
use super::{q4_k, GroupView, GROUP_ROWS};

pub(crate) use super::ITEM_ROWS;
/// Tokens per kernel call: two A tiles.
pub(crate) const ITEM_TOKENS: usize = 2 * TILE_M;

/// A work item's weights in the tiles' layout, with their per-row numbers, for one type.
/// Units are what one set of products covers: a block of 32 (Q8_0 and its siblings, 1024
/// bytes), a K-quant super-block (256 values, two planes of four steps: 16384 bytes). Groups
/// past the matrix's last are zeros, their outputs never written.
#[derive(Default)]
pub(crate) struct ItemWeights {
    /// Per unit its B tiles, rows of 64 bytes (a unit of `k` values: `k / 4` rows a tile).
    pub b: Lines,
    /// Per block, per row: the f32 scale (d; for Q4_K also dmin, after the 32 d).
    pub d: Vec<f32>,
    /// Q4_K: per pair of sub-blocks, per row, the two mins.
    pub mins: Vec<i32>,
    pub groups: usize,
}

/// Where byte 0 of tile row `kk` (values `4kk..4kk + 4` of each row) of group `gi` lands in
/// a unit of `k` values per row: two B tiles of sixteen rows (two groups side by side).
#[inline(always)]
fn b_at(k: usize, gi: usize, kk: usize) -> usize {
    16 * k * (gi / 2) + 64 * kk + 32 * (gi % 2)
}

impl ItemWeights {
    /// Room for `bytes` of B tiles, zeros only where fewer than four groups leave some
    /// unwritten (the rest is all overwritten: no need to clear it first).
    fn reset(&mut self, bytes: usize, blocks: usize, d_per_row: usize, groups: usize) {
        if groups < ITEM_ROWS / GROUP_ROWS {
            self.b.clear();
        }
        self.b.resize(bytes);
        self.d.clear();
        self.d.resize(blocks * d_per_row * ITEM_ROWS, 0.0);
        self.mins.clear();
    }

    /// Q8_0, Q5_0, Q4_0, IQ4_NL, MXFP4: the views' values (bytes) and f32 scales.
    pub(crate) fn block32(&mut self, views: &[&GroupView], blocks: usize) {
        self.reset(1024 * blocks, blocks, 1, views.len());
        self.groups = views.len();
        for (gi, g) in views.iter().enumerate() {
            for b in 0..blocks {
                let src = &g.values[g.stride * b..g.stride * b + 256];
                for kk in 0..8 {
                    let at = 1024 * b + b_at(32, gi, kk);
                    self.b.bytes_mut()[at..at + 32].copy_from_slice(&src[32 * kk..32 * kk + 32]);
                }
                let d = &mut self.d[ITEM_ROWS * b + GROUP_ROWS * gi..][..GROUP_ROWS];
                d.copy_from_slice(&g.scales[GROUP_ROWS * b..GROUP_ROWS * (b + 1)]);
            }
        }
    }

    /// Q4_K, from the stored groups ([`q4_k`]'s layout): per super-block (16384 bytes) the
    /// values times their 6-bit scales, `sc·q = 32·hi + lo` (at most 63·15; Q5_K's 63·31), as
    /// two planes (hi, then lo) of four steps, one per pair of sub-blocks `p` (64 values, two B
    /// tiles): the layout of [`ItemWeights::q6_k`]; d and dmin; and the mins of each pair as two
    /// i16 in one i32 (`mins[(4b + p)·32 + row]`, for `vpmaddwd`).
    pub(crate) fn q4_k(&mut self, groups: &[&[u8]], blocks: usize) {
        self.scaled_nibbles::<false>(groups, blocks)
    }

    /// Q5_K, from the stored groups ([`super::q5_k`]'s layout: Q4_K's and the fifth bits):
    /// [`Self::q4_k`] with each value's fifth bit.
    pub(crate) fn q5_k(&mut self, groups: &[&[u8]], blocks: usize) {
        self.scaled_nibbles::<true>(groups, blocks)
    }

    /// [`Self::q4_k`] (`FIFTH`: [`Self::q5_k`]).
    fn scaled_nibbles<const FIFTH: bool>(&mut self, groups: &[&[u8]], blocks: usize) {
        let stride = if FIFTH {
            super::q5_k::GROUP_BLOCK
        } else {
            q4_k::GROUP_BLOCK
        };
        assert!(crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512);
        // SAFETY: AVX-512 F/BW/VL, asserted above.
        unsafe { self.scaled_nibbles_avx512::<FIFTH>(groups, blocks, stride) }
    }

    /// [`Self::scaled_nibbles`]' body, compiled for AVX-512 so that the per-chunk products and
    /// splits inline into it.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    unsafe fn scaled_nibbles_avx512<const FIFTH: bool>(
        &mut self,
        groups: &[&[u8]],
        blocks: usize,
        stride: usize,
    ) {
        let f16 = |g: &[u8], at: usize| half::f16::from_le_bytes([g[at], g[at + 1]]).to_f32();
        self.reset(16384 * blocks, blocks, 2, groups.len());
        self.mins.resize(4 * blocks * ITEM_ROWS, 0);
        self.groups = groups.len();
        // Super-block by super-block, the four groups together: their halves of each line of
        // B tiles written one after the other (group by group, each line came into L1 twice).
        for b in 0..blocks {
            for (gi, g) in groups.iter().enumerate() {
                let g = &g[stride * b..stride * (b + 1)];
                for p in 0..4 {
                    let step = 16384 * b + 2048 * p;
                    assert!(g.len() >= stride && self.b.bytes_mut().len() >= step + PLANE + 2048);
                    // SAFETY: the sub-blocks' bytes of pair p lie inside the group's block
                    // (`stride` bytes, checked), and the pair's step of both planes inside
                    // the item's B tiles (checked); AVX-512 F/BW/VL, this function's contract.
                    unsafe {
                        let dst = self.b.bytes_mut().as_mut_ptr().add(step + b_at(64, gi, 0));
                        scaled_nibble_pair::<FIFTH>(g.as_ptr(), p, dst);
                    }
                    for r in 0..GROUP_ROWS {
                        let m = |e: usize| g[q4_k::MINS + 16 * p + 2 * r + e] as i32;
                        self.mins[ITEM_ROWS * (4 * b + p) + GROUP_ROWS * gi + r] =
                            m(0) | m(1) << 16;
                    }
                }
                for r in 0..GROUP_ROWS {
                    self.d[2 * ITEM_ROWS * b + GROUP_ROWS * gi + r] = f16(g, 2 * r);
                    self.d[2 * ITEM_ROWS * b + ITEM_ROWS + GROUP_ROWS * gi + r] =
                        f16(g, 16 + 2 * r);
                }
            }
        }
    }

    /// IQ4_XS, from the stored groups ([`super::iq4_xs`]'s layout, whose nibbles sit as Q4_K's):
    /// per super-block (16384 bytes) the table values times their signed scales,
    /// `(ls − 32)·kvalues[q] = 64·hi + lo` (−3937 to 4064), as two planes laid out as
    /// [`ItemWeights::q6_k`]'s; and d. Q6_K's tile kernel computes it: the same chain.
    pub(crate) fn iq4_xs(&mut self, groups: &[&[u8]], blocks: usize) {
        assert!(crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512);
        // SAFETY: AVX-512 F/BW/VL, asserted above.
        unsafe { self.iq4_xs_avx512(groups, blocks) }
    }

    /// [`Self::iq4_xs`]'s body, compiled for AVX-512 (see [`Self::scaled_nibbles_avx512`]).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    unsafe fn iq4_xs_avx512(&mut self, groups: &[&[u8]], blocks: usize) {
        use super::iq4_xs::{GROUP_BLOCK, NIBBLES, SCALES};
        self.reset(16384 * blocks, blocks, 1, groups.len());
        self.groups = groups.len();
        // Super-block by super-block, as [`Self::scaled_nibbles_avx512`].
        for b in 0..blocks {
            for (gi, g) in groups.iter().enumerate() {
                let g = &g[GROUP_BLOCK * b..GROUP_BLOCK * (b + 1)];
                for p in 0..4 {
                    for half in 0..2 {
                        let sc = SCALES + 8 * (2 * p + half);
                        let scales = std::array::from_fn(|i| g[sc + i / 4] as i8 as i16);
                        for c in 0..8 {
                            let src = &g[NIBBLES + 256 * p + 32 * c..];
                            let at = 16384 * b + 2048 * p + b_at(64, gi, 8 * half + c);
                            let b = self.b.bytes_mut();
                            scale_split::<6>(Values::Iq4 { half }, src, &scales, b, at, at + PLANE);
                        }
                    }
                }
                for r in 0..GROUP_ROWS {
                    let d = half::f16::from_le_bytes([g[2 * r], g[2 * r + 1]]).to_f32();
                    self.d[ITEM_ROWS * b + GROUP_ROWS * gi + r] = d;
                }
            }
        }
    }

    /// Q6_K, from the unpacked views ([`super::q6_k`]'s unpacked layout): per super-block
    /// (16384 bytes) the values as `sc·(q − 32) = 64·hi + lo`, two planes (hi, then lo) of
    /// four steps of 64 values, two B tiles each; and d.
    pub(crate) fn q6_k(&mut self, views: &[&GroupView], blocks: usize) {
        assert!(crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512);
        // SAFETY: AVX-512 F/BW/VL, asserted above.
        unsafe { self.q6_k_avx512(views, blocks) }
    }

    /// [`Self::q6_k`]'s body, compiled for AVX-512 (see [`Self::scaled_nibbles_avx512`]).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
    unsafe fn q6_k_avx512(&mut self, views: &[&GroupView], blocks: usize) {
        self.reset(16384 * blocks, blocks, 1, views.len());
        self.groups = views.len();
        // Super-block by super-block, as [`Self::scaled_nibbles_avx512`].
        for b in 0..blocks {
            for (gi, g) in views.iter().enumerate() {
                let v = &g.values[g.stride * b..];
                for j in 0..16 {
                    let scales = std::array::from_fn(|i| v[16 + 8 * j + i / 4] as i8 as i16);
                    for i in 0..4 {
                        let src = &v[144 + 128 * j + 32 * i..];
                        let at = 16384 * b + 2048 * (j / 4) + b_at(64, gi, 4 * (j % 4) + i);
                        scale_split::<6>(
                            Values::Q6,
                            src,
                            &scales,
                            self.b.bytes_mut(),
                            at,
                            at + PLANE,
                        );
                    }
                }
                for r in 0..GROUP_ROWS {
                    let d = half::f16::from_le_bytes([v[2 * r], v[2 * r + 1]]).to_f32();
                    self.d[ITEM_ROWS * b + GROUP_ROWS * gi + r] = d;
                }
            }
        }
    }
}

/// The bytes from a unit's high plane to its low plane.
const PLANE: usize = super::amx_tiles::PLANE_BYTES;

/// How a chunk's 32 stored bytes (eight rows' four values each) hold their values.
#[derive(Clone, Copy)]
enum Values {
    /// Q6_K (unpacked): bytes less 32.
    Q6,
    /// IQ4_XS: `kvalues_iq4nl` of the nibbles `4·half` up.
    Iq4 { half: usize },
}

/// Pair `p` of a Q4_K (`FIFTH`: Q5_K) group block `g`'s sub-blocks, times their rows' scales,
/// as [`scale_split`] writes them (`hi` plane at `dst`, `lo` at `dst + PLANE`; tile row `kk`
/// of the group at `64·kk`), with 512-bit products of bytes: each chunk of 32 bytes holds 64
/// values (the pair's first sub-block in the low nibbles, its second in the high), multiplied
/// by `vpmaddubsw` against their scales with every other byte zero (the even values' products
/// in one vector of words, the odd ones' in another), split and joined into bytes by shifts and
/// byte blends (`prep_speed`, with the loop over super-blocks outside the groups': 0.082–0.092
/// ns a weight through 16-bit lanes and `vpmovwb`, 0.069–0.074 here).
///
/// # Safety
/// `g` holds the group's block ([`q4_k::GROUP_BLOCK`] bytes; Q5_K: `q5_k::GROUP_BLOCK`); `dst`
/// has the 8 tile rows of both halves (`64·16` bytes) in each plane; AVX-512 F/BW/VL.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
unsafe fn scaled_nibble_pair<const FIFTH: bool>(g: *const u8, p: usize, dst: *mut u8) {
    // SAFETY: the caller's contract: every read inside the group's block, every write inside
    // the two planes' rows.
    unsafe {
        // The rows' scales of both sub-blocks (8 bytes each), each repeated for its four
        // values of a chunk: lanes 0–1 the first sub-block's rows 0–3 and 4–7, lanes 2–3 the
        // second's.
        let scales =
            _mm512_broadcast_i32x4(_mm_loadu_si128(g.add(q4_k::SCALES + 16 * p) as *const _));
        // Byte i of a chunk's 64 values takes scale byte i / 4 (in its lane: 4·lane + j / 4).
        const INDEX: [u8; 64] = {
            let mut index = [0; 64];
            let mut i = 0;
            while i < 64 {
                index[i] = (i / 4) as u8;
                i += 1;
            }
            index
        };
        let index = _mm512_loadu_si512(INDEX.as_ptr() as *const _);
        let scales = _mm512_shuffle_epi8(scales, index);
        let even = _mm512_set1_epi16(0x00FF);
        let (s_even, s_odd) = (
            _mm512_and_si512(scales, even),
            _mm512_andnot_si512(even, scales),
        );
        let low = _mm256_set1_epi8(0x0F);
        let odd_bytes: __mmask64 = 0xAAAA_AAAA_AAAA_AAAA;
        let fifth = if FIFTH {
            _mm512_loadu_si512(g.add(super::q5_k::HIGH + 64 * p) as *const _)
        } else {
            _mm512_setzero_si512()
        };
        for c in 0..8 {
            let v = _mm256_loadu_si256(g.add(q4_k::NIBBLES + 256 * p + 32 * c) as *const _);
            let mut q = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_and_si256(v, low)),
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
            );
            if FIFTH {
                let bit = _mm512_and_si512(
                    _mm512_srl_epi16(fifth, _mm_cvtsi32_si128(c as i32)),
                    _mm512_set1_epi8(1),
                );
                q = _mm512_or_si512(q, _mm512_slli_epi16::<4>(bit));
            }
            // Words: the even values' products (at most 31·63), and the odd ones'.
            let (we, wo) = (
                _mm512_maddubs_epi16(q, s_even),
                _mm512_maddubs_epi16(q, s_odd),
            );
            let hi = _mm512_mask_blend_epi8(
                odd_bytes,
                _mm512_srli_epi16::<5>(we),
                _mm512_slli_epi16::<3>(wo),
            );
            let lo = _mm512_and_si512(
                _mm512_mask_blend_epi8(odd_bytes, we, _mm512_slli_epi16::<8>(wo)),
                _mm512_set1_epi8(31),
            );
            for (plane, v) in [(0, hi), (PLANE, lo)] {
                let at = dst.add(plane + 64 * c);
                _mm256_storeu_si256(at as *mut _, _mm512_castsi512_si256(v));
                _mm256_storeu_si256(at.add(512) as *mut _, _mm512_extracti64x4_epi64::<1>(v));
            }
        }
    }
}

/// 32 values (`values` of `src`) times their rows' scales (`scales[i]` for value `i`),
/// `w = q·s`, written as `hi = w >> SHIFT` to `dst[hi_at..]` and `lo = w mod 2^SHIFT` to
/// `dst[lo_at..]`, 32 bytes each: `w = 2^SHIFT·hi + lo` exactly, both in a signed byte as
/// |w| ≤ 2^(SHIFT + 7) (`SHIFT` 6: Q6_K's −3968 ≤ w ≤ 4096 and IQ4_XS's −3937 ≤ w ≤ 4064;
/// Q4_K's and Q5_K's, 0 ≤ w ≤ 63·31 with `SHIFT` 5, in [`scaled_nibble_pair`]).
#[inline]
fn scale_split<const SHIFT: u32>(
    values: Values,
    src: &[u8],
    scales: &[i16; 32],
    dst: &mut [u8],
    hi_at: usize,
    lo_at: usize,
) {
    assert!(src.len() >= 32 && dst.len() >= hi_at.max(lo_at) + 32);
    // SAFETY: 32 bytes read from src and written at hi_at and lo_at (checked
    // above); the CPU has AVX-512 F/BW/VL: this private function's callers assert it first.
    unsafe {
        let dst = dst.as_mut_ptr();
        let q = values_avx512(values, src.as_ptr());
        split_avx512::<SHIFT>(q, scales, dst.add(hi_at), dst.add(lo_at))
    }
}

/// The 32 values of `values` at `src`, as signed bytes.
///
/// # Safety
/// 32 bytes readable at `src`; AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn values_avx512(values: Values, src: *const u8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm256_loadu_si256(src as *const __m256i);
        let low = _mm256_set1_epi8(0x0F);
        let nibbles = |half: usize| {
            let v = if half == 0 {
                v
            } else {
                _mm256_srli_epi16::<4>(v)
            };
            _mm256_and_si256(v, low)
        };
        match values {
            Values::Q6 => _mm256_sub_epi8(v, _mm256_set1_epi8(32)),
            Values::Iq4 { half } => {
                let table = _mm_loadu_si128(crate::quant::KVALUES_IQ4NL.as_ptr() as *const __m128i);
                _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), nibbles(half))
            }
        }
    }
}

/// [`scale_split`]'s product and split, of the values `q`.
///
/// # Safety
/// 32 bytes writable at `hi` and `lo`; AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn split_avx512<const SHIFT: u32>(q: __m256i, scales: &[i16; 32], hi: *mut u8, lo: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe {
        let w = _mm512_mullo_epi16(
            _mm512_cvtepi8_epi16(q),
            _mm512_loadu_si512(scales.as_ptr() as *const _),
        );
        let mask = _mm512_set1_epi16((1 << SHIFT) - 1);
        _mm256_storeu_si256(
            hi as *mut __m256i,
            _mm512_cvtepi16_epi8(_mm512_srai_epi16::<SHIFT>(w)),
        );
        _mm256_storeu_si256(
            lo as *mut __m256i,
            _mm512_cvtepi16_epi8(_mm512_and_si512(w, mask)),
        );
    }
}

/// Bytes of one step of the packed activations ([`pack_acts`]): two A tiles (32 tokens) of 16
/// rows of `k` bytes.
pub(crate) const fn a_step(k: usize) -> usize {
    2 * TILE_M * k
}

/// Bytes of one super-block's token numbers in the packed Q8_K activations ([`pack_acts`]):
/// the 32 tokens' `d` (f32, token `t`'s at `4t`), then their eight sub-block sums (i16, at
/// `128 + 16t`), which the K-quant kernels' folds read for every item.
pub(crate) const TOKEN_NUMBERS: usize = 4 * ITEM_TOKENS + 16 * ITEM_TOKENS;

/// Where super-block `b`'s token numbers start in the packed Q8_K activations of a row of
/// `blocks` super-blocks: past the A tiles' steps.
pub(crate) const fn token_numbers_at(blocks: usize, b: usize) -> usize {
    4 * blocks * a_step(64) + TOKEN_NUMBERS * b
}

/// Tokens `t0..t0 + m` (`m` ≤ 32) of `x` as the A tiles read them, rows of `k` bytes one after
/// the other (aligned, in one line each, where the rows of `x` would cross lines and sit a
/// page apart): step `j` (Q8_K rows, `k` = 64: values `64j..` of each token; Q8_0, `k` = 32:
/// block `j`'s) at `dst[a_step(k)·j..]`, token `t`'s row at `k·(t − t0)` in it; rows past `m`
/// left as they were (the tiles are configured not to read them). Q8_K rows also get their
/// [`TOKEN_NUMBERS`] per super-block, side by side: read from the rows, a page or more apart,
/// the folds' loads of them missed the cache (17 % of the Q4_K kernel's samples in a profile
/// of the 7B shape's prompt).
pub(crate) fn pack_acts(x: &super::QuantizedActs, t0: usize, m: usize, k: usize, dst: &mut Lines) {
    let (steps, src_at): (usize, fn(usize) -> usize) = match k {
        64 => (x.cols() / 64, |j| {
            q4_k::ACT_BLOCK * (j / 4) + 4 + 64 * (j % 4)
        }),
        _ => (x.cols() / 32, |j| 34 * j + 2),
    };
    assert!(m <= ITEM_TOKENS && t0 + m <= x.n_tokens() && [32, 64].contains(&k));
    let blocks = if k == 64 { steps / 4 } else { 0 };
    dst.resize(steps * a_step(k) + blocks * TOKEN_NUMBERS);
    let dst = dst.bytes_mut();
    for t in 0..m {
        let row = x.row(t0 + t);
        for j in 0..steps {
            let at = a_step(k) * j + k * t;
            dst[at..at + k].copy_from_slice(&row[src_at(j)..src_at(j) + k]);
        }
        for b in 0..blocks {
            let (src, at) = (&row[q4_k::ACT_BLOCK * b..], token_numbers_at(blocks, b));
            dst[at + 4 * t..at + 4 * t + 4].copy_from_slice(&src[..4]);
            // Sub-block j's sum: Q8_K's sums of 16, 2j and 2j + 1 (at most 4,096 in size).
            let sum16 = |i: usize| i16::from_le_bytes([src[260 + 2 * i], src[261 + 2 * i]]);
            for j in 0..8 {
                let sum = sum16(2 * j).wrapping_add(sum16(2 * j + 1));
                let to = at + 4 * ITEM_TOKENS + 16 * t + 2 * j;
                dst[to..to + 2].copy_from_slice(&sum.to_le_bytes());
            }
        }
    }
}
