//! AVX2 kernels of the interleaved arithmetic (see the module doc): eight rows in the eight
//! lanes of a register, four values of each per `vpmaddubsw`.

use std::arch::x86_64::*;

use super::x86_q5_0::q5_chunk_pair;
pub(crate) use super::x86_q5_0::{tile_q5_many, tile_q5_stored, MANY_TOKENS};
use super::{GroupView, Tile, GROUP_ROWS};

/// How far ahead of the block being computed the weights are prefetched, in bytes.
pub(super) const PREFETCH: usize = 1024;

/// Whether the kernels take their AVX-512 VNNI bodies: where this process uses that level
/// (`simd_level` never exceeds the hardware, and `NUCLEUS_SIMD` can cap it).
pub(super) fn uses_vnni() -> bool {
    crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512Vnni
}
use crate::quant::{GgmlType, KVALUES_IQ4NL, KVALUES_MXFP4};

/// Q5_0 groups (for many tokens: a long prompt): the unsigned five-bit values by the signed
/// activations, the offset 16·Σx taken off the exact 32-bit sum ([`unsigned_block_sum`]).
///
/// # Safety
/// As [`super::TileFn`]; the CPU has AVX2 and FMA.
pub(crate) unsafe fn tile_u5(group: &GroupView, tile: &Tile) {
    kernel_by_level!(tile_unsigned, group, &GroupView, tile)
}

/// Q4_0 groups: [`tile_u5`]'s arithmetic on unsigned four-bit values, the offset 8·Σx.
///
/// # Safety
/// As [`super::TileFn`]; the CPU has AVX2 and FMA.
pub(crate) unsafe fn tile_u4(group: &GroupView, tile: &Tile) {
    kernel_by_level!(tile_unsigned, group, &GroupView, tile)
}

/// Q8_0 and IQ4_NL groups: `vpmaddubsw` of |w| by x carrying w's sign (a pair sums to at most
/// 2·128·127), widened to 32 bits after every chunk.
///
/// # Safety
/// As [`super::TileFn`]; the CPU has AVX2 and FMA.
pub(crate) unsafe fn tile_i8(group: &GroupView, tile: &Tile) {
    // SAFETY: forwarded; `nx` picks the instantiation.
    unsafe {
        match tile.nx {
            1 => tile_signed::<1>(group, tile),
            2 => tile_signed::<2>(group, tile),
            3 => tile_signed::<3>(group, tile),
            _ => tile_signed::<4>(group, tile),
        }
    }
}

/// One token's exact integer sum over a block of unsigned values (at most 31) held in `w`, the
/// eight chunks of four values per row, minus the token's `offset` (bias · Σx): `xp` points at
/// the block's 32 activations. With `VNNI`, `vpdpbusd` in 32 bits, in two chains (eight
/// dependent ones would wait on each other), the first starting from −offset; without,
/// `vpmaddubsw` summed in 16 bits (at most 4 · 2 · 31 · 127 = 31,496: no saturation) then
/// `vpmaddwd`. The same integers either way.
///
/// # Safety
/// `xp` is valid for 32 bytes; the CPU has AVX2 (and AVX-512 VNNI and VL with `VNNI`).
#[inline(always)]
pub(super) unsafe fn unsigned_block_sum<const VNNI: bool>(
    w: &[__m256i; 8],
    xp: *const i32,
    offset: __m256i,
) -> __m256i {
    // SAFETY: `xp` covers the eight 4-byte reads (the caller's contract).
    let x = |k: usize| unsafe { _mm256_set1_epi32(xp.add(k).read_unaligned()) };
    if VNNI {
        let neg = _mm256_sub_epi32(_mm256_setzero_si256(), offset);
        let mut p = _mm256_dpbusd_epi32(neg, w[0], x(0));
        let mut q = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w[1], x(1));
        for k in 1..4 {
            p = _mm256_dpbusd_epi32(p, w[2 * k], x(2 * k));
            q = _mm256_dpbusd_epi32(q, w[2 * k + 1], x(2 * k + 1));
        }
        _mm256_add_epi32(p, q)
    } else {
        let ones = _mm256_set1_epi16(1);
        let m = |k: usize| _mm256_maddubs_epi16(w[k], x(k));
        let lo = _mm256_add_epi16(_mm256_add_epi16(m(0), m(1)), _mm256_add_epi16(m(2), m(3)));
        let hi = _mm256_add_epi16(_mm256_add_epi16(m(4), m(5)), _mm256_add_epi16(m(6), m(7)));
        let s32 = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones));
        _mm256_sub_epi32(s32, offset)
    }
}

