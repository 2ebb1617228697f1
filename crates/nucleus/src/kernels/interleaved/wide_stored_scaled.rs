//! Decode's Q3_K, Q6_K and IQ4_XS products with AVX-512 VNNI, two groups read as stored side by
//! side in 512-bit registers as [`super::wide_stored`] does for Q4_K and Q5_K: the types whose
//! super-block ends in one scaled integer sum, `fma(isum·d, dy, acc)` (no mins). Each lane
//! follows the 256-bit kernel's chain for its row (`q3_k::tile_avx2`, `q6_k::tile_stored`,
//! `iq4_xs::tile_avx2`, their VNNI bodies), operation for operation: a row's outputs have the
//! same bits here, there and in the scalar kernels (`tests_tiled.rs`, `tests_amx.rs`).

use std::arch::x86_64::*;

use super::q4_k::{sub_block_sums, ACT_BLOCK};
use super::wide::{join, table_plus_128};
use super::wide_stored::{dot_chunk, join16, pair_by_tokens, prefetch_pair, store_outputs};
use super::{iq4_xs, q3_k, q6_k, Tile, PREFETCH_L1, TILE_TOKENS};
use crate::quant::KVALUES_IQ4NL;

/// [`super::wide_stored::q4_k_pair`] for two Q3_K groups, in the chain of `q3_k::tile_avx2`'s VNNI body: per
/// sub-block `vpdpbusd` of the unsigned values by the activations, less 4 times the sub-block's
/// activation sum, times its scale; per super-block `fma(isum·d, dy, acc)`.
///
/// # Safety
/// As [`super::wide_stored::q4_k_pair`], the groups of Q3_K.
pub(crate) unsafe fn q3_k_pair(a: &[u8], b: &[u8], t: &Tile) {
    pair_by_tokens!(q3_k_nx; q3_k::GROUP_BLOCK, a, b, t)
}

/// Bit `c` of each byte moved to bit 2 (0x04), as `q3_k::x86::third_bit`: a 16-bit shift
/// moves no other byte's bit to bit 2.
#[inline(always)]
unsafe fn third_bit(h: __m512i, c: usize) -> __m512i {
    let m = _mm512_set1_epi8(0x04);
    match c {
        0 => _mm512_and_si512(_mm512_slli_epi16::<2>(h), m),
        1 => _mm512_and_si512(_mm512_slli_epi16::<1>(h), m),
        2 => _mm512_and_si512(h, m),
        3 => _mm512_and_si512(_mm512_srli_epi16::<1>(h), m),
        4 => _mm512_and_si512(_mm512_srli_epi16::<2>(h), m),
        5 => _mm512_and_si512(_mm512_srli_epi16::<3>(h), m),
        6 => _mm512_and_si512(_mm512_srli_epi16::<4>(h), m),
        _ => _mm512_and_si512(_mm512_srli_epi16::<5>(h), m),
    }
}

/// The low two bits at bits `2i` of each byte moved to bits 0..2.
#[inline(always)]
unsafe fn low_bits(l: __m512i, i: usize) -> __m512i {
    let m = _mm512_set1_epi8(0x03);
    match i {
        0 => _mm512_and_si512(l, m),
        1 => _mm512_and_si512(_mm512_srli_epi16::<2>(l), m),
        2 => _mm512_and_si512(_mm512_srli_epi16::<4>(l), m),
        _ => _mm512_and_si512(_mm512_srli_epi16::<6>(l), m),
    }
}

