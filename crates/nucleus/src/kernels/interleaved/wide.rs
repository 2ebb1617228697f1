//! A prompt's Q4_K, Q5_K and Q6_K products with AVX-512 VNNI: two groups, sixteen rows, in the
//! lanes of one 512-bit register, so that one `vpdpbusd` serves sixteen outputs where the
//! 256-bit kernels of [`super::q4_k`], [`super::q5_k`] and [`super::q6_k`] serve eight.
//!
//! A work item first unpacks each pair of its groups into the layout below (a pass over its
//! weights per product, against every token of the prompt), so that the kernel only loads
//! whole registers: the values a byte each, the nibbles and the high bits already joined.
//! The integer sums are the same integers as the narrow kernels' (exact in any order), and
//! each lane follows the narrow kernels' float chain for its row, operation for operation: a
//! row's outputs have the same bits here, there and in the scalar kernels, whatever the
//! number of tokens (`tests.rs`: the packed products against the one-row kernels and each
//! token alone).
//!
//! Layout of one pair of groups and one super-block ([`WIDE_BLOCK`] bytes), rows `0..8` from
//! the first group and `8..16` from the second:
//! - `0..64`: the rows' d as f32; `64..128`: their dmin (Q4_K, Q5_K);
//! - `128..384`: the scales, byte `128 + 16j + r` = scale of sub-block `j` of row `r` (Q6_K's
//!   sixteen, signed; Q4_K's and Q5_K's eight, unsigned six-bit);
//! - `384..512` (Q4_K, Q5_K): the mins in pairs, byte `384 + 32p + 2r + e` = min of sub-block
//!   `2p + e`;
//! - `512..4608`: the values, 64 bytes per four inputs: byte `4r + m` of `512 + 64c` is value
//!   `4c + m` of row `r` (a Q4_K nibble, a Q5_K value with its fifth bit, or a Q6_K value with
//!   its high bits, unsigned).

use std::arch::x86_64::*;

use super::{iq4_xs, q3_k, q4_k, q5_k, q6_k, Tile, GROUP_ROWS};
use crate::quant::GgmlType;

/// Rows of a pair of groups.
pub(crate) const WIDE_ROWS: usize = 2 * GROUP_ROWS;
const D: usize = 0;
const DMIN: usize = 64;
const SCALES: usize = 128;
const MINS: usize = 384;
const VALUES: usize = 512;
/// Bytes of one pair's super-block unpacked.
pub(crate) const WIDE_BLOCK: usize = VALUES + WIDE_ROWS * 256;
/// Bytes of a Q8_K activation block: f32 d, 256 values, 16 i16 sums of 16.
const ACT_BLOCK: usize = q4_k::ACT_BLOCK;
/// Most tokens per kernel call: each register of values serves this many.
pub(crate) const WIDE_TOKENS: usize = 8;

/// The header of a pair's unpacked super-block `w`: row `8h + r`'s d (and dmin) as f32 from
/// the f16 at `d[2r]` (`dmin[2r]`), its scales from byte `8j + r` of `scales`. The CPU has
/// AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
fn write_header(w: &mut [u8], h: usize, d: &[u8], dmin: Option<&[u8]>, scales: &[u8], subs: usize) {
    assert!(h < 2 && w.len() >= VALUES && scales.len() >= GROUP_ROWS * subs);
    // The eight rows' f16 at `src` to f32 at `at` (eight values, exact: every f16 is an f32).
    let widen = |w: &mut [u8], src: &[u8], at: usize| {
        let f: &[u8; 16] = src[..16].try_into().expect("eight f16");
        let out: &mut [u8; 32] = (&mut w[at..at + 32]).try_into().expect("eight f32");
        // SAFETY: 16 bytes at `f` and 32 at `out` (their types).
        unsafe {
            let wide = _mm256_cvtph_ps(_mm_loadu_si128(f as *const [u8; 16] as *const __m128i));
            _mm256_storeu_ps(out as *mut [u8; 32] as *mut f32, wide);
        }
    };
    let at = 4 * GROUP_ROWS * h;
    widen(w, d, D + at);
    if let Some(dmin) = dmin {
        widen(w, dmin, DMIN + at);
    }
    for j in 0..subs {
        let row0 = SCALES + 16 * j + GROUP_ROWS * h;
        w[row0..row0 + GROUP_ROWS].copy_from_slice(&scales[8 * j..8 * j + GROUP_ROWS]);
    }
}

