//! A prompt's products of the 32-value block types (Q8_0, Q5_0, Q4_0, IQ4_NL, MXFP4) with
//! AVX-512 VNNI: two groups side by side in the lanes of 512-bit registers, rows `0..8` from
//! the first and `8..16` from the second, so that one `vpdpbusd` serves sixteen rows where the
//! 256-bit kernels (`x86::tile_q8_stored`, `x86::tile_u5`, `x86::tile_u4`, `x86::tile_i8`)
//! serve eight. Q8_0's groups are read as stored, the others' unpacked ([`GroupView`]).
//! `vpdpbusd` multiplies unsigned bytes by signed ones and AVX-512 has no `vpsignb` to move the
//! weights' signs onto the activations, so signed values (Q8_0's, the tables' of IQ4_NL and
//! MXFP4) are made unsigned in registers (w + 128, one `vpxord` a chunk for every token of the
//! call) and each token's block sum starts from −128·Σx ([`super::PackedActs`]'s
//! `neg_offsets128`); Q5_0's and Q4_0's values are unsigned already (w + 16, w + 8) and start
//! from minus their offsets: the same exact integer Σ w·x. Each lane then follows the 256-bit
//! kernels' chain for its row, `fma(ws·xs, isum, acc)` per block, so a row's outputs have the
//! same bits here, there and in the scalar kernels (`tests.rs`: the packed products against
//! the one-row kernels and each token alone).
//!
//! Decode's products of all five (up to four tokens) read pairs of stored groups the same way
//! ([`stored_pair`]), the nibbles split (and Q5_0's fifth bits merged) in registers and the
//! tables' values looked up already plus 128, with the weights prefetched as they stream from
//! memory.

use std::arch::x86_64::*;

use super::wide::{join, table_plus_128, WIDE_TOKENS};
use super::wide_stored::prefetch_pair;
use super::x86::PREFETCH;
use super::{GroupView, Tile, GROUP_ROWS, QK};
use crate::quant::{GgmlType, KVALUES_IQ4NL, KVALUES_MXFP4};

/// Bytes of a stored Q8_0 group's block: the eight rows' f16 scales, then their 256 values,
/// chunk `k` (32 bytes) holding values `4k..4k + 4` of each row.
const Q8_0_BLOCK: usize = 272;
/// Bytes of a stored group's block of the four-bit types (Q4_0, IQ4_NL, MXFP4): the eight
/// rows' f16 scales, then 128 bytes of nibbles, chunk `c < 4` (32 bytes) holding values
/// `4c..4c + 4` of each row in its low nibbles and `16 + 4c..` in its high ones.
const NIBBLE_BLOCK: usize = 144;
/// Bytes of a stored Q5_0 group's block: [`NIBBLE_BLOCK`]'s, then 32 bytes of fifth bits,
/// bit `c` of row `r`'s byte `j` (byte `4r + j`) value `4c + j`'s, bit `c + 4` value `16 + 4c + j`'s.
const Q5_0_BLOCK: usize = 176;
/// Bytes of a Q8_0 activation block: an f16 scale, then 32 signed values.
const ACT_BLOCK: usize = 34;

/// How a block's stored or unpacked bytes become sixteen rows' unsigned values, and where each
/// token's block sum starts.
mod form {
    /// Signed bytes (Q8_0's; the tables' values unpacked): plus 128, from the offset −128·Σx.
    pub const SIGNED: u8 = 0;
    /// Unsigned bytes (Q5_0's and Q4_0's unpacked): from minus the offset, bias·Σx.
    pub const UNSIGNED: u8 = 1;
    /// Stored nibbles indexing a table of signed values: looked up plus 128, from −128·Σx.
    pub const TABLE: u8 = 2;
    /// Stored unsigned nibbles (Q4_0's): from minus the offset, 8·Σx.
    pub const NIBBLES: u8 = 3;
    /// Stored nibbles and fifth bits (Q5_0's): from minus the offset, 16·Σx.
    pub const FIVE_BITS: u8 = 4;
}

