//! AVX2 and AVX-512 VNNI kernels for Q5_0 groups read as stored (decode, a speculative
//! verification, a short prompt's token block): the five-bit values unpacked in registers,
//! never written out. Same integer sums and float chain as [`super::x86::tile_u5`], so the
//! same bits on every level.

use std::arch::x86_64::*;

use super::x86::{unsigned_block_sum, uses_vnni, PREFETCH};
use super::Tile;

/// The values of chunks `c` and `c + 4` of a stored Q5_0 group-block whose 32 bytes of quants
/// start at `qs` (`qh`: the block's fifth bits): the low nibbles of `qs`'s bytes with bit `c`
/// of `qh`'s bytes, the high nibbles with bit `c + 4`, each moved to bit 4 of its byte by a
/// 16-bit shift of at most 4, which never carries another byte's bit onto bit 4.
///
/// # Safety
/// `qs` points at 32 readable bytes; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn q5_chunk_pair(qs: *const u8, qh: __m256i, c: usize) -> (__m256i, __m256i) {
    let (m4, m16) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    // SAFETY: 32 bytes at `qs` (the caller's contract).
    let qs = unsafe { _mm256_loadu_si256(qs as *const __m256i) };
    let up = _mm_cvtsi32_si128(4 - c as i32);
    let down = _mm_cvtsi32_si128(c as i32);
    let lo = _mm256_or_si256(
        _mm256_and_si256(qs, m4),
        _mm256_and_si256(_mm256_sll_epi16(qh, up), m16),
    );
    let hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4),
        _mm256_and_si256(_mm256_srl_epi16(qh, down), m16),
    );
    (lo, hi)
}

/// Block `b` of a stored Q5_0 group (176 bytes: eight f16 row scales, 128 bytes of quants,
/// 32 of fifth bits), with the weights ahead of it prefetched: its start, its scales widened
/// and its fifth bits.
///
/// # Safety
/// `stored` holds block `b`; the caller has AVX2 and F16C.
#[inline(always)]
unsafe fn q5_block(stored: &[u8], b: usize) -> (*const u8, __m256, __m256i) {
    unsafe {
        let s = stored.as_ptr().add(176 * b);
        for l in 0..3 {
            _mm_prefetch::<_MM_HINT_T0>(s.add(PREFETCH + 64 * l) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(s.add(super::PREFETCH_L2 + 64 * l) as *const i8);
        }
        let ws = _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i));
        let qh = _mm256_loadu_si256(s.add(144) as *const __m256i);
        (s, ws, qh)
    }
}

/// Q5_0 groups read as stored (for one tile of tokens: decode), the values unpacked in
/// registers; the same integer sums and float chain as [`super::x86::tile_u5`], so the same
/// bits.
///
/// # Safety
/// As [`super::TileFn`] with `stored` the group's stored bytes (176 per block); the CPU has
/// AVX2, FMA and F16C.
pub(crate) unsafe fn tile_q5_stored(stored: &[u8], tile: &Tile) {
    assert!(stored.len() >= 176 * tile.blocks);
    kernel_by_level!(q5_stored_nx, stored, &[u8], tile)
}

