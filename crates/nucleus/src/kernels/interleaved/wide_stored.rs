//! Decode's Q4_K, Q5_K, Q3_K and Q6_K products with AVX-512 VNNI: two groups read as stored
//! (the layouts of [`super::q4_k`], [`super::q5_k`], [`super::q3_k`] and [`super::q6_k`]) side
//! by side in the lanes of 512-bit registers, rows `0..8` from the first and `8..16` from the
//! second, so that one `vpdpbusd` serves sixteen rows where `q4_k::tile_avx2`,
//! `q5_k::tile_avx2`, `q3_k::tile_avx2` and `q6_k::tile_stored` serve eight. Each lane follows that
//! kernel's chain for its row, operation for operation (the same integer sums, the same float
//! steps in the same order): a row's outputs have the same bits here, there and in the scalar
//! kernels (`tests.rs`, `tests_tiled.rs`).

use std::arch::x86_64::*;

use super::q4_k::{sub_block_sums, ACT_BLOCK, GROUP_BLOCK, MINS, NIBBLES, SCALES};
use super::wide::join;
use super::x86::prefetch_block;
use super::{q3_k, q5_k, q6_k};
use super::{Tile, TILE_TOKENS};

/// Where a stored super-block's dmin (f16, after the rows' d) starts.
const DMIN: usize = 16;

/// Groups `a` and `b` (stored, `t.blocks` super-blocks each) against `t.nx` tokens, sixteen
/// outputs per token at `t.out` (the first group's eight, then the second's), in the chain of
/// `q4_k::tile_avx2` (`pairs`: of `tile_avx2_pairs`).
///
/// # Safety
/// The tile's pointers are valid for what [`Tile`] says, with sixteen outputs per token; the
/// CPU has AVX-512 F/BW/VL/VNNI, FMA and F16C.
pub(crate) unsafe fn q4_k_pair(a: &[u8], b: &[u8], t: &Tile, pairs: bool) {
    let bytes = t.blocks * GROUP_BLOCK;
    assert!(a.len() >= bytes && b.len() >= bytes && (1..=TILE_TOKENS).contains(&t.nx));
    let (a, b) = (a.as_ptr(), b.as_ptr());
    // SAFETY: the caller's contract; the groups' bytes checked above.
    unsafe {
        match (t.nx, pairs) {
            (1, true) => pair_nx::<1, true>(a, b, t),
            (2, true) => pair_nx::<2, true>(a, b, t),
            (3, true) => pair_nx::<3, true>(a, b, t),
            (_, true) => pair_nx::<4, true>(a, b, t),
            (1, false) => pair_nx::<1, false>(a, b, t),
            (2, false) => pair_nx::<2, false>(a, b, t),
            (3, false) => pair_nx::<3, false>(a, b, t),
            (_, false) => pair_nx::<4, false>(a, b, t),
        }
    }
}

/// Asks for the lines a pair of groups reads a few super-blocks after block `k` (`ga`, `gb`:
/// the groups' block `k`). Decode reads pairs of adjacent groups (`b` right after `a`), and
/// the next pair right after them: each group's own lookahead covers its lines, running past
/// `b`'s end into the next pair's `a`; near the end the next pair's `b` is asked for too, which
/// no lookahead reached, so that each pair started with a miss there (`DECODE_SHAPE=8960,1536
/// decode_stream 2 Q4_K`, rows of six super-blocks, 2026-12-06, the Xeon with AMX, two rounds:
/// 80–82 % of the read without it, 89–90 % with it). Prefetches past the weights' end are
/// hints that read nothing.
#[inline(always)]
fn prefetch_pair(ga: *const u8, gb: *const u8, k: usize, blocks: usize, group_block: usize) {
    prefetch_block(ga, group_block);
    prefetch_block(gb, group_block);
    if k + 3 >= blocks {
        // The next pair's `b` starts `2·blocks` group-blocks after `b`'s start: this is its
        // block `k − blocks`, whose lookahead is its first blocks.
        prefetch_block(gb.wrapping_add(group_block * blocks), group_block);
    }
}

/// The 16-byte pieces at `a` and `b` side by side.
#[inline(always)]
unsafe fn join16(a: *const u8, b: *const u8) -> __m256i {
    // SAFETY: the caller's 16 bytes at each.
    unsafe {
        _mm256_set_m128i(
            _mm_loadu_si128(b as *const _),
            _mm_loadu_si128(a as *const _),
        )
    }
}