/// Unsigned values, weight + bias (the bias is in the tokens' offsets): a block's eight chunks
/// are loaded once into registers, then each token's sum is formed alone, so that nothing
/// spills and the tokens' chains overlap. The same integer sums and float chain as
/// [`tile_q5_stored`] and [`tile_q4_stored`] (and the scalar kernels), so the same bits.
#[inline(always)]
unsafe fn tile_unsigned<const VNNI: bool, const NX: usize>(group: &GroupView, t: &Tile) {
    debug_assert!(group.values.len() >= group.stride * (t.blocks - 1) + 256);
    debug_assert!(group.scales.len() >= GROUP_ROWS * t.blocks);
    let (vp, sp) = (group.values.as_ptr(), group.scales.as_ptr());
    let mut acc = [_mm256_setzero_ps(); NX];
    // SAFETY: as in `tile_signed`.
    unsafe {
        for b in 0..t.blocks {
            let qb = vp.add(group.stride * b);
            for l in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(qb.add(PREFETCH + 64 * l) as *const i8);
            }
            let w: [__m256i; 8] =
                std::array::from_fn(|k| _mm256_loadu_si256(qb.add(32 * k) as *const __m256i));
            let ws = _mm256_loadu_ps(sp.add(GROUP_ROWS * b));
            for (n, a) in acc.iter_mut().enumerate() {
                let xp = t.x.add(n * t.x_stride + 34 * b + 2) as *const i32;
                // A broadcast from memory, not a load and broadcast in registers.
                let offset = _mm256_broadcastd_epi32(_mm_loadu_si32(
                    t.offsets.add(n * t.blocks + b) as *const u8,
                ));
                let isum = unsigned_block_sum::<VNNI>(&w, xp, offset);
                let d = _mm256_mul_ps(ws, _mm256_set1_ps(*t.scales.add(n * t.blocks + b)));
                *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), *a);
            }
        }
        for (n, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(t.out.add(n * t.out_stride), *a);
        }
    }
}

/// Signed values (Q8_0, IQ4_NL's table values).
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_signed<const NX: usize>(group: &GroupView, t: &Tile) {
    debug_assert!(group.values.len() >= group.stride * (t.blocks - 1) + 256);
    debug_assert!(group.scales.len() >= GROUP_ROWS * t.blocks);
    let ones = _mm256_set1_epi16(1);
    let (vp, sp) = (group.values.as_ptr(), group.scales.as_ptr());
    let mut acc = [_mm256_setzero_ps(); NX];
    // SAFETY (all pointer reads below): block b < blocks of the group's values (256 bytes at stride·b) and
    // scales (8 floats), checked above; token n < nx's activation bytes 34b + 2 + 4k .. +4
    // inside its row of 34·blocks bytes, and its scale and offset b (the caller's contract).
    unsafe {
        for b in 0..t.blocks {
            let ws = _mm256_loadu_ps(sp.add(GROUP_ROWS * b));
            let qb = vp.add(group.stride * b);
            // Weights stream from memory in decode: ask for them a few blocks ahead (past the
            // group's end this is the next group, which is next in memory; a prefetch never
            // faults).
            for l in 0..5 {
                _mm_prefetch::<_MM_HINT_T0>(qb.add(PREFETCH + 64 * l) as *const i8);
            }
            let x_at = |n: usize, k: usize| {
                let p = t.x.add(n * t.x_stride + 34 * b + 2 + 4 * k) as *const i32;
                _mm256_set1_epi32(p.read_unaligned())
            };
            let mut s32 = [_mm256_setzero_si256(); NX];
            for k in 0..8 {
                let wk = _mm256_loadu_si256(qb.add(32 * k) as *const __m256i);
                let aw = _mm256_abs_epi8(wk);
                for (n, s) in s32.iter_mut().enumerate() {
                    let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x_at(n, k), wk));
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p, ones));
                }
            }
            for (n, (a, s)) in acc.iter_mut().zip(s32).enumerate() {
                let d = _mm256_mul_ps(ws, _mm256_set1_ps(*t.scales.add(n * t.blocks + b)));
                *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *a);
            }
        }
        for (n, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(t.out.add(n * t.out_stride), *a);
        }
    }
}