/// With `VNNI`, each lane's sums come from `vpdpbusd` in 32 bits; without, from `vpmaddubsw`
/// summed in 16 bits (no saturation, as in [`q5_many`]) then `vpmaddwd`: the same integers.
#[inline(always)]
unsafe fn q5_stored_nx<const VNNI: bool, const NX: usize>(stored: &[u8], t: &Tile) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NX];
    // SAFETY: block b < blocks: 176 stored bytes (checked by the caller); activation reads as
    // in `tile_signed`.
    unsafe {
        for b in 0..t.blocks {
            let (s, ws, qh) = q5_block(stored, b);
            let x_at = |n: usize, k: usize| {
                let p = t.x.add(n * t.x_stride + 34 * b + 2 + 4 * k) as *const i32;
                _mm256_set1_epi32(p.read_unaligned())
            };
            // Per token, two sums: of the low and of the high chunks.
            let mut sums = [[_mm256_setzero_si256(); NX]; 2];
            for c in 0..4 {
                let (lo, hi) = q5_chunk_pair(s.add(16 + 32 * c), qh, c);
                let [s_lo, s_hi] = &mut sums;
                for (n, (a, b)) in s_lo.iter_mut().zip(s_hi.iter_mut()).enumerate() {
                    if VNNI {
                        *a = _mm256_dpbusd_epi32(*a, lo, x_at(n, c));
                        *b = _mm256_dpbusd_epi32(*b, hi, x_at(n, c + 4));
                    } else {
                        *a = _mm256_add_epi16(*a, _mm256_maddubs_epi16(lo, x_at(n, c)));
                        *b = _mm256_add_epi16(*b, _mm256_maddubs_epi16(hi, x_at(n, c + 4)));
                    }
                }
            }
            for n in 0..NX {
                let s32 = if VNNI {
                    _mm256_add_epi32(sums[0][n], sums[1][n])
                } else {
                    _mm256_add_epi32(
                        _mm256_madd_epi16(sums[0][n], ones),
                        _mm256_madd_epi16(sums[1][n], ones),
                    )
                };
                let isum =
                    _mm256_sub_epi32(s32, _mm256_set1_epi32(*t.offsets.add(n * t.blocks + b)));
                let d = _mm256_mul_ps(ws, _mm256_set1_ps(*t.scales.add(n * t.blocks + b)));
                acc[n] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[n]);
            }
        }
        for (n, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(t.out.add(n * t.out_stride), *a);
        }
    }
}

/// Most tokens [`tile_q5_many`] takes in one call.
pub(crate) const MANY_TOKENS: usize = 32;

/// Q5_0 groups read as stored, for up to [`MANY_TOKENS`] tokens (a verification, a short
/// prompt's token block): each block's values are unpacked once into eight registers, which
/// every token then reads, instead of a pass that stores them unpacked for
/// [`super::x86::tile_u5`] to load again for every four tokens. The same integer sums and
/// float chain as `tile_u5`, so the same bits.
///
/// # Safety
/// As [`super::TileFn`] with `stored` the group's stored bytes (176 per block) and
/// `1 <= tile.nx <= MANY_TOKENS`; the CPU has AVX2, FMA and F16C.
pub(crate) unsafe fn tile_q5_many(stored: &[u8], tile: &Tile) {
    assert!(stored.len() >= 176 * tile.blocks);
    assert!((1..=MANY_TOKENS).contains(&tile.nx));
    // SAFETY: forwarded, sizes checked; the VNNI body only where the CPU has VNNI (and
    // `simd_level` never exceeds the hardware).
    unsafe {
        if uses_vnni() {
            q5_many_vnni(stored, tile)
        } else {
            q5_many_avx2(stored, tile)
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_many_avx2(stored: &[u8], t: &Tile) {
    // SAFETY: forwarded.
    unsafe { q5_many::<false>(stored, t) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q5_many_vnni(stored: &[u8], t: &Tile) {
    // SAFETY: forwarded.
    unsafe { q5_many::<true>(stored, t) }
}

/// Each token's block sums as in [`unsigned_block_sum`]: with `VNNI` from `vpdpbusd`, without
/// from `vpmaddubsw`; the same integers either way.
#[inline(always)]
unsafe fn q5_many<const VNNI: bool>(stored: &[u8], t: &Tile) {
    let mut acc = [_mm256_setzero_ps(); MANY_TOKENS];
    // SAFETY: block b < blocks: 176 stored bytes (checked by the caller); token n < nx <=
    // MANY_TOKENS: its activation reads as in `tile_signed`.
    unsafe {
        for b in 0..t.blocks {
            let (s, ws, qh) = q5_block(stored, b);
            let mut w = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                (w[c], w[c + 4]) = q5_chunk_pair(s.add(16 + 32 * c), qh, c);
            }
            for (n, a) in acc.iter_mut().enumerate().take(t.nx) {
                let xp = t.x.add(n * t.x_stride + 34 * b + 2) as *const i32;
                let offset = _mm256_broadcastd_epi32(_mm_loadu_si32(
                    t.offsets.add(n * t.blocks + b) as *const u8,
                ));
                let isum = unsigned_block_sum::<VNNI>(&w, xp, offset);
                let d = _mm256_mul_ps(ws, _mm256_set1_ps(*t.scales.add(n * t.blocks + b)));
                *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), *a);
            }
        }
        for (n, a) in acc.iter().enumerate().take(t.nx) {
            _mm256_storeu_ps(t.out.add(n * t.out_stride), *a);
        }
    }
}