/// [`q4_k_pair`]'s work; `PAIRS`: one FMA per pair of sub-blocks, else one per super-block.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair_nx<const NX: usize, const PAIRS: bool>(a: *const u8, b: *const u8, t: &Tile) {
    let mut acc = [_mm512_setzero_ps(); NX];
    let mut acc_min = [_mm512_setzero_ps(); NX];
    let m4 = _mm512_set1_epi8(0x0F);
    // SAFETY (all reads below): super-block k < blocks of both groups (GROUP_BLOCK bytes
    // each, checked by the caller); token n < nx's Q8_K block k in its row.
    unsafe {
        for k in 0..t.blocks {
            let (ga, gb) = (a.add(GROUP_BLOCK * k), b.add(GROUP_BLOCK * k));
            prefetch_pair(ga, gb, k, t.blocks, GROUP_BLOCK);
            let xb = |n: usize| t.x.add(n * t.x_stride + ACT_BLOCK * k);
            let d = _mm512_cvtph_ps(join16(ga, gb));
            let dmin = _mm512_cvtph_ps(join16(ga.add(DMIN), gb.add(DMIN)));
            let dy = |n: usize| _mm512_set1_ps((xb(n) as *const f32).read_unaligned());
            let d_dy: [__m512; NX] = std::array::from_fn(|n| _mm512_mul_ps(d, dy(n)));
            let dmin_dy: [__m512; NX] = std::array::from_fn(|n| _mm512_mul_ps(dmin, dy(n)));
            let mut isum = [_mm512_setzero_si512(); NX];
            for p in 0..4 {
                let (mut s_lo, mut s_hi) =
                    ([_mm512_setzero_si512(); NX], [_mm512_setzero_si512(); NX]);
                for c in 0..8 {
                    let at = NIBBLES + 256 * p + 32 * c;
                    let w = join(ga.add(at), gb.add(at));
                    // The high nibbles left in place (16 times their value), the sum divided
                    // by 16 after the chunks, exactly, as tile_avx2's VNNI body does.
                    let (lo, hi) = (_mm512_and_si512(w, m4), _mm512_andnot_si512(m4, w));
                    for n in 0..NX {
                        let x = xb(n).add(4 + 64 * p + 4 * c);
                        let bx =
                            |x: *const u8| _mm512_set1_epi32((x as *const i32).read_unaligned());
                        s_lo[n] = _mm512_dpbusd_epi32(s_lo[n], lo, bx(x));
                        s_hi[n] = _mm512_dpbusd_epi32(s_hi[n], hi, bx(x.add(32)));
                    }
                }
                let (sc_lo, sc_hi) = (scales_u8(ga, gb, 2 * p), scales_u8(ga, gb, 2 * p + 1));
                for n in 0..NX {
                    let s = _mm512_add_epi32(
                        _mm512_mullo_epi32(s_lo[n], sc_lo),
                        _mm512_mullo_epi32(_mm512_srai_epi32::<4>(s_hi[n]), sc_hi),
                    );
                    if PAIRS {
                        acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d_dy[n], acc[n]);
                    } else {
                        isum[n] = _mm512_add_epi32(isum[n], s);
                    }
                }
            }
            for n in 0..NX {
                if PAIRS {
                    // One FMA per pair of sub-blocks: each pair's min sum apart.
                    for p in 0..4 {
                        let m = pair_min_sum(ga, gb, xb(n), p);
                        acc_min[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dmin_dy[n], acc_min[n]);
                    }
                } else {
                    let imin = min_sums(ga, gb, xb(n));
                    acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[n]), d_dy[n], acc[n]);
                    acc_min[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), dmin_dy[n], acc_min[n]);
                }
            }
        }
        for n in 0..NX {
            _mm512_storeu_ps(
                t.out.add(n * t.out_stride),
                _mm512_sub_ps(acc[n], acc_min[n]),
            );
        }
    }
}

/// [`q4_k_pair`] for two Q5_K groups, in the chain of `q5_k::tile_avx2`'s VNNI body: per
/// sub-block `vpdpbusd` of the five-bit values (the nibble and the fifth bit joined in
/// registers) by the activations, times its scale; per super-block
/// `r = fma(−dmin, imin, isum·d)`, `acc = fma(r, dy, acc)`.
///
/// # Safety
/// As [`q4_k_pair`], the groups of Q5_K.
pub(crate) unsafe fn q5_k_pair(a: &[u8], b: &[u8], t: &Tile) {
    let bytes = t.blocks * q5_k::GROUP_BLOCK;
    assert!(a.len() >= bytes && b.len() >= bytes && (1..=TILE_TOKENS).contains(&t.nx));
    let (a, b) = (a.as_ptr(), b.as_ptr());
    // SAFETY: the caller's contract; the groups' bytes checked above.
    unsafe {
        match t.nx {
            1 => q5_k_nx::<1>(a, b, t),
            2 => q5_k_nx::<2>(a, b, t),
            3 => q5_k_nx::<3>(a, b, t),
            _ => q5_k_nx::<4>(a, b, t),
        }
    }
}