/// The 32-byte pieces at `a` and `b` side by side.
#[inline(always)]
pub(super) unsafe fn join(a: *const u8, b: *const u8) -> __m512i {
    // SAFETY: the caller's 32 bytes at each.
    unsafe {
        let lo = _mm512_castsi256_si512(_mm256_loadu_si256(a as *const _));
        _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(b as *const _))
    }
}

/// `values` plus 128 in each 128-bit lane: a `vpshufb` table whose values come out unsigned,
/// as `vpdpbusd` takes them (each sum then starts from −128·Σx).
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
pub(super) unsafe fn table_plus_128(values: &[i8; 16]) -> __m512i {
    let plus: [u8; 16] = std::array::from_fn(|i| (values[i] as i16 + 128) as u8);
    // SAFETY: the 16 bytes of `plus`; AVX-512 F by the caller's contract.
    unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(plus.as_ptr() as *const __m128i)) }
}

/// Writes `dst` (`blocks` × [`WIDE_BLOCK`] bytes) from the stored groups `pair` of `ty`: Q4_K's
/// nibbles and Q5_K's values with their fifth bit as they are (with the scales and mins),
/// Q6_K's values whole (each group's joined in registers by `q6_k::for_each_chunk`), IQ4_XS's
/// looked up and stored plus 128 (each sub-block's scale written for its two halves of 16, the
/// layout of Q6_K's sixteen sub-blocks), Q3_K's unsigned (its two low bits and its third
/// joined). The CPU has AVX-512 F/BW and F16C.
pub(crate) fn unpack(ty: GgmlType, blocks: usize, pair: [&[u8]; 2], dst: &mut [u8]) {
    assert!(dst.len() >= blocks * WIDE_BLOCK);
    let group_block = super::pack::group_block_bytes(ty);
    assert!(pair.iter().all(|g| g.len() >= blocks * group_block));
    // SAFETY: the sizes are checked; the caller checked the CPU.
    unsafe {
        match ty {
            GgmlType::Q4_K => unpack_k4_avx512::<false>(blocks, pair, dst),
            GgmlType::Q5_K => unpack_k4_avx512::<true>(blocks, pair, dst),
            GgmlType::IQ4_XS => unpack_iq4_xs_avx512(blocks, pair, dst),
            GgmlType::Q3_K => unpack_q3_k_avx512(blocks, pair, dst),
            _ => unpack_q6_k_avx512(blocks, pair, dst),
        }
    }
}

