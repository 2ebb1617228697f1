//! Q6_K matrices in the interleaved layout, computed with the arithmetic of llama.cpp's tiled
//! Q6_K kernel (`quant::scalar_k::dot_q6_k_batched`): per super-block of 256 inputs the exact
//! integer sum `isum = Σ_j scale_j·Σ (q − 32)·x` over the sixteen sub-blocks of 16, then one
//!
//! ```text
//! acc = fma(isum · d, dy, acc)
//! ```
//!
//! the same chain for every output, whatever the number of tokens: batch-invariant by
//! construction, like the other interleaved products. (The one-row Q6_K kernel keeps eight
//! partial sums per output and adds them at the end; in the interleaved layout, where one lane
//! is one row, that would cost a multiply per four values and row more.)
//!
//! Layout of one group of eight rows and one super-block (1680 bytes, the file's 8 × 210):
//! - `0..16`: the rows' d (f16);
//! - `16..144`: the scales, byte `16 + 8j + r` = scale (i8) of sub-block `j` of row `r`;
//! - `144..1168`: the low four bits, 32 bytes per (pair `p` of 32-value groups, chunk `c` of
//!   four): byte `4r + m` of `144 + 256p + 32c` holds value `64p + 4c + m` of row `r` in its low
//!   nibble and value `64p + 32 + 4c + m` in its high nibble (as Q4_K's nibbles);
//! - `1168..1680`: the high two bits, 32 bytes per (pair `p`, chunk `c` < 4): byte `4r + m` of
//!   `1168 + 128p + 32c` holds, from bit 0, those of the low and the high value of chunk `c`,
//!   then of chunk `c + 4`.
//!
//! For many tokens a group is first unpacked ([`unpack_group_scalar`], `x86::unpack_group`),
//! its values whole, so that the kernel only loads them: per super-block the 144 bytes of d
//! and scales as stored, then 2048 value bytes, sub-block `j` at `144 + 128j`, chunk `i` of it
//! (values `16j + 4i ..+4`) at `+ 32i`, byte `4r + m` value `16j + 4i + m` of row `r`. One
//! tile of tokens (decode) reads the stored layout and unpacks in registers (with AVX-512 VNNI
//! two groups at a time, `wide_stored::q6_k_pair`).

use super::interleave::{interleave_bytes, interleave_words, put, words};
use super::{GroupView, Tile, GROUP_ROWS};

/// Bytes of a Q6_K super-block in the file: ql[128], qh[64], scales[16] (i8), d (f16).
const FILE_BLOCK: usize = 210;
/// Bytes of one group's super-block in the interleaved layout.
pub(crate) const GROUP_BLOCK: usize = GROUP_ROWS * FILE_BLOCK;
/// Bytes of a Q8_K activation block: f32 d, 256 values, 16 i16 sums of 16.
const ACT_BLOCK: usize = 292;
pub(crate) const SCALES: usize = 16;
pub(crate) const NIBBLES: usize = 144;
pub(crate) const HIGH: usize = 1168;
/// Bytes of one group's super-block unpacked: the header (d and scales), then the values.
pub(crate) const UNPACKED_BLOCK: usize = NIBBLES + GROUP_ROWS * 256;

