//! Q8_K activations with AVX-512: ggml's reference quantizer (`quantize_row_q8_K_ref`, which
//! [`super::super::blocks`] emulates in scalar code) sixteen values at a time, the same bits.
//! Every K-quant product of a prompt quantizes its activations first: in scalar code that was
//! 3 % of a 7B's prompt.

use std::arch::x86_64::*;

/// One super-block of 256 values into its 292 bytes: `d` (f32), 256 signed bytes, 16 sums of
/// 16 (i16): `scalar`'s operations value for value (`nearest_int` by the 1.5·2^23 trick).
///
/// # Safety
/// The CPU has AVX-512 F/BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn quantize_block_q8_k(x: &[f32], b: &mut [u8]) {
    assert!(x.len() >= 256 && b.len() >= 292);
    // SAFETY: 256 floats read and 292 bytes written, checked above; AVX-512 F/BW.
    unsafe {
        let xs: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(x.as_ptr().add(16 * i)));
        // `max(|v|, m)` keeps m where v is NaN: NaNs skipped, as the scalar loop skips them.
        let amax = _mm512_reduce_max_ps(xs.iter().fold(_mm512_setzero_ps(), |m, &v| {
            _mm512_max_ps(_mm512_abs_ps(v), m)
        }));
        if amax == 0.0 {
            b[..292].fill(0);
            return;
        }
        // The first value of that magnitude, with its sign.
        let mut max = 0.0;
        for (i, &v) in xs.iter().enumerate() {
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(v), _mm512_set1_ps(amax));
            if hit != 0 {
                max = x[16 * i + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0f32 / max;
        let (scale, magic) = (_mm512_set1_ps(iscale), _mm512_set1_ps(12_582_912.0));
        let (low, half) = (
            _mm512_set1_epi32(0x007f_ffff),
            _mm512_set1_epi32(0x0040_0000),
        );
        for (i, &v) in xs.iter().enumerate() {
            let t = _mm512_castps_si512(_mm512_add_ps(_mm512_mul_ps(scale, v), magic));
            let q = _mm512_sub_epi32(_mm512_and_si512(t, low), half);
            // −127 to 127 (NaN: what the trick makes of it), so a byte holds it exactly.
            let q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
            _mm_storeu_si128(
                b.as_mut_ptr().add(4 + 16 * i) as *mut __m128i,
                _mm512_cvtepi32_epi8(q),
            );
            let sum = _mm512_reduce_add_epi32(q) as i16;
            b[260 + 2 * i..262 + 2 * i].copy_from_slice(&sum.to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