/// The fifth bits of chunk `c` from a plane `h` of them (bit `c` of each byte), moved to bit
/// 4 (0x10) of each byte, as `q5_k::x86::fifth_bits`: a 16-bit shift left by at most 4 or
/// right by at most 3 moves no other byte's bit to bit 4.
#[inline(always)]
unsafe fn fifth_bit(h: __m512i, c: usize) -> __m512i {
    let m = _mm512_set1_epi8(0x10);
    match c {
        0 => _mm512_and_si512(_mm512_slli_epi16::<4>(h), m),
        1 => _mm512_and_si512(_mm512_slli_epi16::<3>(h), m),
        2 => _mm512_and_si512(_mm512_slli_epi16::<2>(h), m),
        3 => _mm512_and_si512(_mm512_slli_epi16::<1>(h), m),
        4 => _mm512_and_si512(h, m),
        5 => _mm512_and_si512(_mm512_srli_epi16::<1>(h), m),
        6 => _mm512_and_si512(_mm512_srli_epi16::<2>(h), m),
        _ => _mm512_and_si512(_mm512_srli_epi16::<3>(h), m),
    }
}

/// [`q5_k_pair`]'s work.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q5_k_nx<const NX: usize>(a: *const u8, b: *const u8, t: &Tile) {
    use q5_k::{GROUP_BLOCK, HIGH};
    let mut acc = [_mm512_setzero_ps(); NX];
    let m4 = _mm512_set1_epi8(0x0F);
    // SAFETY (all reads below): super-block k < blocks of both groups (GROUP_BLOCK bytes
    // each, checked by the caller); token n < nx's Q8_K block k in its row.
    unsafe {
        for k in 0..t.blocks {
            let (ga, gb) = (a.add(GROUP_BLOCK * k), b.add(GROUP_BLOCK * k));
            prefetch_pair(ga, gb, k, t.blocks, GROUP_BLOCK);
            let xb = |n: usize| t.x.add(n * t.x_stride + ACT_BLOCK * k);
            let mut isum = [_mm512_setzero_si512(); NX];
            for p in 0..4 {
                let h_lo = join(ga.add(HIGH + 64 * p), gb.add(HIGH + 64 * p));
                let h_hi = join(ga.add(HIGH + 64 * p + 32), gb.add(HIGH + 64 * p + 32));
                let (mut s_lo, mut s_hi) =
                    ([_mm512_setzero_si512(); NX], [_mm512_setzero_si512(); NX]);
                for c in 0..8 {
                    let at = NIBBLES + 256 * p + 32 * c;
                    let w = join(ga.add(at), gb.add(at));
                    let lo = _mm512_or_si512(_mm512_and_si512(w, m4), fifth_bit(h_lo, c));
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
                    let hi = _mm512_or_si512(hi, fifth_bit(h_hi, c));
                    for n in 0..NX {
                        let x = xb(n).add(4 + 64 * p + 4 * c);
                        let bx =
                            |x: *const u8| _mm512_set1_epi32((x as *const i32).read_unaligned());
                        s_lo[n] = _mm512_dpbusd_epi32(s_lo[n], lo, bx(x));
                        s_hi[n] = _mm512_dpbusd_epi32(s_hi[n], hi, bx(x.add(32)));
                    }
                }
                let (sc_lo, sc_hi) = (scales_u8(ga, gb, 2 * p), scales_u8(ga, gb, 2 * p + 1));
                for n in 0..NX {
                    let s = _mm512_add_epi32(
                        _mm512_mullo_epi32(s_lo[n], sc_lo),
                        _mm512_mullo_epi32(s_hi[n], sc_hi),
                    );
                    isum[n] = _mm512_add_epi32(isum[n], s);
                }
            }
            let d = _mm512_cvtph_ps(join16(ga, gb));
            let dmin = _mm512_cvtph_ps(join16(ga.add(DMIN), gb.add(DMIN)));
            for n in 0..NX {
                let imin = min_sums(ga, gb, xb(n));
                let dy = _mm512_set1_ps((xb(n) as *const f32).read_unaligned());
                let r = _mm512_fnmadd_ps(
                    dmin,
                    _mm512_cvtepi32_ps(imin),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(isum[n]), d),
                );
                acc[n] = _mm512_fmadd_ps(r, dy, acc[n]);
            }
        }
        for (n, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(t.out.add(n * t.out_stride), *acc);
        }
    }
}

