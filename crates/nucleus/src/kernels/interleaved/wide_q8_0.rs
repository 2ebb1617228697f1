//! A prompt's Q8_0 products with AVX-512 VNNI: two groups read as stored side by side in the
//! lanes of 512-bit registers, rows `0..8` from the first and `8..16` from the second, so that
//! one `vpdpbusd` serves sixteen rows where the 256-bit kernel (`x86::tile_q8_stored`) serves
//! eight. AVX-512 has no `vpsignb` to move the weights' signs onto the activations, so the
//! weights are made unsigned in registers (w + 128, one `vpxord` a chunk for every token of the
//! call) and each token's block sum starts from −128·Σx ([`super::PackedActs`]'s
//! `neg_offsets128`): the same exact integer Σ w·x. Each lane then follows the 256-bit
//! kernel's chain for its row, `fma(ws·xs, isum, acc)` per block, so a row's outputs have the
//! same bits here, there and in the scalar kernel (`tests.rs`: the packed products against
//! the one-row kernels and each token alone).

use std::arch::x86_64::*;

use super::wide::{join, WIDE_TOKENS};
use super::Tile;

/// Bytes of a stored Q8_0 group's block: the eight rows' f16 scales, then their 256 values,
/// chunk `k` (32 bytes) holding values `4k..4k + 4` of each row.
const GROUP_BLOCK: usize = 272;
/// Bytes of a Q8_0 activation block: an f16 scale, then 32 signed values.
const ACT_BLOCK: usize = 34;

/// Groups `a` and `b` (stored, `t.blocks` blocks each) against `t.nx` tokens (at most
/// [`WIDE_TOKENS`]), sixteen outputs per token at `t.out` (the first group's eight, then the
/// second's).
///
/// # Safety
/// The tile's pointers are valid for what [`Tile`] says, with sixteen outputs per token and
/// its offsets the tokens' −128·Σx per block; the CPU has AVX-512 F/BW/VNNI, FMA and F16C.
pub(crate) unsafe fn q8_0_pair(a: &[u8], b: &[u8], t: &Tile) {
    let bytes = t.blocks * GROUP_BLOCK;
    assert!(a.len() >= bytes && b.len() >= bytes && (1..=WIDE_TOKENS).contains(&t.nx));
    assert!(!t.offsets.is_null() && !t.scales.is_null());
    let (a, b) = (a.as_ptr(), b.as_ptr());
    // SAFETY: the caller's contract; the groups' bytes checked above.
    unsafe {
        match t.nx {
            1 => q8_0_nx::<1>(a, b, t),
            2 => q8_0_nx::<2>(a, b, t),
            3 => q8_0_nx::<3>(a, b, t),
            4 => q8_0_nx::<4>(a, b, t),
            5 => q8_0_nx::<5>(a, b, t),
            6 => q8_0_nx::<6>(a, b, t),
            7 => q8_0_nx::<7>(a, b, t),
            _ => q8_0_nx::<8>(a, b, t),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q8_0_nx<const NX: usize>(a: *const u8, b: *const u8, t: &Tile) {
    let flip = _mm512_set1_epi8(-128);
    let mut acc = [_mm512_setzero_ps(); NX];
    // SAFETY (all reads below): block k < blocks of both groups (GROUP_BLOCK bytes each,
    // checked by the caller); token n < nx's activation block k (ACT_BLOCK bytes) in its row,
    // and its scale and offset k at t.scales / t.offsets (stride t.blocks); sixteen outputs
    // per token.
    unsafe {
        for k in 0..t.blocks {
            let (ga, gb) = (a.add(GROUP_BLOCK * k), b.add(GROUP_BLOCK * k));
            let scales = _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(ga as *const __m128i)),
                _mm_loadu_si128(gb as *const __m128i),
            );
            let ws = _mm512_cvtph_ps(scales);
            // The sixteen rows' values, w + 128 (unsigned).
            let w: [__m512i; 8] = std::array::from_fn(|c| {
                _mm512_xor_si512(join(ga.add(16 + 32 * c), gb.add(16 + 32 * c)), flip)
            });
            for (n, acc) in acc.iter_mut().enumerate() {
                let xb = t.x.add(n * t.x_stride + ACT_BLOCK * k + 2);
                let x =
                    |c: usize| _mm512_set1_epi32((xb.add(4 * c) as *const i32).read_unaligned());
                // Two chains of four (eight dependent ones would wait on each other), the
                // first starting from −128·Σx.
                let at = n * t.blocks + k;
                let mut p = _mm512_dpbusd_epi32(_mm512_set1_epi32(*t.offsets.add(at)), w[0], x(0));
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