/// `FIFTH`: Q5_K's groups (Q4_K's layout, then the fifth bits), else Q4_K's.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn unpack_k4_avx512<const FIFTH: bool>(blocks: usize, [a, b]: [&[u8]; 2], dst: &mut [u8]) {
    const NIBBLES: usize = 160;
    let m4 = _mm512_set1_epi8(0x0F);
    let m16 = _mm512_set1_epi8(0x10);
    let gbb = if FIFTH {
        q5_k::GROUP_BLOCK
    } else {
        q4_k::GROUP_BLOCK
    };
    for blk in 0..blocks {
        let (ga, gb) = (
            &a[gbb * blk..gbb * (blk + 1)],
            &b[gbb * blk..gbb * (blk + 1)],
        );
        let w = &mut dst[WIDE_BLOCK * blk..WIDE_BLOCK * (blk + 1)];
        for (h, g) in [ga, gb].into_iter().enumerate() {
            write_header(w, h, &g[..16], Some(&g[16..32]), &g[32..96], 8);
            for p in 0..4 {
                let mins = &g[96 + 16 * p..96 + 16 * (p + 1)];
                w[MINS + 32 * p + 16 * h..MINS + 32 * p + 16 * (h + 1)].copy_from_slice(mins);
            }
        }
        // Chunk c of pair p: values 64p + 4c.. (low nibbles, sub-block 2p) and 64p + 32 + 4c..
        // (high nibbles, sub-block 2p + 1).
        // SAFETY: offsets inside the two group-blocks and the unpacked block.
        unsafe {
            for p in 0..4 {
                // Q5_K: the fifth bits of the pair's low and high sub-block, bit c for chunk c.
                let fifth = |half: usize| {
                    let at = q5_k::HIGH + 64 * p + 32 * half;
                    join(ga.as_ptr().add(at), gb.as_ptr().add(at))
                };
                let (f_lo, f_hi) = if FIFTH {
                    (fifth(0), fifth(1))
                } else {
                    (_mm512_setzero_si512(), _mm512_setzero_si512())
                };
                for c in 0..8 {
                    let at = NIBBLES + 256 * p + 32 * c;
                    let v = join(ga.as_ptr().add(at), gb.as_ptr().add(at));
                    let lo = w.as_mut_ptr().add(VALUES + 64 * (16 * p + c));
                    let hi = w.as_mut_ptr().add(VALUES + 64 * (16 * p + 8 + c));
                    let mut low = _mm512_and_si512(v, m4);
                    let mut high = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                    if FIFTH {
                        // Bit c of each byte to bit 4: `vpsrlvw`/`vpsllvw` would need a
                        // count per lane; a 64-bit rotate by (c − 4) mod 64 moves no other
                        // byte's bit to bit 4 of any byte once masked (a byte's bit c lands
                        // at its own bit 4, the others' bits at other places).
                        let to4 = |f: __m512i| {
                            let f = _mm512_rolv_epi64(f, _mm512_set1_epi64((68 - c as i64) % 64));
                            _mm512_and_si512(f, m16)
                        };
                        low = _mm512_or_si512(low, to4(f_lo));
                        high = _mm512_or_si512(high, to4(f_hi));
                    }
                    _mm512_storeu_si512(lo as *mut _, low);
                    _mm512_storeu_si512(hi as *mut _, high);
                }
            }
        }
    }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn unpack_q6_k_avx512(blocks: usize, [a, b]: [&[u8]; 2], dst: &mut [u8]) {
    for blk in 0..blocks {
        let (ga, gb) = (
            &a[q6_k::GROUP_BLOCK * blk..q6_k::GROUP_BLOCK * (blk + 1)],
            &b[q6_k::GROUP_BLOCK * blk..q6_k::GROUP_BLOCK * (blk + 1)],
        );
        let w = &mut dst[WIDE_BLOCK * blk..WIDE_BLOCK * (blk + 1)];
        for (h, g) in [ga, gb].into_iter().enumerate() {
            write_header(w, h, &g[..16], None, &g[16..144], 16);
        }
        // SAFETY: offsets inside the two group-blocks and the unpacked block.
        unsafe {
            q6_k::for_each_chunk([ga.as_ptr(), gb.as_ptr()], |j, i, [lo, hi]| {
                let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                let at = w.as_mut_ptr().add(VALUES + 256 * j + 64 * i);
                _mm512_storeu_si512(at as *mut _, v);
            });
        }
    }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn unpack_iq4_xs_avx512(blocks: usize, [a, b]: [&[u8]; 2], dst: &mut [u8]) {
    let gbb = iq4_xs::GROUP_BLOCK;
    let m4 = _mm512_set1_epi8(0x0F);
    // SAFETY: AVX-512 F (this function's features).
    let table = unsafe { table_plus_128(&crate::quant::KVALUES_IQ4NL) };
    for blk in 0..blocks {
        let (ga, gb) = (
            &a[gbb * blk..gbb * (blk + 1)],
            &b[gbb * blk..gbb * (blk + 1)],
        );
        let w = &mut dst[WIDE_BLOCK * blk..WIDE_BLOCK * (blk + 1)];
        for (h, g) in [ga, gb].into_iter().enumerate() {
            // Sub-block j's scale for the halves 2j and 2j + 1.
            let scales: [u8; 128] =
                std::array::from_fn(|k| g[iq4_xs::SCALES + 8 * (k / 16) + k % 8]);
            write_header(w, h, &g[..16], None, &scales, 16);
        }
        // Chunk c of pair p: values 64p + 4c.. (low nibbles: half 4p + c / 4, chunk c % 4 of
        // it) and 64p + 32 + 4c.. (high nibbles: half 4p + 2 + c / 4).
        // SAFETY: offsets inside the two group-blocks and the unpacked block.
        unsafe {
            for p in 0..4 {
                for c in 0..8 {
                    let at = iq4_xs::NIBBLES + 256 * p + 32 * c;
                    let v = join(ga.as_ptr().add(at), gb.as_ptr().add(at));
                    let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, m4));
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                    let hi = _mm512_shuffle_epi8(table, hi);
                    let (j, i) = (4 * p + c / 4, c % 4);
                    let to = w.as_mut_ptr().add(VALUES + 64 * i);
                    _mm512_storeu_si512(to.add(256 * j) as *mut _, lo);
                    _mm512_storeu_si512(to.add(256 * (j + 2)) as *mut _, hi);
                }
            }
        }
    }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn unpack_q3_k_avx512(blocks: usize, [a, b]: [&[u8]; 2], dst: &mut [u8]) {
    let gbb = q3_k::GROUP_BLOCK;
    let (m3, m4) = (_mm512_set1_epi8(0x03), _mm512_set1_epi8(0x04));
    for blk in 0..blocks {
        let (ga, gb) = (
            &a[gbb * blk..gbb * (blk + 1)],
            &b[gbb * blk..gbb * (blk + 1)],
        );
        let w = &mut dst[WIDE_BLOCK * blk..WIDE_BLOCK * (blk + 1)];
        for (h, g) in [ga, gb].into_iter().enumerate() {
            write_header(w, h, &g[..16], None, &g[q3_k::SCALES..q3_k::LOW], 16);
        }
        // Chunk k = 4j + i (values 4k..4k + 4): bits 2i.. of low vector j, bit k % 8 of high
        // vector j / 2, which a 64-bit rotate by 2 − k % 8 brings to bit 2 (a byte's bit k % 8
        // lands at its own bit 2; masked, no other bit does).
        // SAFETY: offsets inside the two group-blocks and the unpacked block.
        unsafe {
            for j in 0..16 {
                let at = q3_k::LOW + 32 * j;
                let low = join(ga.as_ptr().add(at), gb.as_ptr().add(at));
                let at = q3_k::HIGH + 32 * (j / 2);
                let high = join(ga.as_ptr().add(at), gb.as_ptr().add(at));
                for i in 0..4 {
                    let lo = _mm512_and_si512(
                        _mm512_srlv_epi16(low, _mm512_set1_epi16(2 * i as i16)),
                        m3,
                    );
                    let c = (4 * (j % 2) + i) as i64;
                    let hi = _mm512_rolv_epi64(high, _mm512_set1_epi64((66 - c) % 64));
                    let v = _mm512_or_si512(lo, _mm512_and_si512(hi, m4));
                    let to = w.as_mut_ptr().add(VALUES + 256 * j + 64 * i);
                    _mm512_storeu_si512(to as *mut _, v);
                }
            }
        }
    }
}