/// Prefetches the `lines` cache lines at `s` (a stored group-block): [`PREFETCH`] bytes ahead
/// into L1 and `PREFETCH_L2` bytes ahead into L2.
///
/// # Safety
/// Prefetches never fault; `s` is only offset, not read.
#[inline(always)]
pub(super) unsafe fn prefetch_ahead(s: *const u8, lines: usize) {
    for l in 0..lines {
        _mm_prefetch::<_MM_HINT_T0>(s.wrapping_add(PREFETCH + 64 * l) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(s.wrapping_add(super::PREFETCH_L2 + 64 * l) as *const i8);
    }
}

/// Asks for the `bytes` of a super-block the K-quant kernels read a few blocks after the one
/// at `g`: weights stream from memory in decode. Into L1 from [`super::PREFETCH_L1`] on, into
/// L2 from [`super::PREFETCH_L2`] (`wrapping_add`: a prefetch past the weights' end is a hint
/// that reads nothing).
#[inline(always)]
pub(super) fn prefetch_block(g: *const u8, bytes: usize) {
    for l in (0..bytes).step_by(64) {
        // SAFETY: SSE is part of x86-64; a prefetch dereferences nothing.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(g.wrapping_add(super::PREFETCH_L1 + l) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(g.wrapping_add(super::PREFETCH_L2 + l) as *const i8);
        }
    }
}

/// Activation bytes `4k..4k + 4` of block `b` of token `n`, in every 32-bit lane.
///
/// # Safety
/// Token `n`'s activation row holds block `b` (34 bytes a block).
#[inline(always)]
pub(super) unsafe fn x_quad(t: &Tile, n: usize, b: usize, k: usize) -> __m256i {
    // SAFETY: inside block b of row n, by the caller's contract.
    unsafe {
        let p = t.x.add(n * t.x_stride + 34 * b + 2 + 4 * k) as *const i32;
        _mm256_set1_epi32(p.read_unaligned())
    }
}

/// A block's float step for each token: acc[n] += (w scales · x scale) · the 32-bit sums.
///
/// # Safety
/// Token `n < NX` has `t.blocks` scales.
#[inline(always)]
unsafe fn fold_block<const NX: usize>(
    acc: &mut [__m256; NX],
    ws: __m256,
    t: &Tile,
    b: usize,
    sums: &[__m256i; NX],
) {
    for (n, (a, s)) in acc.iter_mut().zip(sums).enumerate() {
        // SAFETY: scale b of token n, by the caller's contract.
        let d = _mm256_mul_ps(
            ws,
            _mm256_set1_ps(unsafe { *t.scales.add(n * t.blocks + b) }),
        );
        *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(*s), *a);
    }
}

/// Q8_0 groups read as stored (for one tile of tokens: decode), the f16 scales widened in
/// registers: the same integer sums and float chain as [`tile_i8`], so the same bits, without
/// a first pass over the group to widen its scales (in decode the weights stream from memory,
/// and that pass read them twice).
///
/// # Safety
/// As [`super::TileFn`] with `stored` the group's stored bytes (272 per block); the CPU has
/// AVX2, FMA and F16C.
pub(crate) unsafe fn tile_q8_stored(stored: &[u8], tile: &Tile) {
    assert!(stored.len() >= 272 * tile.blocks);
    kernel_by_level!(q8_stored_nx, stored, &[u8], tile)
}

/// |w| (at most 128) by x carrying w's sign (at most 127 in magnitude): with `VNNI` one
/// `vpdpbusd`, without `vpmaddubsw` (a pair at most 32,512: no saturation) then `vpmaddwd`;
/// the same 32-bit sums.
#[inline(always)]
unsafe fn q8_stored_nx<const VNNI: bool, const NX: usize>(stored: &[u8], t: &Tile) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NX];
    // SAFETY: block b < blocks: 272 stored bytes (checked by the caller); activation reads as
    // in `tile_signed`.
    unsafe {
        for b in 0..t.blocks {
            let s = stored.as_ptr().add(272 * b);
            prefetch_ahead(s, 5);
            let ws = _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i));
            let x_at = |n: usize, k: usize| x_quad(t, n, b, k);
            let mut s32 = [_mm256_setzero_si256(); NX];
            for k in 0..8 {
                let wk = _mm256_loadu_si256(s.add(16 + 32 * k) as *const __m256i);
                let aw = _mm256_abs_epi8(wk);
                for (n, s) in s32.iter_mut().enumerate() {
                    let sx = _mm256_sign_epi8(x_at(n, k), wk);
                    *s = if VNNI {
                        _mm256_dpbusd_epi32(*s, aw, sx)
                    } else {
                        _mm256_add_epi32(*s, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones))
                    };
                }
            }
            fold_block(&mut acc, ws, t, b, &s32);
        }
        for (n, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(t.out.add(n * t.out_stride), *a);
        }
    }
}