/// Row r's (unsigned) scale of sub-block `j` in 32-bit lane r: the first group's rows, then
/// the second's (Q4_K's and Q5_K's header).
#[inline(always)]
unsafe fn scales_u8(ga: *const u8, gb: *const u8, j: usize) -> __m512i {
    // SAFETY: the caller's group-blocks, whose headers hold the scale bytes.
    unsafe {
        let (sa, sb) = (ga.add(SCALES + 8 * j), gb.add(SCALES + 8 * j));
        let s = _mm_unpacklo_epi64(
            _mm_loadl_epi64(sa as *const _),
            _mm_loadl_epi64(sb as *const _),
        );
        _mm512_cvtepu8_epi32(s)
    }
}

/// Row r's `min_2p·bsum_2p + min_2p+1·bsum_2p+1` in 32-bit lane r (Q4_K's and Q5_K's
/// header), against the Q8_K block at `xb`.
#[inline(always)]
unsafe fn pair_min_sum(ga: *const u8, gb: *const u8, xb: *const u8, p: usize) -> __m512i {
    // SAFETY: the caller's group-blocks and activation block.
    unsafe {
        let q8s = _mm512_castsi128_si512(sub_block_sums(xb));
        let pair = _mm512_permutexvar_epi32(_mm512_set1_epi32(p as i32), q8s);
        let mins = _mm512_cvtepu8_epi16(join16(ga.add(MINS + 16 * p), gb.add(MINS + 16 * p)));
        _mm512_madd_epi16(mins, pair)
    }
}

/// Row r's `Σ_j min_j·bsum_j` in 32-bit lane r: [`pair_min_sum`] over the four pairs.
#[inline(always)]
unsafe fn min_sums(ga: *const u8, gb: *const u8, xb: *const u8) -> __m512i {
    // SAFETY: forwarded.
    unsafe {
        let mut imin = _mm512_setzero_si512();
        for p in 0..4 {
            imin = _mm512_add_epi32(imin, pair_min_sum(ga, gb, xb, p));
        }
        imin
    }
}

/// [`q4_k_pair`] for two Q3_K groups, in the chain of `q3_k::tile_avx2`'s VNNI body: per
/// sub-block `vpdpbusd` of the unsigned values by the activations, less 4 times the sub-block's
/// activation sum, times its scale; per super-block `fma(isum·d, dy, acc)`.
///
/// # Safety
/// As [`q4_k_pair`], the groups of Q3_K.
pub(crate) unsafe fn q3_k_pair(a: &[u8], b: &[u8], t: &Tile) {
    let bytes = t.blocks * q3_k::GROUP_BLOCK;
    assert!(a.len() >= bytes && b.len() >= bytes && (1..=TILE_TOKENS).contains(&t.nx));
    let (a, b) = (a.as_ptr(), b.as_ptr());
    // SAFETY: the caller's contract; the groups' bytes checked above.
    unsafe {
        match t.nx {
            1 => q3_k_nx::<1>(a, b, t),
            2 => q3_k_nx::<2>(a, b, t),
            3 => q3_k_nx::<3>(a, b, t),
            _ => q3_k_nx::<4>(a, b, t),
        }
    }
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
            prefetch_pair(ga, gb, k, t.blocks, GROUP_BLOCK);
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
            let d = _mm512_cvtph_ps(join16(ga, gb));
            for n in 0..NX {
                let dy = _mm512_set1_ps((xb(n) as *const f32).read_unaligned());
                let r = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[n]), d);
                acc[n] = _mm512_fmadd_ps(r, dy, acc[n]);
            }
        }
        for (n, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(t.out.add(n * t.out_stride), *acc);
        }
    }
}

