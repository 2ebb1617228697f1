//! Decode's Q4_K and Q5_K products with AVX-512 VNNI: two groups read as stored (the layouts of
//! [`super::q4_k`] and [`super::q5_k`]) side by side in the lanes of 512-bit registers, rows
//! `0..8` from the first and `8..16` from the second, so that one `vpdpbusd` serves sixteen
//! rows where `q4_k::tile_avx2` and `q5_k::tile_avx2` serve eight (the types without mins:
//! [`super::wide_stored_scaled`]). Each lane follows that kernel's chain for its row, operation
//! for operation (the same integer sums, the same float steps in the same order): a row's
//! outputs have the same bits here, there and in the scalar kernels (`tests.rs`,
//! `tests_tiled.rs`).

use std::arch::x86_64::*;

use super::q4_k::{sub_block_sums, ACT_BLOCK, GROUP_BLOCK, MINS, NIBBLES, SCALES};
use super::q5_k;
use super::wide::join;
use super::{Tile, PREFETCH_L1, TILE_TOKENS};

/// Checks that groups `$a` and `$b` hold `$t.blocks` group-blocks of `$block` bytes each and
/// that the tile has one to four tokens, then runs `$body::<NX, $generic...>` on their bytes
/// for the tile's token count: the entry of every pair kernel.
macro_rules! pair_by_tokens {
    ($body:ident $(, $generic:tt)*; $block:expr, $a:expr, $b:expr, $t:expr) => {{
        let (a, b, t): (&[u8], &[u8], &Tile) = ($a, $b, $t);
        let bytes = t.blocks * $block;
        assert!(a.len() >= bytes && b.len() >= bytes && (1..=TILE_TOKENS).contains(&t.nx));
        let (a, b) = (a.as_ptr(), b.as_ptr());
        // SAFETY: the caller's contract; the groups' bytes checked above.
        unsafe {
            match t.nx {
                1 => $body::<1 $(, $generic)*>(a, b, t),
                2 => $body::<2 $(, $generic)*>(a, b, t),
                3 => $body::<3 $(, $generic)*>(a, b, t),
                _ => $body::<4 $(, $generic)*>(a, b, t),
            }
        }
    }};
}
pub(super) use pair_by_tokens;

/// Chunk `c` of sub-block pair `p` (its low values `lo` and high values `hi`, sixteen rows)
/// against each token's activations: `vpdpbusd` into `s_lo[n]` and `s_hi[n]` (`xb(n)`: token
/// n's Q8_K block).
#[inline(always)]
pub(super) unsafe fn dot_chunk<const NX: usize>(
    (s_lo, s_hi): (&mut [__m512i; NX], &mut [__m512i; NX]),
    (lo, hi): (__m512i, __m512i),
    xb: impl Fn(usize) -> *const u8,
    (p, c): (usize, usize),
) {
    // SAFETY: the caller's activation blocks (values 64p + 4c.. and 64p + 32 + 4c..).
    unsafe {
        for n in 0..NX {
            let x = xb(n).add(4 + 64 * p + 4 * c);
            let bx = |x: *const u8| _mm512_set1_epi32((x as *const i32).read_unaligned());
            s_lo[n] = _mm512_dpbusd_epi32(s_lo[n], lo, bx(x));
            s_hi[n] = _mm512_dpbusd_epi32(s_hi[n], hi, bx(x.add(32)));
        }
    }
}

/// Each token's sixteen outputs (`acc[n]`) to the tile's output row.
#[inline(always)]
pub(super) unsafe fn store_outputs<const NX: usize>(acc: [__m512; NX], t: &Tile) {
    for (n, acc) in acc.iter().enumerate() {
        // SAFETY: the tile's sixteen outputs of token n (the caller's contract).
        unsafe { _mm512_storeu_ps(t.out.add(n * t.out_stride), *acc) };
    }
}
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
    if pairs {
        pair_by_tokens!(pair_nx, true; GROUP_BLOCK, a, b, t)
    } else {
        pair_by_tokens!(pair_nx, false; GROUP_BLOCK, a, b, t)
    }
}

/// Asks for the lines a pair of groups reads a few blocks after block `k` (`ga`, `gb`: the
/// groups' block `k`), into L1 from `L1` bytes ahead (the super-block types
/// [`super::PREFETCH_L1`], the 32-value block types `x86::PREFETCH`, as each was measured)
/// and into L2 from [`super::PREFETCH_L2`]. Decode reads pairs of adjacent groups (`b` right after `a`), and
/// the next pair right after them: `b`'s lookahead runs past its end into the next pair's `a`;
/// `a`'s would run into `b`, being read, and goes to the next pair's `b` instead, which no
/// lookahead reached otherwise (each pair then started with a miss there: `DECODE_SHAPE=8960,1536
/// decode_stream 2 Q4_K`, rows of six super-blocks, 2026-12-06, the Xeon with AMX, two rounds:
/// 80–82 % of the read without it, 89–90 % with it). Prefetches past the weights' end are
/// hints that read nothing.
#[inline(always)]
pub(super) fn prefetch_pair<const L1: usize>(
    ga: *const u8,
    gb: *const u8,
    k: usize,
    blocks: usize,
    group_block: usize,
) {
    let group = group_block * blocks;
    let a_at = |ahead: usize| {
        let past = k * group_block + ahead >= group;
        ga.wrapping_add(ahead + if past { 2 * group } else { 0 })
    };
    let (a1, a2) = (a_at(L1), a_at(super::PREFETCH_L2));
    let (b1, b2) = (gb.wrapping_add(L1), gb.wrapping_add(super::PREFETCH_L2));
    for l in (0..group_block).step_by(64) {
        // SAFETY: SSE is part of x86-64; a prefetch dereferences nothing.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(a1.wrapping_add(l) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(a2.wrapping_add(l) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(b1.wrapping_add(l) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(b2.wrapping_add(l) as *const i8);
        }
    }
}

/// The 16-byte pieces at `a` and `b` side by side.
#[inline(always)]
pub(super) unsafe fn join16(a: *const u8, b: *const u8) -> __m256i {
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
            prefetch_pair::<PREFETCH_L1>(ga, gb, k, t.blocks, GROUP_BLOCK);
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
                    dot_chunk((&mut s_lo, &mut s_hi), (lo, hi), xb, (p, c));
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
        let out: [__m512; NX] = std::array::from_fn(|n| _mm512_sub_ps(acc[n], acc_min[n]));
        store_outputs(out, t);
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
    pair_by_tokens!(q5_k_nx; q5_k::GROUP_BLOCK, a, b, t)
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
            prefetch_pair::<PREFETCH_L1>(ga, gb, k, t.blocks, GROUP_BLOCK);
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
                    dot_chunk((&mut s_lo, &mut s_hi), (lo, hi), xb, (p, c));
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
        store_outputs(acc, t);
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