/// Q4_0 groups read as stored (for one tile of tokens: decode), the nibbles split in
/// registers: the same integer sums and float chain as [`tile_u4`], so the same bits. The
/// eight chunks of a block sum in 16 bits (a pair at most 2·15·127, eight chunks 30,480).
///
/// # Safety
/// As [`super::TileFn`] with `stored` the group's stored bytes (144 per block); the CPU has
/// AVX2, FMA and F16C.
pub(crate) unsafe fn tile_q4_stored(stored: &[u8], tile: &Tile) {
    assert!(stored.len() >= 144 * tile.blocks);
    // SAFETY: forwarded; `nx` picks the instantiation.
    unsafe {
        match tile.nx {
            1 => q4_stored_nx::<1>(stored, tile),
            2 => q4_stored_nx::<2>(stored, tile),
            3 => q4_stored_nx::<3>(stored, tile),
            _ => q4_stored_nx::<4>(stored, tile),
        }
    }
}

/// IQ4_NL groups read as stored (decode): the nibbles index `kvalues_iq4nl` with `vpshufb`,
/// then [`tile_i8`]'s signed arithmetic, so its bits. `vpmaddubsw` of |w| (at most 127) by x
/// carrying w's sign (Q8_0 activations lie in −127..=127) sums a pair to at most 2·127·127 =
/// 32,258: no 16-bit saturation. With VNNI one `vpdpbusd` per chunk and token: the same
/// 32-bit sums.
///
/// # Safety
/// As [`tile_q4_stored`].
pub(crate) unsafe fn tile_iq4nl_stored(stored: &[u8], tile: &Tile) {
    assert!(stored.len() >= 144 * tile.blocks);
    kernel_by_level!(
        table_stored_nx,
        (stored, &KVALUES_IQ4NL),
        (&[u8], &[i8; 16]),
        tile
    )
}

/// MXFP4 groups read as stored: [`tile_iq4nl_stored`] with `kvalues_mxfp4` (|w| ≤ 12).
///
/// # Safety
/// As [`tile_q4_stored`].
pub(crate) unsafe fn tile_mxfp4_stored(stored: &[u8], tile: &Tile) {
    assert!(stored.len() >= 144 * tile.blocks);
    kernel_by_level!(
        table_stored_nx,
        (stored, &KVALUES_MXFP4),
        (&[u8], &[i8; 16]),
        tile
    )
}

/// Groups whose nibbles index `table` (signed values of magnitude at most 127).
#[inline(always)]
unsafe fn table_stored_nx<const VNNI: bool, const NX: usize>(
    (stored, table): (&[u8], &[i8; 16]),
    t: &Tile,
) {
    let ones = _mm256_set1_epi16(1);
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); NX];
    // SAFETY: block b < blocks: 144 stored bytes (checked by the caller); the table is 16
    // bytes; activation reads as in `tile_signed`.
    unsafe {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr() as *const __m128i));
        for b in 0..t.blocks {
            let s = stored.as_ptr().add(144 * b);
            prefetch_ahead(s, 3);
            let ws = _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i));
            let x_at = |n: usize, k: usize| x_quad(t, n, b, k);
            let mut s32 = [_mm256_setzero_si256(); NX];
            for c in 0..4 {
                let qs = _mm256_loadu_si256(s.add(16 + 32 * c) as *const __m256i);
                let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(qs, m4));
                let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4));
                let (a_lo, a_hi) = (_mm256_abs_epi8(lo), _mm256_abs_epi8(hi));
                for (n, s) in s32.iter_mut().enumerate() {
                    let x_lo = _mm256_sign_epi8(x_at(n, c), lo);
                    let x_hi = _mm256_sign_epi8(x_at(n, c + 4), hi);
                    *s = if VNNI {
                        _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(*s, a_lo, x_lo), a_hi, x_hi)
                    } else {
                        let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(a_lo, x_lo), ones);
                        let p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(a_hi, x_hi), ones);
                        _mm256_add_epi32(*s, _mm256_add_epi32(p_lo, p_hi))
                    };
                }
            }
            fold_block(&mut acc, ws, t, b, &s32);
        }
        for (n, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(t.out.add(n * t.out_stride), *a);
        }
    }
}

