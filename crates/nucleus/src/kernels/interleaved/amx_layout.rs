//! A work item's weights in the layout of the AMX kernels ([`super::amx`]): four groups' 32
//! rows as two B tiles per block, values as bytes, with their per-row scales beside them.

use std::arch::x86_64::*;

use super::amx::TILE_M;
use super::{q4_k, GroupView, GROUP_ROWS};

/// Rows of a work item: four groups, the two B tiles' sixteen rows each.
pub(crate) const ITEM_ROWS: usize = 4 * GROUP_ROWS;
/// Tokens per kernel call: two A tiles.
pub(crate) const ITEM_TOKENS: usize = 2 * TILE_M;

/// A work item's weights in the tiles' layout, with their per-row numbers, for one type.
/// Units are what one set of products covers: a block of 32 (Q8_0 and its siblings), a Q4_K
/// sub-block of 32, a Q6_K sub-block of 16; `k` their values, `per_block` units per block.
/// Groups past the matrix's last are zeros, their outputs never written.
#[derive(Default)]
pub(crate) struct ItemWeights {
    /// Per unit the two B tiles, `16·k` bytes each.
    pub b: Vec<u8>,
    /// Per block, per row: the f32 scale (d; for Q4_K also dmin, after the 32 d).
    pub d: Vec<f32>,
    /// Per unit, per row: the integer scale (Q4_K and Q6_K), then for Q4_K per unit the mins.
    pub sc: Vec<i32>,
    pub mins: Vec<i32>,
    pub groups: usize,
}

/// Where byte `i` (0..32) of chunk `kk` of group `gi` lands in a unit's B tiles.
#[inline(always)]
fn b_at(k: usize, gi: usize, kk: usize) -> usize {
    16 * k * (gi / 2) + 64 * kk + 32 * (gi % 2)
}

impl ItemWeights {
    fn reset(&mut self, units: usize, k: usize, blocks: usize, d_per_row: usize, ints: bool) {
        self.b.clear();
        self.b.resize(units * 32 * k, 0);
        self.d.clear();
        self.d.resize(blocks * d_per_row * ITEM_ROWS, 0.0);
        self.sc.clear();
        self.mins.clear();
        if ints {
            self.sc.resize(units * ITEM_ROWS, 0);
        }
    }

    /// Q8_0, Q5_0, Q4_0, IQ4_NL, MXFP4: the views' values (bytes) and f32 scales.
    pub(crate) fn block32(&mut self, views: &[&GroupView], blocks: usize) {
        self.reset(blocks, 32, blocks, 1, false);
        self.groups = views.len();
        for (gi, g) in views.iter().enumerate() {
            for b in 0..blocks {
                let src = &g.values[g.stride * b..g.stride * b + 256];
                for kk in 0..8 {
                    let at = 1024 * b + b_at(32, gi, kk);
                    self.b[at..at + 32].copy_from_slice(&src[32 * kk..32 * kk + 32]);
                }
                let d = &mut self.d[ITEM_ROWS * b + GROUP_ROWS * gi..][..GROUP_ROWS];
                d.copy_from_slice(&g.scales[GROUP_ROWS * b..GROUP_ROWS * (b + 1)]);
            }
        }
    }

    /// Q4_K, from the stored groups ([`q4_k`]'s layout): nibbles spread to bytes, d and dmin,
    /// the 6-bit scales, and the mins of each pair of sub-blocks `p` as two i16 in one i32
    /// (`mins[(4b + p)·32 + row]`, for `vpmaddwd`).
    pub(crate) fn q4_k(&mut self, groups: &[&[u8]], blocks: usize) {
        let f16 = |g: &[u8], at: usize| half::f16::from_le_bytes([g[at], g[at + 1]]).to_f32();
        self.reset(8 * blocks, 32, blocks, 2, true);
        self.mins.resize(4 * blocks * ITEM_ROWS, 0);
        self.groups = groups.len();
        for (gi, g) in groups.iter().enumerate() {
            for b in 0..blocks {
                let g = &g[q4_k::GROUP_BLOCK * b..q4_k::GROUP_BLOCK * (b + 1)];
                for p in 0..4 {
                    for c in 0..8 {
                        let src = &g[160 + 256 * p + 32 * c..][..32];
                        let lo = 1024 * (8 * b + 2 * p) + b_at(32, gi, c);
                        spread_nibbles(src, &mut self.b, lo, lo + 1024);
                    }
                    for r in 0..GROUP_ROWS {
                        let (m0, m1) = (
                            g[96 + 16 * p + 2 * r] as i32,
                            g[96 + 16 * p + 2 * r + 1] as i32,
                        );
                        self.mins[ITEM_ROWS * (4 * b + p) + GROUP_ROWS * gi + r] = m0 | m1 << 16;
                    }
                }
                for j in 0..8 {
                    for r in 0..GROUP_ROWS {
                        self.sc[ITEM_ROWS * (8 * b + j) + GROUP_ROWS * gi + r] =
                            g[32 + 8 * j + r] as i32;
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

    /// Q6_K, from the unpacked views ([`super::q6_k`]'s unpacked layout): values, d, scales.
    pub(crate) fn q6_k(&mut self, views: &[&GroupView], blocks: usize) {
        self.reset(16 * blocks, 16, blocks, 1, true);
        self.groups = views.len();
        for (gi, g) in views.iter().enumerate() {
            for b in 0..blocks {
                let v = &g.values[g.stride * b..];
                for j in 0..16 {
                    let u = 16 * b + j;
                    for i in 0..4 {
                        let at = 512 * u + b_at(16, gi, i);
                        self.b[at..at + 32].copy_from_slice(&v[144 + 128 * j + 32 * i..][..32]);
                    }
                    for r in 0..GROUP_ROWS {
                        self.sc[ITEM_ROWS * u + GROUP_ROWS * gi + r] =
                            v[16 + 8 * j + r] as i8 as i32;
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

/// The 32 bytes of `src`, low nibbles to `dst[lo..lo + 32]`, high ones to `dst[hi..hi + 32]`.
#[inline]
fn spread_nibbles(src: &[u8], dst: &mut [u8], lo: usize, hi: usize) {
    assert!(src.len() >= 32 && dst.len() >= lo.max(hi) + 32);
    // SAFETY: 32 bytes read at src and written at lo and hi (checked above); SSE2 is part of
    // x86-64.
    unsafe {
        let m = _mm_set1_epi8(0x0F);
        for half in [0, 16] {
            let v = _mm_loadu_si128(src.as_ptr().add(half) as *const __m128i);
            let d = dst.as_mut_ptr();
            _mm_storeu_si128(d.add(lo + half) as *mut __m128i, _mm_and_si128(v, m));
            _mm_storeu_si128(
                d.add(hi + half) as *mut __m128i,
                _mm_and_si128(_mm_srli_epi16(v, 4), m),
            );
        }
    }
}