/// `$body::<NX>(args..)` for `nx` tokens, 1 to [`WIDE_TOKENS`].
macro_rules! by_tokens {
    ($body:ident, $nx:expr, $($arg:expr),*) => {
        match $nx {
            1 => $body::<1>($($arg),*),
            2 => $body::<2>($($arg),*),
            3 => $body::<3>($($arg),*),
            4 => $body::<4>($($arg),*),
            5 => $body::<5>($($arg),*),
            6 => $body::<6>($($arg),*),
            7 => $body::<7>($($arg),*),
            _ => $body::<8>($($arg),*),
        }
    };
}

/// The sixteen rows of an unpacked Q4_K pair `w` against `t.nx` tokens (at most
/// [`WIDE_TOKENS`]), in the chain of `q4_k::tile_avx2` (`pairs`: of `tile_avx2_pairs`).
///
/// # Safety
/// `w` holds `t.blocks` unpacked super-blocks; the tile's pointers are valid for what
/// [`Tile`] says with sixteen outputs per token; the CPU has AVX-512 F/BW/VNNI, FMA and F16C.
pub(crate) unsafe fn q4_k(w: &[u8], t: &Tile, pairs: bool) {
    assert!(w.len() >= t.blocks * WIDE_BLOCK && (1..=WIDE_TOKENS).contains(&t.nx));
    assert!(
        !t.offsets.is_null(),
        "wide::q4_k: the activations' min_pairs"
    );
    let w = w.as_ptr();
    // SAFETY: the caller's contract.
    unsafe {
        if pairs {
            by_tokens!(q4_k_pairs, t.nx, w, t)
        } else {
            by_tokens!(q4_k_sums, t.nx, w, t)
        }
    }
}