/// Q4_0's unsigned nibbles, offset 8.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_stored_nx<const NX: usize>(stored: &[u8], t: &Tile) {
    let ones = _mm256_set1_epi16(1);
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); NX];
    // SAFETY: block b < blocks: 144 stored bytes (checked by the caller); activation reads as
    // in `tile_signed`.
    unsafe {
        for b in 0..t.blocks {
            let s = stored.as_ptr().add(144 * b);
            prefetch_ahead(s, 3);
            let ws = _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i));
            let x_at = |n: usize, k: usize| x_quad(t, n, b, k);
            let mut s16 = [_mm256_setzero_si256(); NX];
            for c in 0..4 {
                let qs = _mm256_loadu_si256(s.add(16 + 32 * c) as *const __m256i);
                let lo = _mm256_and_si256(qs, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
                for (n, s) in s16.iter_mut().enumerate() {
                    let p = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, x_at(n, c)),
                        _mm256_maddubs_epi16(hi, x_at(n, c + 4)),
                    );
                    *s = _mm256_add_epi16(*s, p);
                }
            }
            let sums: [__m256i; NX] = std::array::from_fn(|n| {
                let offset = *t.offsets.add(n * t.blocks + b);
                _mm256_sub_epi32(_mm256_madd_epi16(s16[n], ones), _mm256_set1_epi32(offset))
            });
            fold_block(&mut acc, ws, t, b, &sums);
        }
        for (n, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(t.out.add(n * t.out_stride), *a);
        }
    }
}

/// [`super::pack::unpack_group_scalar`] with AVX2.
pub(crate) fn unpack_group(
    ty: GgmlType,
    blocks: usize,
    src: &[u8],
    scales: &mut [f32],
    values: &mut [u8],
) {
    let gbb = stored_block_bytes(ty);
    assert!(src.len() >= blocks * gbb && scales.len() >= 8 * blocks);
    assert!(ty == GgmlType::Q8_0 || values.len() >= 256 * blocks);
    // SAFETY: the CPU has AVX2 and F16C (the caller checked the level); the sizes are checked.
    unsafe { unpack_avx2(ty, blocks, src, scales, values) }
}

/// Bytes of a stored group-block of the types [`unpack_group`] takes.
fn stored_block_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0 => 272,
        GgmlType::Q5_0 => 176,
        _ => 144,
    }
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn unpack_avx2(
    ty: GgmlType,
    blocks: usize,
    src: &[u8],
    scales: &mut [f32],
    values: &mut [u8],
) {
    let gbb = stored_block_bytes(ty);
    let m4 = _mm256_set1_epi8(0x0F);
    // SAFETY: block b < blocks: `gbb` source bytes, 8 scales and 256 value bytes (sizes checked
    // by the caller); the table is 16 bytes.
    unsafe {
        let values_of = if ty == GgmlType::MXFP4 {
            &KVALUES_MXFP4
        } else {
            &KVALUES_IQ4NL
        };
        let table =
            _mm256_broadcastsi128_si256(_mm_loadu_si128(values_of.as_ptr() as *const __m128i));
        for b in 0..blocks {
            let s = src.as_ptr().add(b * gbb);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i));
            _mm256_storeu_ps(scales.as_mut_ptr().add(8 * b), d);
            if ty == GgmlType::Q8_0 {
                continue;
            }
            let v = values.as_mut_ptr().add(256 * b) as *mut __m256i;
            // Q5_0's fifth bits (the 4-bit types' blocks end before them).
            let qh = if ty == GgmlType::Q5_0 {
                _mm256_loadu_si256(s.add(144) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            for c in 0..4 {
                let (lo, hi) = if ty == GgmlType::Q5_0 {
                    q5_chunk_pair(s.add(16 + 32 * c), qh, c)
                } else {
                    let qs = _mm256_loadu_si256(s.add(16 + 32 * c) as *const __m256i);
                    let lo = _mm256_and_si256(qs, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
                    if matches!(ty, GgmlType::IQ4_NL | GgmlType::MXFP4) {
                        (
                            _mm256_shuffle_epi8(table, lo),
                            _mm256_shuffle_epi8(table, hi),
                        )
                    } else {
                        (lo, hi)
                    }
                };
                _mm256_storeu_si256(v.add(c), lo);
                _mm256_storeu_si256(v.add(c + 4), hi);
            }
        }
    }
}