/// Two groups' blocks: block `k`'s values (interleaved as stored: 256 bytes, or 128 of
/// nibbles and, for Q5_0, 32 of fifth bits) at `values[g] + k·v_stride`, its eight scales at
/// `scales[g] + k·s_stride` (f16 or f32).
struct Pair {
    values: [*const u8; 2],
    v_stride: usize,
    scales: [*const u8; 2],
    s_stride: usize,
}

impl Pair {
    /// Two stored groups (each block its eight rows' f16 scales, then `block − 16` bytes of
    /// values), checked to hold the tile's blocks, for a tile of at most `most` tokens that
    /// carries its scales and offsets.
    fn stored((a, b): (&[u8], &[u8]), block: usize, t: &Tile, most: usize) -> Pair {
        let bytes = t.blocks * block;
        assert!(a.len() >= bytes && b.len() >= bytes && (1..=most).contains(&t.nx));
        assert!(!t.offsets.is_null() && !t.scales.is_null());
        Pair {
            values: [a.as_ptr().wrapping_add(16), b.as_ptr().wrapping_add(16)],
            v_stride: block,
            scales: [a.as_ptr(), b.as_ptr()],
            s_stride: block,
        }
    }
}

/// Stored Q8_0 groups `a` and `b` (`t.blocks` blocks each) against `t.nx` tokens (at most
/// [`WIDE_TOKENS`]), sixteen outputs per token at `t.out` (the first group's eight, then the
/// second's).
///
/// # Safety
/// The tile's pointers are valid for what [`Tile`] says, with sixteen outputs per token and
/// its offsets the tokens' −128·Σx per block; the CPU has AVX-512 F/BW/VNNI, FMA and F16C.
pub(crate) unsafe fn q8_0_pair(a: &[u8], b: &[u8], t: &Tile) {
    let pair = Pair::stored((a, b), Q8_0_BLOCK, t, WIDE_TOKENS);
    // SAFETY: the caller's contract; the groups' bytes checked by `Pair::stored`.
    unsafe { by_tokens::<true, { form::SIGNED }, false>(&pair, t, _mm512_setzero_si512()) }
}

/// Decode's pairs: stored groups `a` and `b` of `ty` (Q8_0, Q5_0, Q4_0, IQ4_NL or MXFP4;
/// `t.blocks` blocks each) against `t.nx` tokens (at most four), as [`q8_0_pair`], the weights
/// prefetched ahead: Q8_0's values made unsigned in registers, Q5_0's and Q4_0's unsigned
/// already (offsets 16·Σx and 8·Σx), the tables' nibbles looked up plus 128 (offsets
/// −128·Σx).
///
/// # Safety
/// As [`q8_0_pair`], with the offsets `ty` takes.
pub(crate) unsafe fn stored_pair(a: &[u8], b: &[u8], t: &Tile, ty: GgmlType) {
    let block = match ty {
        GgmlType::Q8_0 => Q8_0_BLOCK,
        GgmlType::Q5_0 => Q5_0_BLOCK,
        _ => NIBBLE_BLOCK,
    };
    let pair = Pair::stored((a, b), block, t, 4);
    // SAFETY: AVX-512 F (the caller's contract).
    let table = |values| unsafe { table_plus_128(values) };
    // SAFETY: the caller's contract; the groups' bytes checked by `Pair::stored`.
    unsafe {
        match ty {
            GgmlType::Q8_0 => {
                by_tokens::<true, { form::SIGNED }, true>(&pair, t, _mm512_setzero_si512())
            }
            GgmlType::Q4_0 => {
                by_tokens::<true, { form::NIBBLES }, true>(&pair, t, _mm512_setzero_si512())
            }
            GgmlType::Q5_0 => {
                by_tokens::<true, { form::FIVE_BITS }, true>(&pair, t, _mm512_setzero_si512())
            }
            GgmlType::IQ4_NL => {
                by_tokens::<true, { form::TABLE }, true>(&pair, t, table(&KVALUES_IQ4NL))
            }
            GgmlType::MXFP4 => {
                by_tokens::<true, { form::TABLE }, true>(&pair, t, table(&KVALUES_MXFP4))
            }
            _ => unreachable!("no stored 512-bit kernel for {ty}"),
        }
    }
}