/// The sixteen rows of an unpacked Q5_K pair `w` against `t.nx` tokens (at most
/// [`WIDE_TOKENS`]), in the chain of `q5_k::tile_avx2` (llama.cpp's tiled kernel's).
///
/// # Safety
/// As [`q4_k`].
pub(crate) unsafe fn q5_k(w: &[u8], t: &Tile) {
    assert!(w.len() >= t.blocks * WIDE_BLOCK && (1..=WIDE_TOKENS).contains(&t.nx));
    assert!(
        !t.offsets.is_null(),
        "wide::q5_k: the activations' min_pairs"
    );
    let w = w.as_ptr();
    // SAFETY: the caller's contract.
    unsafe { by_tokens!(q5_k_tiled, t.nx, w, t) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q4_k_sums<const NX: usize>(w: *const u8, t: &Tile) {
    // SAFETY: forwarded.
    unsafe { q4_k_nx::<NX, { Finish::Sums as u8 }>(w, t) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q4_k_pairs<const NX: usize>(w: *const u8, t: &Tile) {
    // SAFETY: forwarded.
    unsafe { q4_k_nx::<NX, { Finish::Pairs as u8 }>(w, t) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q5_k_tiled<const NX: usize>(w: *const u8, t: &Tile) {
    // SAFETY: forwarded.
    unsafe { q4_k_nx::<NX, { Finish::Tiled as u8 }>(w, t) }
}

/// The float chains of the Q4_K/Q5_K kernels, on the same integer sums.
#[derive(PartialEq, Eq)]
enum Finish {
    /// One FMA per super-block for the sums and one for the mins (llama.cpp's Q4_K gemv).
    Sums,
    /// One FMA per pair of sub-blocks for each (its Q4_K gemm).
    Pairs,
    /// `r = fma(−dmin, imin, isum·d)`, then one FMA with dy (its tiled Q4_K/Q5_K kernel).
    Tiled,
}

/// A token's four bytes at `p`, in every 32-bit lane.
#[inline(always)]
unsafe fn bcast(p: *const u8) -> __m512i {
    // SAFETY: the caller's activation bytes.
    _mm512_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

#[inline(always)]
unsafe fn q4_k_nx<const NX: usize, const FINISH: u8>(w: *const u8, t: &Tile) {
    const PAIRS: u8 = Finish::Pairs as u8;
    const TILED: u8 = Finish::Tiled as u8;
    let mut acc = [_mm512_setzero_ps(); NX];
    let mut acc_min = [_mm512_setzero_ps(); NX];
    // PAIRS: each pair of sub-blocks' scaled sum, folded into the floats after a super-block's
    // integer work, so that the loop over sub-blocks holds no float state in registers.
    let mut pair_sums = [[_mm512_setzero_si512(); 4]; NX];
    // SAFETY (all reads below): super-block b < blocks of the pair (WIDE_BLOCK bytes each);
    // token n < nx's Q8_K block b (ACT_BLOCK bytes) in its row and its four min pairs at
    // t.offsets (the Tile's contract); sixteen outputs per token.
    unsafe {
        for b in 0..t.blocks {
            let g = w.add(WIDE_BLOCK * b);
            let xb = |n: usize| t.x.add(n * t.x_stride + ACT_BLOCK * b);
            let dy = |n: usize| _mm512_set1_ps((xb(n) as *const f32).read_unaligned());
            let d = _mm512_loadu_ps(g.add(D) as *const f32);
            let dmin = _mm512_loadu_ps(g.add(DMIN) as *const f32);
            let mut isum = [_mm512_setzero_si512(); NX];
            // p indexes the pairs' sums, n the tokens' sums and activations.
            #[allow(clippy::needless_range_loop)]
            for p in 0..4 {
                for j in [2 * p, 2 * p + 1] {
                    let v: [__m512i; 8] = std::array::from_fn(|c| {
                        _mm512_loadu_si512(g.add(VALUES + 512 * j + 64 * c) as *const _)
                    });
                    let sc =
                        _mm512_cvtepu8_epi32(_mm_loadu_si128(g.add(SCALES + 16 * j) as *const _));
                    for n in 0..NX {
                        let x = xb(n).add(4 + 32 * j);
                        let mut s = _mm512_setzero_si512();
                        for (c, v) in v.iter().enumerate() {
                            s = _mm512_dpbusd_epi32(s, *v, bcast(x.add(4 * c)));
                        }
                        isum[n] = _mm512_add_epi32(isum[n], _mm512_mullo_epi32(s, sc));
                    }
                }
                if FINISH == PAIRS {
                    for n in 0..NX {
                        pair_sums[n][p] = isum[n];
                        isum[n] = _mm512_setzero_si512();
                    }
                }
            }
            for n in 0..NX {
                let d_dy = _mm512_mul_ps(d, dy(n));
                if FINISH == PAIRS {
                    for pair in pair_sums[n] {
                        acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pair), d_dy, acc[n]);
                    }
                }
                let dmin_dy = _mm512_mul_ps(dmin, dy(n));
                let pairs = t.offsets.add(4 * (n * t.blocks + b)) as *const u8;
                let mut imin = _mm512_setzero_si512();
                for p in 0..4 {
                    let mins = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                        g.add(MINS + 32 * p) as *const __m256i
                    ));
                    let m = _mm512_madd_epi16(mins, bcast(pairs.add(4 * p)));
                    if FINISH == PAIRS {
                        acc_min[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dmin_dy, acc_min[n]);
                    } else {
                        imin = _mm512_add_epi32(imin, m);
                    }
                }
                if FINISH == TILED {
                    // acc_min stays zero: the output is acc − 0, acc's bits.
                    let r = _mm512_fnmadd_ps(
                        dmin,
                        _mm512_cvtepi32_ps(imin),
                        _mm512_mul_ps(_mm512_cvtepi32_ps(isum[n]), d),
                    );
                    acc[n] = _mm512_fmadd_ps(r, dy(n), acc[n]);
                } else if FINISH != PAIRS {
                    acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[n]), d_dy, acc[n]);
                    acc_min[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), dmin_dy, acc_min[n]);
                }
            }
        }
        for n in 0..NX {
            let out = _mm512_sub_ps(acc[n], acc_min[n]);
            _mm512_storeu_ps(t.out.add(n * t.out_stride), out);
        }
    }
}