/// Writes group-block `dst` (GROUP_BLOCK bytes) from the eight file blocks `rows[r]`, four
/// values at a time. In the file (ggml's `block_q6_K`), half `h` of a block (values
/// `128h..`) keeps value `128h + 32m + l`'s low four bits in `ql[64h + 32(m % 2) + l]` (low
/// nibble for m < 2, high for m ≥ 2) and its high two bits at bit `2m` of `qh[32h + l]`; so
/// pair `p`'s low and high values of place `l` (`m` = 2(p % 2) and 2(p % 2) + 1) take their
/// nibbles from `ql[64h + l]` and `ql[64h + 32 + l]` and their high bits side by side from
/// bits `4(p % 2)..` of `qh[32h + l]`, with `h = p / 2`.
pub(crate) fn pack_group_block(rows: [&[u8]; GROUP_ROWS], dst: &mut [u8]) {
    // Row r's words: nibbles of pair p, chunk c at 8p + c; high bits of pair p, chunks c and
    // c + 4 at 4p + c.
    let (mut nibbles, mut high) = ([[0u8; 128]; GROUP_ROWS], [[0u8; 64]; GROUP_ROWS]);
    let mut scales = [[0u32; 4]; GROUP_ROWS];
    for (r, b) in rows.iter().enumerate() {
        dst[2 * r..2 * r + 2].copy_from_slice(&b[208..210]);
        scales[r] = words(&b[192..]);
        let b: &[u8; FILE_BLOCK] = b[..FILE_BLOCK].try_into().unwrap();
        #[cfg(target_arch = "x86_64")]
        if crate::quant::simd_level() >= crate::quant::SimdLevel::Avx2 {
            // SAFETY: AVX2 is present (`simd_level` checked the CPU).
            unsafe { row_words_avx2(b, &mut nibbles[r], &mut high[r]) };
            continue;
        }
        row_words(b, &mut nibbles[r], &mut high[r]);
    }
    // Written, never read: a read of fresh memory maps the zero page, and the write after it
    // costs a copy and a TLB flush on every core (most of a 7B file's load time, before).
    let half = |h: usize| scales.map(|w| w[2 * h] as u64 | (w[2 * h + 1] as u64) << 32);
    interleave_bytes(half(0), &mut dst[SCALES..]);
    interleave_bytes(half(1), &mut dst[SCALES + 64..]);
    interleave_words(&nibbles, &mut dst[NIBBLES..]);
    interleave_words(&high, &mut dst[HIGH..]);
}

/// One file block's words in the layout's order: the nibbles of pair `p`, chunk `c` at word
/// `8p + c`; the high bits of pair `p`, chunks `c` and `c + 4`, at word `4p + c`.
fn row_words(b: &[u8; FILE_BLOCK], nibbles: &mut [u8; 128], high: &mut [u8; 64]) {
    let (ql, qh): ([u32; 32], [u32; 16]) = (words(b), words(&b[128..]));
    for p in 0..4 {
        let (h, shift) = (p / 2, 4 * (p % 2) as u32);
        for c in 0..8 {
            let lo = (ql[16 * h + c] >> shift) & 0x0F0F_0F0F;
            let hi = (ql[16 * h + 8 + c] >> shift) & 0x0F0F_0F0F;
            put(nibbles, 8 * p + c, lo | hi << 4);
        }
        let bits = |c: usize| (qh[8 * h + c] >> shift) & 0x0F0F_0F0F;
        for c in 0..4 {
            put(high, 4 * p + c, bits(c) | bits(c + 4) << 4);
        }
    }
}

/// [`row_words`] with AVX2: a pair's 32 nibble bytes, or its 16 high-bit bytes, at a time.
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_words_avx2(b: &[u8; FILE_BLOCK], nibbles: &mut [u8; 128], high: &mut [u8; 64]) {
    use std::arch::x86_64::*;
    // SAFETY: every load reads 32 bytes within `b` (offsets up to 160 + 32 <= 210), every
    // store writes 32 bytes within `nibbles` or 16 within `high` (unaligned).
    unsafe {
        let low4 = _mm256_set1_epi8(0x0F);
        let load = |at: usize| _mm256_loadu_si256(b.as_ptr().add(at).cast());
        for h in 0..2 {
            // Pair 2h: the low nibbles of ql[64h..] and, above them, of ql[64h + 32..]; pair
            // 2h + 1: their high nibbles.
            let (lo, hi) = (load(64 * h), load(64 * h + 32));
            let even = _mm256_or_si256(
                _mm256_and_si256(lo, low4),
                _mm256_slli_epi16(_mm256_and_si256(hi, low4), 4),
            );
            let odd = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(lo, 4), low4),
                _mm256_andnot_si256(low4, hi),
            );
            let at = nibbles.as_mut_ptr().add(64 * h);
            _mm256_storeu_si256(at.cast(), even);
            _mm256_storeu_si256(at.add(32).cast(), odd);
            // High bits of chunks 0..4 (bytes 0..16 of qh[32h..]) below those of chunks 4..8.
            let qh = load(128 + 32 * h);
            for (e, shift) in [(0, 0), (1, 4)] {
                let bits = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), low4);
                let (c0, c4) = (
                    _mm256_castsi256_si128(bits),
                    _mm256_extracti128_si256(bits, 1),
                );
                let both = _mm_or_si128(c0, _mm_slli_epi16(c4, 4));
                _mm_storeu_si128(high.as_mut_ptr().add(16 * (2 * h + e)).cast(), both);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