/// [`q3_k_pair`]'s work.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q3_k_nx<const NX: usize>(a: *const u8, b: *const u8, t: &Tile) {
    use q3_k::{GROUP_BLOCK, HIGH, LOW, SCALES};
    let mut acc = [_mm512_setzero_ps(); NX];
    // SAFETY (all reads below): super-block k < blocks of both groups (GROUP_BLOCK bytes
    // each, checked by the caller); token n < nx's Q8_K block k in its row.
    unsafe {
        for k in 0..t.blocks {
            let (ga, gb) = (a.add(GROUP_BLOCK * k), b.add(GROUP_BLOCK * k));
            prefetch_pair::<PREFETCH_L1>(ga, gb, k, t.blocks, GROUP_BLOCK);
            let xb = |n: usize| t.x.add(n * t.x_stride + ACT_BLOCK * k);
            // 4 times each sub-block's activation sum (the i16 sums of 16), per token.
            let mut offsets = [[0i32; 16]; NX];
            for (n, o) in offsets.iter_mut().enumerate() {
                let bs = _mm256_loadu_si256(xb(n).add(260) as *const __m256i);
                let s = _mm512_slli_epi32::<2>(_mm512_cvtepi16_epi32(bs));
                _mm512_storeu_si512(o.as_mut_ptr() as *mut _, s);
            }
            let mut isum = [_mm512_setzero_si512(); NX];
            let mut high = _mm512_setzero_si512();
            // j indexes the sub-blocks, their scales and every token's offsets.
            #[allow(clippy::needless_range_loop)]
            for j in 0..16 {
                let low = join(ga.add(LOW + 32 * j), gb.add(LOW + 32 * j));
                if j % 2 == 0 {
                    high = join(ga.add(HIGH + 32 * (j / 2)), gb.add(HIGH + 32 * (j / 2)));
                }
                let mut s = [_mm512_setzero_si512(); NX];
                for i in 0..4 {
                    let kk = 4 * j + i;
                    let u = _mm512_or_si512(low_bits(low, i), third_bit(high, kk % 8));
                    for n in 0..NX {
                        let x = (xb(n).add(4 + 4 * kk) as *const i32).read_unaligned();
                        s[n] = _mm512_dpbusd_epi32(s[n], u, _mm512_set1_epi32(x));
                    }
                }
                let sc = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(
                    _mm_loadl_epi64(ga.add(SCALES + 8 * j) as *const _),
                    _mm_loadl_epi64(gb.add(SCALES + 8 * j) as *const _),
                ));
                for n in 0..NX {
                    let sum = _mm512_sub_epi32(s[n], _mm512_set1_epi32(offsets[n][j]));
                    isum[n] = _mm512_add_epi32(isum[n], _mm512_mullo_epi32(sum, sc));
                }
            }
            fold_scaled(&mut acc, isum, (ga, gb), xb);
        }
        store_outputs(acc, t);
    }
}

/// [`super::wide_stored::q4_k_pair`] for two Q6_K groups, in the chain of `q6_k::tile_stored`'s VNNI body: per
/// sub-block `vpdpbusd` of the six-bit values (unpacked in registers) by the activations,
/// started at −32 times the sub-block's activation sum, times its scale; per super-block
/// `fma(isum·d, dy, acc)`.
///
/// # Safety
/// As [`super::wide_stored::q4_k_pair`], the groups of Q6_K.
pub(crate) unsafe fn q6_k_pair(a: &[u8], b: &[u8], t: &Tile) {
    pair_by_tokens!(q6_k_nx; q6_k::GROUP_BLOCK, a, b, t)
}

/// [`q6_k_pair`]'s work.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k_nx<const NX: usize>(a: *const u8, b: *const u8, t: &Tile) {
    use q6_k::GROUP_BLOCK;
    let mut acc = [_mm512_setzero_ps(); NX];
    // SAFETY (all reads below): super-block k < blocks of both groups (GROUP_BLOCK bytes
    // each, checked by the caller); token n < nx's Q8_K block k in its row.
    unsafe {
        for k in 0..t.blocks {
            let g = [a.add(GROUP_BLOCK * k), b.add(GROUP_BLOCK * k)];
            prefetch_pair::<PREFETCH_L1>(g[0], g[1], k, t.blocks, GROUP_BLOCK);
            let xs: [*const u8; NX] =
                std::array::from_fn(|n| t.x.add(n * t.x_stride + ACT_BLOCK * k));
            // −32 times each sub-block's activation sum (the i16 sums of 16), per token.
            let mut start = [[0i32; 16]; NX];
            for (x, st) in xs.iter().zip(start.iter_mut()) {
                let sums = _mm256_loadu_si256(x.add(260) as *const __m256i);
                let s32 = _mm512_slli_epi32::<5>(_mm512_cvtepi16_epi32(sums));
                let neg = _mm512_sub_epi32(_mm512_setzero_si512(), s32);
                _mm512_storeu_si512(st.as_mut_ptr() as *mut _, neg);
            }
            let mut isum = [_mm512_setzero_si512(); NX];
            for p in 0..4 {
                q6_k_place::<NX>(g, p, &xs, &start, &mut isum);
            }
            fold_scaled(&mut acc, isum, (g[0], g[1]), |n| xs[n]);
        }
        store_outputs(acc, t);
    }
}