/// The sixteen rows of an unpacked Q6_K, IQ4_XS or Q3_K pair `w` (`ty`) against `t.nx` tokens
/// (at most [`WIDE_TOKENS`]), in the chain of their 256-bit kernels (`fma(isum·d, dy, acc)` per
/// super-block). The values are unsigned, their offset 32 (Q6_K), 128 (IQ4_XS, whose scales
/// are written for both halves of each sub-block of 32) or 4 (Q3_K): a sub-block's sum starts
/// from minus the offset times the activations' sum of 16, so that the offset leaves the
/// integer sum without a pass of its own.
///
/// # Safety
/// As [`q4_k`].
pub(crate) unsafe fn offset_values(w: &[u8], t: &Tile, ty: GgmlType) {
    assert!(w.len() >= t.blocks * WIDE_BLOCK && (1..=WIDE_TOKENS).contains(&t.nx));
    let w = w.as_ptr();
    // SAFETY: the caller's contract.
    unsafe {
        match ty {
            GgmlType::IQ4_XS => by_tokens!(iq4_xs_nx, t.nx, w, t),
            GgmlType::Q3_K => by_tokens!(q3_k_nx, t.nx, w, t),
            _ => by_tokens!(q6_k_nx, t.nx, w, t),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q6_k_nx<const NX: usize>(w: *const u8, t: &Tile) {
    // SAFETY: forwarded.
    unsafe { offset_nx::<NX, 5>(w, t) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn iq4_xs_nx<const NX: usize>(w: *const u8, t: &Tile) {
    // SAFETY: forwarded.
    unsafe { offset_nx::<NX, 7>(w, t) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q3_k_nx<const NX: usize>(w: *const u8, t: &Tile) {
    // SAFETY: forwarded.
    unsafe { offset_nx::<NX, 2>(w, t) }
}

/// Values stored unsigned, 2^SHIFT over their signed selves: each sub-block of 16 starts from
/// −2^SHIFT times its activations' sum; then one FMA per super-block, `fma(isum·d, dy, acc)`.
#[inline(always)]
unsafe fn offset_nx<const NX: usize, const SHIFT: u32>(w: *const u8, t: &Tile) {
    let mut acc = [_mm512_setzero_ps(); NX];
    // SAFETY (all reads below): as in `q4_k_nx`.
    unsafe {
        for b in 0..t.blocks {
            let g = w.add(WIDE_BLOCK * b);
            let xb = |n: usize| t.x.add(n * t.x_stride + ACT_BLOCK * b);
            // −2^SHIFT · the sums of 16 activations, as i32.
            let mut offsets = [[0i32; 16]; NX];
            for (n, o) in offsets.iter_mut().enumerate() {
                let bs = _mm256_loadu_si256(xb(n).add(260) as *const __m256i);
                let neg = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_slli_epi32::<SHIFT>(_mm512_cvtepi16_epi32(bs)),
                );
                _mm512_storeu_si512(o.as_mut_ptr() as *mut _, neg);
            }
            let mut isum = [_mm512_setzero_si512(); NX];
            // j indexes the values, the scales and every token's offsets.
            #[allow(clippy::needless_range_loop)]
            for j in 0..16 {
                let v: [__m512i; 4] = std::array::from_fn(|i| {
                    _mm512_loadu_si512(g.add(VALUES + 256 * j + 64 * i) as *const _)
                });
                let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(g.add(SCALES + 16 * j) as *const _));
                for n in 0..NX {
                    let x = xb(n).add(4 + 16 * j);
                    let mut s = _mm512_set1_epi32(offsets[n][j]);
                    for (i, v) in v.iter().enumerate() {
                        s = _mm512_dpbusd_epi32(s, *v, bcast(x.add(4 * i)));
                    }
                    isum[n] = _mm512_add_epi32(isum[n], _mm512_mullo_epi32(s, sc));
                }
            }
            let d = _mm512_loadu_ps(g.add(D) as *const f32);
            for n in 0..NX {
                let dy = _mm512_set1_ps((xb(n) as *const f32).read_unaligned());
                let wd = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[n]), d);
                acc[n] = _mm512_fmadd_ps(wd, dy, acc[n]);
            }
        }
        for (n, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(t.out.add(n * t.out_stride), *a);
        }
    }
}