#[test]
fn row_words_avx2_are_row_words() {
    if crate::quant::simd_level() < crate::quant::SimdLevel::Avx2 {
        return;
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..200 {
        let b: [u8; FILE_BLOCK] = std::array::from_fn(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u8
        });
        let (mut n1, mut h1) = ([0u8; 128], [0u8; 64]);
        let (mut n2, mut h2) = ([0u8; 128], [0u8; 64]);
        row_words(&b, &mut n1, &mut h1);
        // SAFETY: AVX2 checked above.
        unsafe { row_words_avx2(&b, &mut n2, &mut h2) };
        assert_eq!((n1, h1), (n2, h2));
    }
}

/// Unpacks `blocks` stored group-blocks of `src` into `values` ([`UNPACKED_BLOCK`] bytes
/// each, the layout of the module doc). (`x86::unpack_group` computes the same with AVX2.)
pub(crate) fn unpack_group_scalar(blocks: usize, src: &[u8], values: &mut [u8]) {
    assert!(src.len() >= blocks * GROUP_BLOCK && values.len() >= blocks * UNPACKED_BLOCK);
    for b in 0..blocks {
        let g = &src[GROUP_BLOCK * b..GROUP_BLOCK * (b + 1)];
        let v = &mut values[UNPACKED_BLOCK * b..UNPACKED_BLOCK * (b + 1)];
        v[..NIBBLES].copy_from_slice(&g[..NIBBLES]);
        for j in 0..16 {
            // Sub-block j: pair p, its low (j % 4 < 2) or high values, chunks 4·half...
            let (p, high, half) = (j / 4, j % 4 >= 2, j % 2);
            for i in 0..4 {
                let c = 4 * half + i;
                for l in 0..32 {
                    let byte = g[NIBBLES + 256 * p + 32 * c + l];
                    let bits =
                        g[HIGH + 128 * p + 32 * (c % 4) + l] >> (4 * half + 2 * high as usize);
                    let nib = if high { byte >> 4 } else { byte & 0xF };
                    v[NIBBLES + 128 * j + 32 * i + l] = nib | (bits & 3) << 4;
                }
            }
        }
    }
}

