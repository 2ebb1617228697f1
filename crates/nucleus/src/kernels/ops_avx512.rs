//! [`super::ops`]' SiLU and e^x sixteen lanes at a time, for CPUs with AVX-512: the same
//! operations per lane as the eight-lane versions (and the scalar emulation of ggml's
//! `ggml_v_expf`), so the same bits; half the instructions. A 7B's prompt spent 4 % of its
//! time in the eight-lane SwiGLU (its division and e^x) and 3 % in the softmax's e^x.

use std::arch::x86_64::*;

/// [`super::expf_ggml`] on sixteen lanes: `expf8`'s operations, lane for lane.
#[inline(always)]
unsafe fn expf16(x: __m512) -> __m512 {
    let c = super::ops::EXP_C.map(|b| _mm512_set1_ps(f32::from_bits(b)));
    let shift = _mm512_set1_ps(super::ops::EXP_SHIFT);
    let z = _mm512_fmadd_ps(x, _mm512_set1_ps(f32::from_bits(super::ops::LOG2E)), shift);
    let n = _mm512_sub_ps(z, shift);
    let b = _mm512_fnmadd_ps(
        n,
        _mm512_set1_ps(f32::from_bits(super::ops::LN2_LO)),
        _mm512_fnmadd_ps(n, _mm512_set1_ps(f32::from_bits(super::ops::LN2_HI)), x),
    );
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(c[4], b, c[3]),
            u,
            _mm512_fmadd_ps(c[2], b, c[1]),
        ),
        u,
        _mm512_fmadd_ps(c[0], b, _mm512_set1_ps(1.0)),
    );
    let abs_n = _mm512_abs_ps(n);
    // As `expf8`: |n| > 192 gives 0 or ∞; 126 < |n| <= 192 scales by 2^(k ∓ 100), then 2^±100.
    let huge = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(abs_n, _mm512_set1_ps(192.0));
    let k_exact = _mm512_cvtps_epi32(n);
    let mut k = k_exact;
    // Lanes whose result j·2^k may lie below the normal floats (n < −125; j < 2): if their
    // multiplies rounded into a subnormal, the CPU would finish them in microcode (a softmax of
    // scores 90 below their maximum ran at 2.9 ns a value against 0.29). The lanes where it
    // does (j's exponent plus k at most 0) take [`subnormal_scale`]'s integer rounding, the
    // same bits; the multiplies see 1·2^0 there and in the lanes the last blend replaces.
    let (mut j_normal, mut tiny, mut j_exp) = (j, 0, _mm512_setzero_si512());
    let low = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(n, _mm512_set1_ps(-125.0));
    // (Only low lanes can round into a subnormal: the huge ones among them get k = 0.)
    if low != 0 {
        j_exp = _mm512_srli_epi32::<23>(_mm512_castps_si512(j));
        let sum = _mm512_add_epi32(j_exp, k);
        tiny = _mm512_mask_cmpgt_epi32_mask(low & !huge, _mm512_set1_epi32(1), sum);
        k = _mm512_mask_mov_epi32(k, tiny | huge, _mm512_setzero_si512());
        j_normal = _mm512_mask_mov_ps(j, tiny, _mm512_set1_ps(1.0));
    }
    let above = _mm512_cmpgt_epi32_mask(k, _mm512_set1_epi32(127));
    let below = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(-126), k);
    let shift = _mm512_mask_mov_epi32(
        _mm512_maskz_mov_epi32(above, _mm512_set1_epi32(-100)),
        below,
        _mm512_set1_epi32(100),
    );
    let pow2 = |e: __m512i| {
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
            e,
            _mm512_set1_epi32(127),
        )))
    };
    let scaled = _mm512_mul_ps(j_normal, pow2(_mm512_add_epi32(k, shift)));
    let mut e = _mm512_mul_ps(
        scaled,
        pow2(_mm512_sub_epi32(_mm512_setzero_si512(), shift)),
    );
    if tiny != 0 {
        e = _mm512_mask_mov_ps(e, tiny, subnormal_scale(j, k_exact, j_exp));
    }
    let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(n, _mm512_setzero_ps());
    let limit = _mm512_maskz_mov_ps(positive, _mm512_set1_ps(f32::INFINITY));
    _mm512_mask_blend_ps(huge, e, limit)
}

/// `j·2^k` rounded to nearest even, in the lanes where it lies below the normal floats (`j`
/// positive and normal, `j_exp` its biased exponent, `j_exp + k` at most 0), by integer
/// arithmetic: the significand shifted right by `1 − j_exp − k` places, rounded on the bits
/// shifted out; exactly the bits of the multiply's one rounding (a carry into bit 23 gives the
/// least normal float, as the multiply does).
#[inline(always)]
unsafe fn subnormal_scale(j: __m512, k: __m512i, j_exp: __m512i) -> __m512 {
    let significand = _mm512_or_si512(
        _mm512_and_si512(_mm512_castps_si512(j), _mm512_set1_epi32(0x007F_FFFF)),
        _mm512_set1_epi32(0x0080_0000),
    );
    // 1 to 31 places (past 25 every bit is shifted out and the result is 0).
    let places = _mm512_min_epi32(
        _mm512_max_epi32(
            _mm512_sub_epi32(_mm512_sub_epi32(_mm512_set1_epi32(1), j_exp), k),
            _mm512_set1_epi32(1),
        ),
        _mm512_set1_epi32(31),
    );
    let q = _mm512_srlv_epi32(significand, places);
    let rest = _mm512_sub_epi32(significand, _mm512_sllv_epi32(q, places));
    let half = _mm512_sllv_epi32(
        _mm512_set1_epi32(1),
        _mm512_sub_epi32(places, _mm512_set1_epi32(1)),
    );
    let odd = _mm512_test_epi32_mask(q, _mm512_set1_epi32(1));
    let up = _mm512_cmpgt_epi32_mask(rest, half) | (_mm512_cmpeq_epi32_mask(rest, half) & odd);
    _mm512_castsi512_ps(_mm512_mask_add_epi32(q, up, q, _mm512_set1_epi32(1)))
}

/// `x[i] = expf_ggml(x[i])` for the first `x.len() / 16 · 16` elements; returns how many.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn expf_in_place(x: &mut [f32]) -> usize {
    let n16 = x.len() / 16 * 16;
    for v in x[..n16].chunks_exact_mut(16) {
        // SAFETY: 16 floats; unaligned load and store.
        unsafe { _mm512_storeu_ps(v.as_mut_ptr(), expf16(_mm512_loadu_ps(v.as_ptr()))) };
    }
    n16
}

/// `gate = silu(gate)·up` for the first `gate.len() / 16 · 16` elements, as the eight-lane
/// `swiglu` computes each (`g / (1 + e^−g)·u`); returns how many.
///
/// # Safety
/// The CPU has AVX-512F; `gate.len() == up.len()`.
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn swiglu(gate: &mut [f32], up: &[f32]) -> usize {
    let n16 = gate.len().min(up.len()) / 16 * 16;
    let one = _mm512_set1_ps(1.0);
    for (g, u) in gate[..n16].chunks_exact_mut(16).zip(up.chunks_exact(16)) {
        // SAFETY: 16 floats each; unaligned loads and store.
        unsafe {
            let x = _mm512_loadu_ps(g.as_ptr());
            let e = expf16(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let silu = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(
                g.as_mut_ptr(),
                _mm512_mul_ps(silu, _mm512_loadu_ps(u.as_ptr())),
            );
        }
    }
    n16
}