/// The four sub-blocks `4p..4p + 4` of the pair's super-block `g` (place `p` of its 32-value
/// groups: sub-block `4p + 2·upper + half` holds the low (`upper` 0) or high nibbles of chunks
/// `4·half..4·half + 4`) against each token's Q8_K block `xs[n]`, added to `isum[n]` as
/// scale_j · (start + Σ q·x). Each chunk of nibbles and of high bits is read once for the
/// sub-blocks that share it, and unpacked as `q6_k`'s `chunk_fixed` does with AVX-512 VL,
/// sixteen rows at a time: the nibbles and the high bits (masked before their shift) merged in
/// one `vpternlogd`. The integer sums are exact, so their order does not change them.
#[inline(always)]
unsafe fn q6_k_place<const NX: usize>(
    g: [*const u8; 2],
    p: usize,
    xs: &[*const u8; NX],
    start: &[[i32; 16]; NX],
    isum: &mut [__m512i; NX],
) {
    use q6_k::{HIGH, NIBBLES, SCALES};
    let m4 = _mm512_set1_epi8(0x0F);
    let (low_mask, high_mask) = (_mm512_set1_epi8(0x33), _mm512_set1_epi8(0xCCu8 as i8));
    // SAFETY (all reads): the caller's super-blocks `g` and activation blocks `xs`.
    unsafe {
        // s[2·upper + half][n]: sub-block 4p + 2·upper + half, token n.
        let mut s: [[__m512i; NX]; 4] = std::array::from_fn(|k| {
            std::array::from_fn(|n| _mm512_set1_epi32(start[n][4 * p + k]))
        });
        for i in 0..4 {
            let at = HIGH + 128 * p + 32 * i;
            let h = join(g[0].add(at), g[1].add(at));
            let (hl, hh) = (
                _mm512_and_si512(h, low_mask),
                _mm512_and_si512(h, high_mask),
            );
            for half in 0..2 {
                let at = NIBBLES + 256 * p + 32 * (4 * half + i);
                let w = join(g[0].add(at), g[1].add(at));
                // The high bits' shift for each (upper, half), as `q6_k_sub_block` had them.
                let (bits_lo, bits_hi) = if half == 0 {
                    (_mm512_slli_epi16::<4>(hl), _mm512_slli_epi16::<2>(hh))
                } else {
                    (hl, _mm512_srli_epi16::<2>(hh))
                };
                // 0xE4: m4 ? nib : bits, bit by bit.
                let v_lo = _mm512_ternarylogic_epi32::<0xE4>(w, bits_lo, m4);
                let v_hi =
                    _mm512_ternarylogic_epi32::<0xE4>(_mm512_srli_epi16::<4>(w), bits_hi, m4);
                for (n, x) in xs.iter().enumerate() {
                    let xq = |j: usize| {
                        _mm512_set1_epi32(
                            (x.add(4 + 16 * j + 4 * i) as *const i32).read_unaligned(),
                        )
                    };
                    let (j_lo, j_hi) = (4 * p + half, 4 * p + 2 + half);
                    s[half][n] = _mm512_dpbusd_epi32(s[half][n], v_lo, xq(j_lo));
                    s[2 + half][n] = _mm512_dpbusd_epi32(s[2 + half][n], v_hi, xq(j_hi));
                }
            }
        }
        for (k, sk) in s.iter().enumerate() {
            let j = 4 * p + k;
            let sc = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(
                _mm_loadl_epi64(g[0].add(SCALES + 8 * j) as *const _),
                _mm_loadl_epi64(g[1].add(SCALES + 8 * j) as *const _),
            ));
            for (i, s) in isum.iter_mut().zip(sk) {
                *i = _mm512_add_epi32(*i, _mm512_mullo_epi32(*s, sc));
            }
        }
    }
}

/// [`super::wide_stored::q4_k_pair`] for two IQ4_XS groups, in the chain of `iq4_xs::tile_avx2`'s VNNI body: the
/// nibbles looked up plus 128 (`vpshufb`), per sub-block `vpdpbusd` by the activations, less
/// 128 times the sub-block's activation sum, times its scale; per super-block
/// `fma(isum·d, dy, acc)`.
///
/// # Safety
/// As [`super::wide_stored::q4_k_pair`], the groups of IQ4_XS.
pub(crate) unsafe fn iq4_xs_pair(a: &[u8], b: &[u8], t: &Tile) {
    pair_by_tokens!(iq4_xs_nx; iq4_xs::GROUP_BLOCK, a, b, t)
}