/// [`q4_k_pair`] for two Q6_K groups, in the chain of `q6_k::tile_stored`'s VNNI body: per
/// sub-block `vpdpbusd` of the six-bit values (unpacked in registers) by the activations,
/// started at −32 times the sub-block's activation sum, times its scale; per super-block
/// `fma(isum·d, dy, acc)`.
///
/// # Safety
/// As [`q4_k_pair`], the groups of Q6_K.
pub(crate) unsafe fn q6_k_pair(a: &[u8], b: &[u8], t: &Tile) {
    let bytes = t.blocks * q6_k::GROUP_BLOCK;
    assert!(a.len() >= bytes && b.len() >= bytes && (1..=TILE_TOKENS).contains(&t.nx));
    let (a, b) = (a.as_ptr(), b.as_ptr());
    // SAFETY: the caller's contract; the groups' bytes checked above.
    unsafe {
        match t.nx {
            1 => q6_k_nx::<1>(a, b, t),
            2 => q6_k_nx::<2>(a, b, t),
            3 => q6_k_nx::<3>(a, b, t),
            _ => q6_k_nx::<4>(a, b, t),
        }
    }
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
            prefetch_pair(g[0], g[1], k, t.blocks, GROUP_BLOCK);
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
            // The four places of a pair written out: their shifts are constants.
            for p in 0..4 {
                q6_k_sub_block::<NX, false, false>(g, p, &xs, &start, &mut isum);
                q6_k_sub_block::<NX, false, true>(g, p, &xs, &start, &mut isum);
                q6_k_sub_block::<NX, true, false>(g, p, &xs, &start, &mut isum);
                q6_k_sub_block::<NX, true, true>(g, p, &xs, &start, &mut isum);
            }
            let d = _mm512_cvtph_ps(join16(g[0], g[1]));
            for n in 0..NX {
                let dy = _mm512_set1_ps((xs[n] as *const f32).read_unaligned());
                let wd = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[n]), d);
                acc[n] = _mm512_fmadd_ps(wd, dy, acc[n]);
            }
        }
        for (n, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(t.out.add(n * t.out_stride), *acc);
        }
    }
}

/// Sub-block `j = 4p + 2·UPPER + HALF` of the pair's super-block `g` (its place in pair `p`
/// of 32-value groups: `UPPER`, the high nibbles; `HALF`, the second half of the chunks)
/// against each token's Q8_K block `xs[n]`, added to `isum[n]` as scale_j · (start + Σ q·x).
/// Its four chunks are unpacked as `q6_k`'s `chunk_fixed` does with AVX-512 VL, sixteen rows
/// at a time: the nibbles and the high bits (masked before their shift) merged in one
/// `vpternlogd`.
#[inline(always)]
unsafe fn q6_k_sub_block<const NX: usize, const UPPER: bool, const HALF: bool>(
    g: [*const u8; 2],
    p: usize,
    xs: &[*const u8; NX],
    start: &[[i32; 16]; NX],
    isum: &mut [__m512i; NX],
) {
    use q6_k::{HIGH, NIBBLES, SCALES};
    let j = 4 * p + 2 * UPPER as usize + HALF as usize;
    let m4 = _mm512_set1_epi8(0x0F);
    let high_mask = _mm512_set1_epi8(if UPPER { 0xCCu8 } else { 0x33 } as i8);
    // SAFETY (all reads): the caller's super-blocks `g` and activation blocks `xs`.
    unsafe {
        let mut s: [__m512i; NX] = std::array::from_fn(|n| _mm512_set1_epi32(start[n][j]));
        for i in 0..4 {
            let c = 4 * HALF as usize + i;
            let at = NIBBLES + 256 * p + 32 * c;
            let w = join(g[0].add(at), g[1].add(at));
            let at = HIGH + 128 * p + 32 * (c % 4);
            let hm = _mm512_and_si512(join(g[0].add(at), g[1].add(at)), high_mask);
            let (nib, bits) = match (UPPER, HALF) {
                (false, false) => (w, _mm512_slli_epi16::<4>(hm)),
                (false, true) => (w, hm),
                (true, false) => (_mm512_srli_epi16::<4>(w), _mm512_slli_epi16::<2>(hm)),
                (true, true) => (_mm512_srli_epi16::<4>(w), _mm512_srli_epi16::<2>(hm)),
            };
            // 0xE4: m4 ? nib : bits, bit by bit.
            let v = _mm512_ternarylogic_epi32::<0xE4>(nib, bits, m4);
            for (x, s) in xs.iter().zip(s.iter_mut()) {
                let x = (x.add(4 + 16 * j + 4 * i) as *const i32).read_unaligned();
                *s = _mm512_dpbusd_epi32(*s, v, _mm512_set1_epi32(x));
            }
        }
        let sc = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(
            _mm_loadl_epi64(g[0].add(SCALES + 8 * j) as *const _),
            _mm_loadl_epi64(g[1].add(SCALES + 8 * j) as *const _),
        ));
        for (i, s) in isum.iter_mut().zip(s) {
            *i = _mm512_add_epi32(*i, _mm512_mullo_epi32(s, sc));
        }
    }
}
