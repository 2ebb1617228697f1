//! Small helpers of the x86 kernels. All are `#[inline(always)]` so that they are compiled
//! inside the target-feature entry points that call them.

use std::arch::x86_64::*;

#[inline(always)]
pub(super) unsafe fn rd16(p: *const u8) -> u16 {
    // SAFETY: caller guarantees 2 readable bytes at `p`; unaligned read.
    unsafe { (p as *const u16).read_unaligned() }
}

#[inline(always)]
pub(super) unsafe fn rd32(p: *const u8) -> u32 {
    // SAFETY: caller guarantees 4 readable bytes at `p`; unaligned read.
    unsafe { (p as *const u32).read_unaligned() }
}

#[inline(always)]
pub(super) unsafe fn f16(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes at `p` (caller); F16C present (entry-point features).
    // A broadcast (not `movd`/`pinsrw` into a live register) avoids a false dependency on
    // whatever register the compiler would merge into, which serialized the block loops.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(rd16(p) as i16))) }
}

#[inline(always)]
pub(super) unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: 32 readable bytes at `p` (caller); unaligned load.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

#[inline(always)]
pub(super) unsafe fn load128(p: *const u8) -> __m128i {
    // SAFETY: 16 readable bytes at `p` (caller); unaligned load.
    unsafe { _mm_loadu_si128(p as *const __m128i) }
}

#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    unsafe {
        let mut r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
        r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }
}

/// Σ pairs of u8 × i8 products → 8 × i32 (u ≤ 127 or the pair sums stay below 2^15).
#[inline(always)]
pub(super) unsafe fn mul_sum_us8<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
    unsafe {
        if VNNI {
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
        } else {
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
        }
    }
}

/// 32 nibbles → 32 bytes: low nibbles of the 16 bytes first, then the high nibbles.
#[inline(always)]
pub(super) unsafe fn nibbles32(p: *const u8) -> __m256i {
    unsafe {
        // Both lanes load the 16 bytes (a broadcast load); the upper lane shifts by 4.
        let t = _mm256_broadcastsi128_si256(load128(p));
        let b = _mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0));
        _mm256_and_si256(b, _mm256_set1_epi8(0xF))
    }
}

/// 32 bits → 32 bytes of 0xFF (bit set) or 0x00; byte `j` is bit `j`.
#[inline(always)]
pub(super) unsafe fn bits32(x: u32) -> __m256i {
    unsafe {
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0x0000000000000000,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }
}

/// How far ahead of the current block the weight stream is prefetched, in bytes.
pub(super) const PREFETCH: usize = 2048;

/// ggml's reduction of a 4-lane accumulator: (0+2) + (1+3).
#[inline(always)]
pub(super) unsafe fn hsum_ps128(r: __m128) -> f32 {
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// Sum of the four i32 lanes (exact).
#[inline(always)]
pub(super) unsafe fn hsum_epi32_128(v: __m128i) -> i32 {
    let v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b01_00_11_10));
    let v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0b10_11_00_01));
    _mm_cvtsi128_si32(v)
}