/// [`iq4_xs_pair`]'s work.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn iq4_xs_nx<const NX: usize>(a: *const u8, b: *const u8, t: &Tile) {
    use iq4_xs::{GROUP_BLOCK, NIBBLES, SCALES};
    let mut acc = [_mm512_setzero_ps(); NX];
    let m4 = _mm512_set1_epi8(0x0F);
    // SAFETY (all reads below): super-block k < blocks of both groups (GROUP_BLOCK bytes
    // each, checked by the caller); token n < nx's Q8_K block k in its row.
    unsafe {
        let table = table_plus_128(&KVALUES_IQ4NL);
        for k in 0..t.blocks {
            let (ga, gb) = (a.add(GROUP_BLOCK * k), b.add(GROUP_BLOCK * k));
            prefetch_pair::<PREFETCH_L1>(ga, gb, k, t.blocks, GROUP_BLOCK);
            let xb = |n: usize| t.x.add(n * t.x_stride + ACT_BLOCK * k);
            // 128 times each sub-block's activation sum, per token.
            let mut offsets = [[0i32; 8]; NX];
            for (n, o) in offsets.iter_mut().enumerate() {
                let q8s = _mm256_slli_epi32::<7>(_mm256_cvtepi16_epi32(sub_block_sums(xb(n))));
                _mm256_storeu_si256(o.as_mut_ptr() as *mut _, q8s);
            }
            let mut isum = [_mm512_setzero_si512(); NX];
            // p indexes the pairs of sub-blocks in the weights and in the offsets.
            #[allow(clippy::needless_range_loop)]
            for p in 0..4 {
                let (mut s_lo, mut s_hi) =
                    ([_mm512_setzero_si512(); NX], [_mm512_setzero_si512(); NX]);
                for c in 0..8 {
                    let at = NIBBLES + 256 * p + 32 * c;
                    let w = join(ga.add(at), gb.add(at));
                    let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(w, m4));
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
                    let hi = _mm512_shuffle_epi8(table, hi);
                    dot_chunk((&mut s_lo, &mut s_hi), (lo, hi), xb, (p, c));
                }
                let scale = |j: usize| {
                    _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(
                        _mm_loadl_epi64(ga.add(SCALES + 8 * j) as *const _),
                        _mm_loadl_epi64(gb.add(SCALES + 8 * j) as *const _),
                    ))
                };
                let (sc_lo, sc_hi) = (scale(2 * p), scale(2 * p + 1));
                for n in 0..NX {
                    let lo = _mm512_sub_epi32(s_lo[n], _mm512_set1_epi32(offsets[n][2 * p]));
                    let hi = _mm512_sub_epi32(s_hi[n], _mm512_set1_epi32(offsets[n][2 * p + 1]));
                    let both = _mm512_add_epi32(
                        _mm512_mullo_epi32(lo, sc_lo),
                        _mm512_mullo_epi32(hi, sc_hi),
                    );
                    isum[n] = _mm512_add_epi32(isum[n], both);
                }
            }
            fold_scaled(&mut acc, isum, (ga, gb), xb);
        }
        store_outputs(acc, t);
    }
}

/// The end of a super-block of the types without mins, per token: `acc = fma(isum·d, dy,
/// acc)`, `d` the rows' scales of the pair `g` (f16, at the start of each group-block), `dy`
/// the token's (`xb(n)`: its Q8_K block).
#[inline(always)]
unsafe fn fold_scaled<const NX: usize>(
    acc: &mut [__m512; NX],
    isum: [__m512i; NX],
    (ga, gb): (*const u8, *const u8),
    xb: impl Fn(usize) -> *const u8,
) {
    // SAFETY: the caller's group-blocks and activation blocks.
    unsafe {
        let d = _mm512_cvtph_ps(join16(ga, gb));
        for n in 0..NX {
            let dy = _mm512_set1_ps((xb(n) as *const f32).read_unaligned());
            let r = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[n]), d);
            acc[n] = _mm512_fmadd_ps(r, dy, acc[n]);
        }
    }
}