/// The reference kernel, on unpacked groups: the arithmetic of the module doc, per output.
///
/// # Safety
/// As [`super::TileFn`], the group unpacked, the activations being Q8_K rows of `tile.blocks`
/// super-blocks.
pub(crate) unsafe fn tile_scalar(group: &GroupView, t: &Tile) {
    for n in 0..t.nx {
        // SAFETY: the caller guarantees token n's activation row and 8 output floats.
        let (x, out) = unsafe {
            (
                std::slice::from_raw_parts(t.x.add(n * t.x_stride), t.blocks * ACT_BLOCK),
                std::slice::from_raw_parts_mut(t.out.add(n * t.out_stride), GROUP_ROWS),
            )
        };
        let mut acc = [0f32; GROUP_ROWS];
        for b in 0..t.blocks {
            let g = &group.values[group.stride * b..group.stride * b + UNPACKED_BLOCK];
            let xb = &x[ACT_BLOCK * b..ACT_BLOCK * (b + 1)];
            let dy = f32::from_le_bytes(xb[0..4].try_into().unwrap());
            for r in 0..GROUP_ROWS {
                let mut isum = 0i32;
                for j in 0..16 {
                    let mut sub = 0i32;
                    for i in 0..16 {
                        let q = g[NIBBLES + 128 * j + 32 * (i / 4) + 4 * r + i % 4] as i32 - 32;
                        sub += q * xb[4 + 16 * j + i] as i8 as i32;
                    }
                    isum += g[SCALES + 8 * j + r] as i8 as i32 * sub;
                }
                let d = half::f16::from_le_bytes([g[2 * r], g[2 * r + 1]]).to_f32();
                acc[r] = (isum as f32 * d).mul_add(dy, acc[r]);
            }
        }
        out.copy_from_slice(&acc);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{for_each_chunk, tile_stored, tile_unpacked, unpack_group};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// Every chunk of the stored group-blocks `gs` (the same super-block of `N` groups)
    /// unpacked in registers, in order: `f(j, i, values)` for chunk `i` of sub-block `j`, one
    /// register per group. The places in a pair are written out, so that each chunk's shifts
    /// are constants (a loop over `j` makes them branches).
    ///
    /// # Safety
    /// Each of `gs` holds GROUP_BLOCK bytes; the CPU has AVX2.
    #[inline(always)]
    pub(crate) unsafe fn for_each_chunk<const N: usize>(
        gs: [*const u8; N],
        mut f: impl FnMut(usize, usize, [__m256i; N]),
    ) {
        #[inline(always)]
        unsafe fn place<const UPPER: bool, const HALF: bool, const N: usize>(
            gs: [*const u8; N],
            p: usize,
            f: &mut impl FnMut(usize, usize, [__m256i; N]),
        ) {
            let j = 4 * p + 2 * UPPER as usize + HALF as usize;
            for i in 0..4 {
                // SAFETY: the caller's group-blocks.
                let v = gs.map(|g| unsafe {
                    chunk_fixed::<false, UPPER, HALF>(g, p, 4 * HALF as usize + i)
                });
                f(j, i, v);
            }
        }
        // SAFETY: forwarded.
        unsafe {
            for p in 0..4 {
                place::<false, false, N>(gs, p, &mut f);
                place::<false, true, N>(gs, p, &mut f);
                place::<true, false, N>(gs, p, &mut f);
                place::<true, true, N>(gs, p, &mut f);
            }
        }
    }

    /// Chunk `c` of a sub-block of pair `p` whose place in the pair is constant (`UPPER`: the
    /// high nibbles, j % 4 ≥ 2; `HALF`: j odd): the low or high nibbles, and the value's two
    /// high bits moved from 4·half (low values) or 4·half + 2 (high ones) to bits 4..6
    /// (16-bit shifts; what crosses into the next byte is masked off). With AVX-512 VL (`VL`)
    /// the two merge in one `vpternlogd` (bits 0..4 from the nibbles, the rest from the high
    /// bits, masked before their shift): two vector instructions fewer per 32 values.
    #[inline(always)]
    unsafe fn chunk_fixed<const VL: bool, const UPPER: bool, const HALF: bool>(
        g: *const u8,
        p: usize,
        c: usize,
    ) -> __m256i {
        let m4 = _mm256_set1_epi8(0x0F);
        // SAFETY: the caller's group-block holds GROUP_BLOCK bytes at `g`.
        let (w, h) = unsafe {
            (
                _mm256_loadu_si256(g.add(NIBBLES + 256 * p + 32 * c) as *const _),
                _mm256_loadu_si256(g.add(HIGH + 128 * p + 32 * (c % 4)) as *const _),
            )
        };
        if VL {
            // The high bits masked before the shift (low values' 0x33, high ones' 0xCC): bits
            // 6, 7 of the shifted byte are then zero, and what the shift brings in from the
            // next byte lands where the nibble is taken. One mask per load of `h` (shared by
            // the chunks of both halves), none per chunk.
            let hm = _mm256_and_si256(h, _mm256_set1_epi8(if UPPER { 0xCCu8 } else { 0x33 } as i8));
            let (nib, bits) = match (UPPER, HALF) {
                (false, false) => (w, _mm256_slli_epi16(hm, 4)),
                (false, true) => (w, hm),
                (true, false) => (_mm256_srli_epi16(w, 4), _mm256_slli_epi16(hm, 2)),
                (true, true) => (_mm256_srli_epi16(w, 4), _mm256_srli_epi16(hm, 2)),
            };
            // 0xE4: m4 ? nib : bits, bit by bit.
            return _mm256_ternarylogic_epi32::<0xE4>(nib, bits, m4);
        }
        let (nib, bits) = match (UPPER, HALF) {
            (false, false) => (w, _mm256_slli_epi16(h, 4)),
            (false, true) => (w, h),
            (true, false) => (_mm256_srli_epi16(w, 4), _mm256_slli_epi16(h, 2)),
            (true, true) => (_mm256_srli_epi16(w, 4), _mm256_srli_epi16(h, 2)),
        };
        _mm256_or_si256(
            _mm256_and_si256(nib, m4),
            _mm256_and_si256(bits, _mm256_set1_epi8(0x30)),
        )
    }

    /// [`unpack_group_scalar`] with AVX2.
    pub(crate) fn unpack_group(blocks: usize, src: &[u8], values: &mut [u8]) {
        assert!(src.len() >= blocks * GROUP_BLOCK && values.len() >= blocks * UNPACKED_BLOCK);
        // SAFETY: the sizes are checked; the caller checked the CPU's level (AVX2).
        unsafe { unpack_avx2(blocks, src, values) }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn unpack_avx2(blocks: usize, src: &[u8], values: &mut [u8]) {
        // SAFETY: block b < blocks: GROUP_BLOCK source bytes, UNPACKED_BLOCK destination bytes
        // (checked by the caller).
        unsafe {
            for b in 0..blocks {
                let g = src.as_ptr().add(GROUP_BLOCK * b);
                let v = values.as_mut_ptr().add(UNPACKED_BLOCK * b);
                std::ptr::copy_nonoverlapping(g, v, NIBBLES);
                for_each_chunk([g], |j, i, [values]| {
                    let dst = v.add(NIBBLES + 128 * j + 32 * i) as *mut __m256i;
                    _mm256_storeu_si256(dst, values);
                });
            }
        }
    }

    /// The offset of the values' storage without sign: 32·Σ_j scale_j·bsum_j for each row,
    /// from the group-block header at `g` (stored or unpacked) and the Q8_K block at `xb`.
    #[inline(always)]
    unsafe fn offset(g: *const u8, xb: *const u8) -> __m256i {
        let mut off = _mm256_setzero_si256();
        // SAFETY: the header's 128 scale bytes and the activation block's 16 sums (the
        // caller's block).
        unsafe {
            for k in 0..8 {
                // Row r's scales of sub-blocks 2k and 2k + 1 in 16-bit lanes 2r and 2r + 1.
                let a = _mm_loadl_epi64(g.add(SCALES + 16 * k) as *const _);
                let c = _mm_loadl_epi64(g.add(SCALES + 16 * k + 8) as *const _);
                let sc = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, c));
                let bs = _mm256_set1_epi32((xb.add(260 + 4 * k) as *const i32).read_unaligned());
                off = _mm256_add_epi32(off, _mm256_madd_epi16(sc, bs));
            }
        }
        _mm256_slli_epi32(off, 5)
    }

    /// Row r's scale of sub-block j in 16-bit lanes 2r and 2r + 1.
    #[inline(always)]
    unsafe fn scale(g: *const u8, j: usize) -> __m256i {
        // SAFETY: the header's scale bytes (the caller's block).
        let s = unsafe { _mm_loadl_epi64(g.add(SCALES + 8 * j) as *const _) };
        _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s, s))
    }

    /// Row r's scale of sub-block j in 32-bit lane r.
    #[inline(always)]
    unsafe fn scale32(g: *const u8, j: usize) -> __m256i {
        // SAFETY: the header's scale bytes (the caller's block).
        let s = unsafe { _mm_loadl_epi64(g.add(SCALES + 8 * j) as *const _) };
        _mm256_cvtepi8_epi32(s)
    }

    /// [`tile_scalar`]'s bits with AVX2 on a stored group (one tile of tokens: decode): eight
    /// rows in the lanes of a register, four values of each per `vpmaddubsw` (a six-bit value
    /// times an 8-bit activation: a pair sums to at most 2·63·128 = 16,128, two chunks to
    /// 32,256, within 16 bits), every two chunks scaled by `vpmaddwd` with the sub-block's
    /// scale; the −32 offset taken off through the activations' sums of 16. With AVX-512 VNNI a
    /// sub-block's sum comes from `vpdpbusd` in 32 bits, started at −32 times the sub-block's
    /// activation sum (at most 129,024 + 65,536 either way), and is scaled by `vpmulld`: the
    /// same integers. The sixteen sub-blocks are written out four at a time (`sub_block`), so
    /// that each chunk's shifts are constants: as a loop over `j` they were branches, and the
    /// one-row product ran a fifth slower (`decode_stream`).
    ///
    /// # Safety
    /// As [`super::super::TileFn`] with `stored` the group's stored bytes (GROUP_BLOCK per
    /// block); the CPU has AVX2, FMA and F16C.
    pub(crate) unsafe fn tile_stored(stored: &[u8], tile: &Tile) {
        assert!(stored.len() >= GROUP_BLOCK * tile.blocks);
        kernel_by_level!(stored_nx, stored, &[u8], tile)
    }

    /// [`tile_stored`] on an unpacked group (many tokens): the values only loaded.
    ///
    /// # Safety
    /// As [`super::super::TileFn`], the group unpacked; the CPU has AVX2, FMA and F16C.
    pub(crate) unsafe fn tile_unpacked(group: &GroupView, tile: &Tile) {
        assert!(group.values.len() >= group.stride * (tile.blocks - 1) + UNPACKED_BLOCK);
        kernel_by_level!(unpacked_nx, group, &GroupView, tile)
    }

    #[inline(always)]
    unsafe fn stored_nx<const VNNI: bool, const NX: usize>(stored: &[u8], t: &Tile) {
        // SAFETY: forwarded.
        unsafe { tile_nx::<false, VNNI, NX>(stored.as_ptr(), GROUP_BLOCK, t) }
    }

    #[inline(always)]
    unsafe fn unpacked_nx<const VNNI: bool, const NX: usize>(group: &GroupView, t: &Tile) {
        // SAFETY: forwarded.
        unsafe { tile_nx::<true, VNNI, NX>(group.values.as_ptr(), group.stride, t) }
    }

    #[inline(always)]
    unsafe fn tile_nx<const UNPACKED: bool, const VNNI: bool, const NX: usize>(
        group: *const u8,
        stride: usize,
        t: &Tile,
    ) {
        let mut acc = [_mm256_setzero_ps(); NX];
        // SAFETY (all reads below): super-block b < blocks of the group (GROUP_BLOCK or
        // UNPACKED_BLOCK bytes at stride·b, checked by the callers); token n < nx's Q8_K block
        // b (ACT_BLOCK bytes) in its row (the caller's contract).
        unsafe {
            for b in 0..t.blocks {
                let g = group.add(stride * b);
                if !UNPACKED {
                    crate::kernels::interleaved::x86::prefetch_block(g, GROUP_BLOCK);
                }
                let xs: [*const u8; NX] =
                    std::array::from_fn(|n| t.x.add(n * t.x_stride + ACT_BLOCK * b));
                // With VNNI each sub-block's sum starts at −32·bsum_j (the offset of the
                // values' storage without sign, taken off inside the chain instead of after
                // it: the same integers, fewer instructions).
                let mut start = [[0i32; 16]; NX];
                if VNNI {
                    for (x, st) in xs.iter().zip(start.iter_mut()) {
                        for half in 0..2 {
                            let sums = _mm_loadu_si128(x.add(260 + 16 * half) as *const _);
                            let s32 = _mm256_slli_epi32(_mm256_cvtepi16_epi32(sums), 5);
                            let neg = _mm256_sub_epi32(_mm256_setzero_si256(), s32);
                            _mm256_storeu_si256(st.as_mut_ptr().add(8 * half) as *mut _, neg);
                        }
                    }
                }
                let mut isum = [_mm256_setzero_si256(); NX];
                // The four places of a pair written out: their shifts are constants.
                for p in 0..4 {
                    let j = 4 * p;
                    sub_block::<UNPACKED, VNNI, NX, false, false>(g, j, &xs, &start, &mut isum);
                    sub_block::<UNPACKED, VNNI, NX, false, true>(g, j + 1, &xs, &start, &mut isum);
                    sub_block::<UNPACKED, VNNI, NX, true, false>(g, j + 2, &xs, &start, &mut isum);
                    sub_block::<UNPACKED, VNNI, NX, true, true>(g, j + 3, &xs, &start, &mut isum);
                }
                let d = _mm256_cvtph_ps(_mm_loadu_si128(g as *const _));
                for n in 0..NX {
                    let total = if VNNI {
                        isum[n]
                    } else {
                        _mm256_sub_epi32(isum[n], offset(g, xs[n]))
                    };
                    let dy = _mm256_set1_ps((xs[n] as *const f32).read_unaligned());
                    let wd = _mm256_mul_ps(_mm256_cvtepi32_ps(total), d);
                    acc[n] = _mm256_fmadd_ps(wd, dy, acc[n]);
                }
            }
            for (n, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(t.out.add(n * t.out_stride), *a);
            }
        }
    }

    /// Sub-block `j` of super-block `g` against each token's Q8_K block `xs[n]`, added to
    /// `isum[n]` as scale_j · Σ q·x (VNNI: from `start[n][j]`, see [`tile_nx`]); `UPPER` and
    /// `HALF` are `j`'s place in its pair (j % 4 ≥ 2, j odd).
    #[inline(always)]
    unsafe fn sub_block<
        const UNPACKED: bool,
        const VNNI: bool,
        const NX: usize,
        const UPPER: bool,
        const HALF: bool,
    >(
        g: *const u8,
        j: usize,
        xs: &[*const u8; NX],
        start: &[[i32; 16]; NX],
        isum: &mut [__m256i; NX],
    ) {
        // SAFETY (all reads): the caller's super-block `g` and activation blocks `xs`.
        unsafe {
            let values = |i: usize| {
                if UNPACKED {
                    _mm256_loadu_si256(g.add(NIBBLES + 128 * j + 32 * i) as *const _)
                } else {
                    chunk_fixed::<VNNI, UPPER, HALF>(g, j / 4, 4 * HALF as usize + i)
                }
            };
            let bcast = |p: *const u8| _mm256_set1_epi32((p as *const i32).read_unaligned());
            if VNNI {
                let mut s: [__m256i; NX] = std::array::from_fn(|n| _mm256_set1_epi32(start[n][j]));
                for i in 0..4 {
                    let v = values(i);
                    for (x, s) in xs.iter().zip(s.iter_mut()) {
                        *s = _mm256_dpbusd_epi32(*s, v, bcast(x.add(4 + 16 * j + 4 * i)));
                    }
                }
                let sc = scale32(g, j);
                for (i, s) in isum.iter_mut().zip(s) {
                    *i = _mm256_add_epi32(*i, _mm256_mullo_epi32(s, sc));
                }
                return;
            }
            let sc = scale(g, j);
            for two in 0..2 {
                let mut s = [_mm256_setzero_si256(); NX];
                for i in 2 * two..2 * two + 2 {
                    let v = values(i);
                    for (x, s) in xs.iter().zip(s.iter_mut()) {
                        let x = bcast(x.add(4 + 16 * j + 4 * i));
                        *s = _mm256_add_epi16(*s, _mm256_maddubs_epi16(v, x));
                    }
                }
                for (i, s) in isum.iter_mut().zip(s) {
                    *i = _mm256_add_epi32(*i, _mm256_madd_epi16(s, sc));
                }
            }
        }
    }
}