/// Unpacked groups `a` and `b` of the 32-value types against `t.nx` tokens, as
/// [`q8_0_pair`]: `signed` values (IQ4_NL's and MXFP4's table values) with the tokens'
/// −128·Σx as offsets, else unsigned ones (Q5_0's, Q4_0's) with their bias times Σx.
///
/// # Safety
/// As [`q8_0_pair`], with the offsets `signed` says.
pub(crate) unsafe fn unpacked_pair(a: &GroupView, b: &GroupView, t: &Tile, signed: bool) {
    for g in [a, b] {
        assert!(t.blocks > 0 && g.values.len() >= g.stride * (t.blocks - 1) + GROUP_ROWS * QK);
        assert!(g.scales.len() >= GROUP_ROWS * t.blocks && g.stride == a.stride);
    }
    assert!((1..=WIDE_TOKENS).contains(&t.nx) && !t.offsets.is_null() && !t.scales.is_null());
    let pair = Pair {
        values: [a.values.as_ptr(), b.values.as_ptr()],
        v_stride: a.stride,
        scales: [
            a.scales.as_ptr() as *const u8,
            b.scales.as_ptr() as *const u8,
        ],
        s_stride: 4 * GROUP_ROWS,
    };
    let none = _mm512_setzero_si512();
    // SAFETY: the caller's contract; the views' sizes checked above.
    unsafe {
        if signed {
            by_tokens::<false, { form::SIGNED }, false>(&pair, t, none)
        } else {
            by_tokens::<false, { form::UNSIGNED }, false>(&pair, t, none)
        }
    }
}

/// `blocks_nx::<NX, ..>` for the tile's token count (decode's, `AHEAD`, at most four).
#[inline(always)]
unsafe fn by_tokens<const F16: bool, const FORM: u8, const AHEAD: bool>(
    pair: &Pair,
    t: &Tile,
    table: __m512i,
) {
    // SAFETY: forwarded.
    unsafe {
        match t.nx {
            1 => blocks_nx::<1, F16, FORM, AHEAD>(pair, t, table),
            2 => blocks_nx::<2, F16, FORM, AHEAD>(pair, t, table),
            3 => blocks_nx::<3, F16, FORM, AHEAD>(pair, t, table),
            4 => blocks_nx::<4, F16, FORM, AHEAD>(pair, t, table),
            _ if AHEAD => unreachable!("decode's tiles hold at most four tokens"),
            5 => blocks_nx::<5, F16, FORM, AHEAD>(pair, t, table),
            6 => blocks_nx::<6, F16, FORM, AHEAD>(pair, t, table),
            7 => blocks_nx::<7, F16, FORM, AHEAD>(pair, t, table),
            _ => blocks_nx::<8, F16, FORM, AHEAD>(pair, t, table),
        }
    }
}

