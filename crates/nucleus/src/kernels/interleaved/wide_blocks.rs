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

use std::arch::x86_64::*;

use super::wide::{join, WIDE_TOKENS};
use super::{GroupView, Tile, GROUP_ROWS, QK};

/// Bytes of a stored Q8_0 group's block: the eight rows' f16 scales, then their 256 values,
/// chunk `k` (32 bytes) holding values `4k..4k + 4` of each row.
const Q8_0_BLOCK: usize = 272;
/// Bytes of a Q8_0 activation block: an f16 scale, then 32 signed values.
const ACT_BLOCK: usize = 34;

/// Two groups' blocks: block `k`'s values (256 bytes, interleaved as stored) at
/// `values[g] + k·v_stride`, its eight scales at `scales[g] + k·s_stride` (f16 or f32).
struct Pair {
    values: [*const u8; 2],
    v_stride: usize,
    scales: [*const u8; 2],
    s_stride: usize,
}

/// Stored Q8_0 groups `a` and `b` (`t.blocks` blocks each) against `t.nx` tokens (at most
/// [`WIDE_TOKENS`]), sixteen outputs per token at `t.out` (the first group's eight, then the
/// second's).
///
/// # Safety
/// The tile's pointers are valid for what [`Tile`] says, with sixteen outputs per token and
/// its offsets the tokens' −128·Σx per block; the CPU has AVX-512 F/BW/VNNI, FMA and F16C.
pub(crate) unsafe fn q8_0_pair(a: &[u8], b: &[u8], t: &Tile) {
    let bytes = t.blocks * Q8_0_BLOCK;
    assert!(a.len() >= bytes && b.len() >= bytes && (1..=WIDE_TOKENS).contains(&t.nx));
    assert!(!t.offsets.is_null() && !t.scales.is_null());
    let pair = Pair {
        values: [a.as_ptr().wrapping_add(16), b.as_ptr().wrapping_add(16)],
        v_stride: Q8_0_BLOCK,
        scales: [a.as_ptr(), b.as_ptr()],
        s_stride: Q8_0_BLOCK,
    };
    // SAFETY: the caller's contract; the groups' bytes checked above.
    unsafe { by_tokens::<true, true>(&pair, t) }
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
    // SAFETY: the caller's contract; the views' sizes checked above.
    unsafe {
        if signed {
            by_tokens::<false, true>(&pair, t)
        } else {
            by_tokens::<false, false>(&pair, t)
        }
    }
}

/// `blocks_nx::<NX, ..>` for the tile's token count.
#[inline(always)]
unsafe fn by_tokens<const F16: bool, const SIGNED: bool>(pair: &Pair, t: &Tile) {
    // SAFETY: forwarded.
    unsafe {
        match t.nx {
            1 => blocks_nx::<1, F16, SIGNED>(pair, t),
            2 => blocks_nx::<2, F16, SIGNED>(pair, t),
            3 => blocks_nx::<3, F16, SIGNED>(pair, t),
            4 => blocks_nx::<4, F16, SIGNED>(pair, t),
            5 => blocks_nx::<5, F16, SIGNED>(pair, t),
            6 => blocks_nx::<6, F16, SIGNED>(pair, t),
            7 => blocks_nx::<7, F16, SIGNED>(pair, t),
            _ => blocks_nx::<8, F16, SIGNED>(pair, t),
        }
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
unsafe fn blocks_nx<const NX: usize, const F16: bool, const SIGNED: bool>(pair: &Pair, t: &Tile) {
    let flip = _mm512_set1_epi8(-128);
    let mut acc = [_mm512_setzero_ps(); NX];
    // SAFETY (all reads below): block k < blocks of both groups (the callers' checks); token
    // n < nx's activation block k (ACT_BLOCK bytes) in its row, and its scale and offset k at
    // t.scales / t.offsets (stride t.blocks); sixteen outputs per token.
    unsafe {
        for k in 0..t.blocks {
            let [va, vb] = pair.values.map(|v| v.add(k * pair.v_stride));
            let ws = scales::<F16>(pair, k);
            // The sixteen rows' values, unsigned (signed ones plus 128).
            let w: [__m512i; 8] = std::array::from_fn(|c| {
                let v = join(va.add(32 * c), vb.add(32 * c));
                if SIGNED {
                    _mm512_xor_si512(v, flip)
                } else {
                    v
                }
            });
            for (n, acc) in acc.iter_mut().enumerate() {
                let xb = t.x.add(n * t.x_stride + ACT_BLOCK * k + 2);
                let x =
                    |c: usize| _mm512_set1_epi32((xb.add(4 * c) as *const i32).read_unaligned());
                let at = n * t.blocks + k;
                // Signed values: the offset is −128·Σx already; unsigned: bias·Σx, negated.
                let start = if SIGNED {
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