/// Block `k`'s sixteen rows' values, unsigned, chunk `c` holding values `4c..4c + 4` of each
/// row ([`form`]); `table` the tables' values plus 128.
#[inline(always)]
unsafe fn values<const FORM: u8>(pair: &Pair, k: usize, table: __m512i) -> [__m512i; 8] {
    let [va, vb] = pair.values.map(|v| v.wrapping_add(k * pair.v_stride));
    // SAFETY (the reads): block k's values of both groups (the callers' contract).
    unsafe {
        if FORM == form::SIGNED || FORM == form::UNSIGNED {
            return std::array::from_fn(|c| {
                let v = join(va.add(32 * c), vb.add(32 * c));
                if FORM == form::SIGNED {
                    _mm512_xor_si512(v, _mm512_set1_epi8(-128))
                } else {
                    v
                }
            });
        }
        let (m4, m16) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
        let qh = if FORM == form::FIVE_BITS {
            join(va.add(128), vb.add(128))
        } else {
            _mm512_setzero_si512()
        };
        let mut w = [_mm512_setzero_si512(); 8];
        for c in 0..4 {
            let v = join(va.add(32 * c), vb.add(32 * c));
            let (mut lo, mut hi) = (
                _mm512_and_si512(v, m4),
                _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
            );
            if FORM == form::FIVE_BITS {
                // Bits c and c + 4 of the fifth bits' bytes moved to bit 4 by 16-bit shifts
                // of at most 4, which carry no other byte's bit onto bit 4.
                let (up, down) = (_mm_cvtsi32_si128(4 - c as i32), _mm_cvtsi32_si128(c as i32));
                lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_sll_epi16(qh, up), m16));
                hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srl_epi16(qh, down), m16));
            }
            (w[c], w[c + 4]) = if FORM == form::TABLE {
                (
                    _mm512_shuffle_epi8(table, lo),
                    _mm512_shuffle_epi8(table, hi),
                )
            } else {
                (lo, hi)
            };
        }
        w
    }
}

/// The sixteen rows' scales of block `k`: `F16` as stored, else f32.
#[inline(always)]
unsafe fn scales<const F16: bool>(pair: &Pair, k: usize) -> __m512 {
    let [a, b] = pair.scales.map(|s| s.wrapping_add(k * pair.s_stride));
    // SAFETY: eight scales at each (the caller's contract).
    unsafe {
        if F16 {
            _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(a as *const __m128i)),
                _mm_loadu_si128(b as *const __m128i),
            ))
        } else {
            let lo = _mm512_castpd256_pd512(_mm256_loadu_pd(a as *const f64));
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                lo,
                _mm256_loadu_pd(b as *const f64),
            ))
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn blocks_nx<const NX: usize, const F16: bool, const FORM: u8, const AHEAD: bool>(
    pair: &Pair,
    t: &Tile,
    table: __m512i,
) {
    let mut acc = [_mm512_setzero_ps(); NX];
    // SAFETY (all reads below): block k < blocks of both groups (the callers' checks); token
    // n < nx's activation block k (ACT_BLOCK bytes) in its row, and its scale and offset k at
    // t.scales / t.offsets (stride t.blocks); sixteen outputs per token.
    unsafe {
        for k in 0..t.blocks {
            if AHEAD {
                let [a, b] = pair.scales.map(|g| g.wrapping_add(k * pair.s_stride));
                prefetch_pair::<PREFETCH>(a, b, k, t.blocks, pair.s_stride);
            }
            let ws = scales::<F16>(pair, k);
            let w = values::<FORM>(pair, k, table);
            for (n, acc) in acc.iter_mut().enumerate() {
                let xb = t.x.add(n * t.x_stride + ACT_BLOCK * k + 2);
                let x =
                    |c: usize| _mm512_set1_epi32((xb.add(4 * c) as *const i32).read_unaligned());
                let at = n * t.blocks + k;
                // Signed values: the offset is −128·Σx already; unsigned: bias·Σx, negated.
                let start = if FORM == form::SIGNED || FORM == form::TABLE {
                    _mm512_set1_epi32(*t.offsets.add(at))
                } else {
                    _mm512_sub_epi32(
                        _mm512_setzero_si512(),
                        _mm512_set1_epi32(*t.offsets.add(at)),
                    )
                };
                // Two chains of four (eight dependent ones would wait on each other).
                let mut p = _mm512_dpbusd_epi32(start, w[0], x(0));
                let mut q = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], x(1));
                for c in 1..4 {
                    p = _mm512_dpbusd_epi32(p, w[2 * c], x(2 * c));
                    q = _mm512_dpbusd_epi32(q, w[2 * c + 1], x(2 * c + 1));
                }
                let isum = _mm512_add_epi32(p, q);
                let d = _mm512_mul_ps(ws, _mm512_set1_ps(*t.scales.add(at)));
                *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum), *acc);
            }
        }
        for (n, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(t.out.add(n * t.out_stride), *acc);
        }
    }
}
