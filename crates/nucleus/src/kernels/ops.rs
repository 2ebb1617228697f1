//! Element-wise and row-wise operations of the forward pass: activations, e^x, softmax's sums
//! (normalisation: `norm.rs`, re-exported here; RoPE: [`super::rope`]). They are small
//! next to the matrix products; they are written to be obviously right and to let the
//! compiler vectorise them.

pub use super::norm::{rmsnorm, rmsnorm_chunks, rmsnorm_chunks_in, rmsnorm_rows, rmsnorm_rows_in};

/// gate = silu(gate) · up, with silu(x) = x / (1 + e^-x) computed as ggml's AVX-512 build
/// computes it (`ggml_vec_swiglu_f32`): groups of 16 through [`expf_ggml`], the rest (n mod 16)
/// through the C library's `expf`. The reference outputs come from that build, and the FFN
/// input is quantized to 8 bits right after this, where one ulp can flip an integer; so every
/// CPU computes these exact bits.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let n16 = gate.len() / 16 * 16;
    #[cfg(target_arch = "x86_64")]
    if n16 >= WIDE_ELEMENTS && crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512 {
        // SAFETY: AVX-512F is present; the two slices have n16 elements each.
        unsafe { super::ops_avx512::swiglu(&mut gate[..n16], &up[..n16]) };
    } else if crate::quant::simd_level() != crate::quant::SimdLevel::Scalar {
        // SAFETY: AVX2 and FMA are present (every non-scalar dispatch level has them); the two
        // slices have n16 elements each.
        unsafe { x86::swiglu(&mut gate[..n16], &up[..n16]) };
    } else {
        swiglu_scalar(&mut gate[..n16], &up[..n16]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    swiglu_scalar(&mut gate[..n16], &up[..n16]);
    for (g, &u) in gate[n16..].iter_mut().zip(&up[n16..]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Elements from which SwiGLU takes 512-bit vectors (a prompt's; a token's stays on 256-bit
/// ones: its few 512-bit multiplies and divisions between the 256-bit products of `--exact`
/// cost its Q8_0 decode 4 %, `nucleus bench FILE --exact -p 16 -g 64`, where they save nothing).
const WIDE_ELEMENTS: usize = 1 << 16;

/// Elements from which the `*_in` operations share the work among the pool's threads (a
/// prompt's; a token's is too small to pay for a pass of the pool).
const PARALLEL_ELEMENTS: usize = 1 << 15;

/// `f(a_run, b_run)` over runs of whole items of `item` elements of `a` (and the same elements
/// of `b`, or an empty slice when `b` is empty), the runs shared among `pool`'s threads when
/// there are many elements, else one call over everything. Each item is computed as in one
/// call when `f` treats items alone.
pub(super) fn in_runs(
    pool: &super::pool::ThreadPool,
    item: usize,
    a: &mut [f32],
    b: &[f32],
    f: impl Fn(&mut [f32], &[f32]) + Sync,
) {
    assert!(b.is_empty() || b.len() == a.len());
    if pool.n_threads() == 1 || a.len() < PARALLEL_ELEMENTS || item == 0 {
        return f(a, b);
    }
    // Whole items on the pool; a tail of fewer than `item` elements after them, in a call of
    // its own (as one call over everything treats it: alone, after whole items).
    let items = a.len() / item;
    let (head, rest) = a.split_at_mut(items * item);
    let (b_head, b_rest) = b.split_at(if b.is_empty() { 0 } else { items * item });
    pool.for_runs(items, (head, item), (b_head, item), &f);
    if !rest.is_empty() {
        f(rest, b_rest);
    }
}

/// `act(gate, up)` ([`swiglu`] or [`geglu`]) with the elements shared among `pool`'s threads
/// when there are many. Each thread takes a run of whole 16-element chunks and the tail
/// (n mod 16) is computed alone, so every element takes the path it takes in one call: the
/// same bits.
pub fn gated_in(
    pool: &super::pool::ThreadPool,
    act: fn(&mut [f32], &[f32]),
    gate: &mut [f32],
    up: &[f32],
) {
    assert_eq!(gate.len(), up.len());
    in_runs(pool, 16, gate, up, act)
}

fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + expf_ggml(0.0 - *g)) * u;
    }
}

/// e^x as ggml's AVX-512 `ggml_v_expf` computes it (ARM's optimized-routines polynomial:
/// n = round(x·log2 e), b = x − n·ln 2 in two parts, e^b ≈ 1 + c1·b + … rounded near 1, then
/// scaled by 2^n exactly as `_mm512_scalef_ps` does; |n| > 192 gives 0 or ∞).
pub fn expf_ggml(x: f32) -> f32 {
    let (n, j) = expf_ggml_parts(x);
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scalef(j, n)
}

/// `x[i] = expf_ggml(x[i])` for a slice, with the SIMD path where the CPU has one.
pub fn expf_ggml_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512 {
        // SAFETY: AVX-512F is present; the tail (under 16) on eight lanes, AVX2 and FMA.
        unsafe {
            let n16 = super::ops_avx512::expf_in_place(x);
            return x86::expf_in_place(&mut x[n16..]);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_level() != crate::quant::SimdLevel::Scalar {
        // SAFETY: every non-scalar dispatch level has AVX2 and FMA.
        return unsafe { x86::expf_in_place(x) };
    }
    for v in x {
        *v = expf_ggml(*v);
    }
}

pub(super) const EXP_SHIFT: f32 = 12_582_912.0; // 0x1.8p23: adding it rounds to an integer
pub(super) const LOG2E: u32 = 0x3fb8_aa3b;
pub(super) const LN2_HI: u32 = 0x3f31_7200;
pub(super) const LN2_LO: u32 = 0x35bf_be8e;
pub(super) const EXP_C: [u32; 5] = [
    0x3f7f_fff6,
    0x3eff_fedb,
    0x3e2a_af33,
    0x3d2b_9f17,
    0x3c07_2010,
];

/// (n, j) with e^x ≈ j·2^n, every operation as in ggml (fused where it uses FMA).
#[inline(always)]
fn expf_ggml_parts(x: f32) -> (f32, f32) {
    let c = EXP_C.map(f32::from_bits);
    let z = x.mul_add(f32::from_bits(LOG2E), EXP_SHIFT);
    let n = z - EXP_SHIFT;
    let b = (-n).mul_add(
        f32::from_bits(LN2_LO),
        (-n).mul_add(f32::from_bits(LN2_HI), x),
    );
    let u = b * b;
    let j = c[4]
        .mul_add(b, c[3])
        .mul_add(u, c[2].mul_add(b, c[1]))
        .mul_add(u, c[0].mul_add(b, 1.0));
    (n, j)
}

/// j·2^n for an integral n in [-192, 192], rounded once (as `_mm512_scalef_ps`): a product
/// with a power of two that is itself a normal float is exact or rounds once.
fn scalef(j: f32, n: f32) -> f32 {
    let k = n as i32;
    let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    if (-126..=127).contains(&k) {
        j * pow2(k)
    } else if k < -126 {
        j * pow2(k + 100) * pow2(-100)
    } else {
        j * pow2(k - 100) * pow2(100)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::geglu_scalar`]'s bits, eight at a time: the inputs rounded to f16 by F16C (to
    /// nearest, ties to even, as `half` rounds), the table read lane by lane, its f16 results
    /// widened and multiplied by `up`; x·up at and above 10, 0 at and below −10.
    ///
    /// # Safety
    /// AVX2, FMA and F16C; `gate` and `up` of one length, a multiple of 8; `table` of 65,536
    /// entries.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn geglu(gate: &mut [f32], up: &[f32], table: &[half::f16]) {
        debug_assert!(
            gate.len().is_multiple_of(8) && up.len() == gate.len() && table.len() == 1 << 16
        );
        let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
        for (g, u) in gate.chunks_exact_mut(8).zip(up.chunks_exact(8)) {
            // SAFETY: 8 floats each; every u16 index is inside the table.
            unsafe {
                let x = _mm256_loadu_ps(g.as_ptr());
                let u = _mm256_loadu_ps(u.as_ptr());
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                let mut idx = [0u16; 8];
                _mm_storeu_si128(idx.as_mut_ptr() as *mut __m128i, h);
                let vals = idx.map(|i| table.get_unchecked(i as usize).to_bits());
                let gl = _mm256_cvtph_ps(_mm_loadu_si128(vals.as_ptr() as *const __m128i));
                let mid = _mm256_mul_ps(gl, u);
                let big = _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi);
                let small = _mm256_cmp_ps::<_CMP_LE_OQ>(x, lo);
                let r = _mm256_blendv_ps(mid, _mm256_mul_ps(x, u), big);
                _mm256_storeu_ps(g.as_mut_ptr(), _mm256_andnot_ps(small, r));
            }
        }
    }

    /// [`super::expf_ggml`] on eight lanes (the same operations per lane).
    #[inline(always)]
    unsafe fn expf8(x: __m256) -> __m256 {
        let c = super::EXP_C.map(|b| _mm256_set1_ps(f32::from_bits(b)));
        let shift = _mm256_set1_ps(super::EXP_SHIFT);
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(super::LOG2E)), shift);
        let n = _mm256_sub_ps(z, shift);
        let b = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(f32::from_bits(super::LN2_LO)),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(super::LN2_HI)), x),
        );
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c[4], b, c[3]),
                u,
                _mm256_fmadd_ps(c[2], b, c[1]),
            ),
            u,
            _mm256_fmadd_ps(c[0], b, _mm256_set1_ps(1.0)),
        );
        let abs_n = _mm256_and_ps(n, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
        // |n| > 192: 0 or ∞. 126 < |n| <= 192 (x beyond about ±87, common in the FFNs of
        // random-weight files): 2^n is not a normal float, and `scalef` multiplies by
        // 2^(k ∓ 100), then by 2^±100; elsewhere the second factor is 1, which changes nothing.
        let huge = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        let k_exact = _mm256_cvtps_epi32(n);
        let mut k = k_exact;
        // As `expf16`: the lanes whose j·2^k lies below the normal floats (j's exponent plus k
        // at most 0) take `subnormal_scale8`'s integer rounding, the same bits, where the
        // multiplies rounding into a subnormal went through microcode (a softmax of scores
        // far below their maximum: 4.2 ns a value against 0.6); the multiplies see 1·2^0
        // there and in the lanes the last blend replaces.
        let (mut j_normal, mut tiny, mut j_exp) = (j, _mm256_setzero_si256(), k);
        let low = _mm256_cmp_ps::<_CMP_LT_OQ>(n, _mm256_set1_ps(-125.0));
        // (Only low lanes can round into a subnormal: the huge ones among them get k = 0.)
        if _mm256_movemask_ps(low) != 0 {
            j_exp = _mm256_srli_epi32::<23>(_mm256_castps_si256(j));
            let sum = _mm256_add_epi32(j_exp, k);
            tiny = _mm256_andnot_si256(
                _mm256_castps_si256(huge),
                _mm256_and_si256(
                    _mm256_castps_si256(low),
                    _mm256_cmpgt_epi32(_mm256_set1_epi32(1), sum),
                ),
            );
            let zeroed = _mm256_or_si256(tiny, _mm256_castps_si256(huge));
            k = _mm256_andnot_si256(zeroed, k);
            j_normal = _mm256_blendv_ps(j, _mm256_set1_ps(1.0), _mm256_castsi256_ps(tiny));
        }
        let above = _mm256_cmpgt_epi32(k, _mm256_set1_epi32(127));
        let below = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), k);
        let shift = _mm256_or_si256(
            _mm256_and_si256(above, _mm256_set1_epi32(-100)),
            _mm256_and_si256(below, _mm256_set1_epi32(100)),
        );
        let pow2 = |e: __m256i| {
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                e,
                _mm256_set1_epi32(127),
            )))
        };
        let scaled = _mm256_mul_ps(j_normal, pow2(_mm256_add_epi32(k, shift)));
        let mut e = _mm256_mul_ps(
            scaled,
            pow2(_mm256_sub_epi32(_mm256_setzero_si256(), shift)),
        );
        if _mm256_testz_si256(tiny, tiny) == 0 {
            let sub = subnormal_scale8(j, k_exact, j_exp);
            e = _mm256_blendv_ps(e, sub, _mm256_castsi256_ps(tiny));
        }
        let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(n, _mm256_setzero_ps());
        let limit = _mm256_and_ps(positive, _mm256_set1_ps(f32::INFINITY));
        _mm256_blendv_ps(e, limit, huge)
    }

    /// `j·2^k` rounded to nearest even where it lies below the normal floats, by integer
    /// arithmetic: `expf16`'s `subnormal_scale` on eight lanes (`j` positive and normal,
    /// `j_exp` its biased exponent, `j_exp + k` at most 0; the other lanes' results unused).
    #[inline(always)]
    unsafe fn subnormal_scale8(j: __m256, k: __m256i, j_exp: __m256i) -> __m256 {
        let significand = _mm256_or_si256(
            _mm256_and_si256(_mm256_castps_si256(j), _mm256_set1_epi32(0x007F_FFFF)),
            _mm256_set1_epi32(0x0080_0000),
        );
        // 1 to 31 places (past 25 every bit is shifted out and the result is 0).
        let places = _mm256_min_epi32(
            _mm256_max_epi32(
                _mm256_sub_epi32(_mm256_sub_epi32(_mm256_set1_epi32(1), j_exp), k),
                _mm256_set1_epi32(1),
            ),
            _mm256_set1_epi32(31),
        );
        let q = _mm256_srlv_epi32(significand, places);
        let rest = _mm256_sub_epi32(significand, _mm256_sllv_epi32(q, places));
        let half = _mm256_sllv_epi32(
            _mm256_set1_epi32(1),
            _mm256_sub_epi32(places, _mm256_set1_epi32(1)),
        );
        let odd = _mm256_and_si256(q, _mm256_set1_epi32(1));
        // rest > half, or rest == half and q odd: add one (rest and half below 2^31).
        let tie_odd = _mm256_and_si256(
            _mm256_cmpeq_epi32(rest, half),
            _mm256_cmpeq_epi32(odd, _mm256_set1_epi32(1)),
        );
        let up = _mm256_or_si256(_mm256_cmpgt_epi32(rest, half), tie_odd);
        // `up` is −1 where the quotient rounds up.
        _mm256_castsi256_ps(_mm256_sub_epi32(q, up))
    }

    /// `x[i] = expf_ggml(x[i])`, eight at a time.
    ///
    /// # Safety
    /// Requires AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn expf_in_place(x: &mut [f32]) {
        let n8 = x.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= len; unaligned load and store.
            unsafe {
                let p = x.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, expf8(_mm256_loadu_ps(p)));
            }
        }
        for v in &mut x[n8..] {
            *v = super::expf_ggml(*v);
        }
    }

    /// `super::swiglu_scalar` eight lanes at a time (the same operations per lane).
    ///
    /// # Safety
    /// Requires AVX2 and FMA; `gate.len() == up.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
        let one = _mm256_set1_ps(1.0);
        let n8 = gate.len() / 8 * 8;
        let mut i = 0;
        while i < n8 {
            // SAFETY: i + 8 <= n8 <= len of both slices; unaligned loads and stores.
            let (pg, pu) = unsafe { (gate.as_mut_ptr().add(i), up.as_ptr().add(i)) };
            let g = unsafe { _mm256_loadu_ps(pg) };
            // SAFETY: AVX2 and FMA (this function's features).
            let e = unsafe { expf8(_mm256_sub_ps(_mm256_setzero_ps(), g)) };
            let silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
            // SAFETY: as for the loads above.
            unsafe { _mm256_storeu_ps(pg, _mm256_mul_ps(silu, _mm256_loadu_ps(pu))) };
            i += 8;
        }
        super::swiglu_scalar(&mut gate[n8..], &up[n8..]);
    }
}

/// GELU with the tanh approximation, in f32, rounded as ggml's `ggml_gelu_f32` is when GCC
/// contracts `1 + a·x·x` into one FMA.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (0.044715 * x).mul_add(x, 1.0)).tanh())
}

/// GELU as ggml computes it on the CPU: through a table indexed by the input rounded to f16,
/// holding f16 results (`GGML_GELU_FP16`); exact beyond ±10. Matching it keeps our FFN
/// activations identical to llama.cpp's.
fn gelu_table() -> &'static [half::f16] {
    static TABLE: std::sync::OnceLock<Vec<half::f16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| half::f16::from_f32(gelu(half::f16::from_bits(bits).to_f32())))
            .collect()
    })
}

/// gate = gelu(gate) * up
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    let table = gelu_table();
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_level() != crate::quant::SimdLevel::Scalar {
        done = gate.len() / 8 * 8;
        // SAFETY: every non-scalar dispatch level has AVX2, FMA and F16C; both slices have
        // `done` elements or more; the table has 65,536 entries, one per f16.
        unsafe { x86::geglu(&mut gate[..done], &up[..done], table) };
    }
    geglu_scalar(&mut gate[done..], &up[done..], table);
}

fn geglu_scalar(gate: &mut [f32], up: &[f32], table: &[half::f16]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[half::f16::from_f32(x).to_bits() as usize].to_f32() * u
        };
    }
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Numerically safe log(sum(exp(x))).
pub fn logsumexp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f64 = x.iter().map(|&v| ((v - max) as f64).exp()).sum();
    max + sum.ln() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The activations shared among threads give one call's bits, tail included.
    #[test]
    fn gated_activations_in_the_pool_have_one_calls_bits() {
        for threads in [2, 3] {
            let pool = super::super::pool::ThreadPool::new(threads);
            for n in [100, 4864 * 7, 4864 * 9 + 13, 65_537] {
                let gate: Vec<f32> = (0..n)
                    .map(|i| ((i * 37 % 2001) as f32 - 1000.0) * 0.011)
                    .collect();
                let up: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 * 0.3).collect();
                for act in [swiglu as fn(&mut [f32], &[f32]), geglu] {
                    let (mut one, mut pooled) = (gate.clone(), gate.clone());
                    act(&mut one, &up);
                    gated_in(&pool, act, &mut pooled, &up);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert!(
                        bits(&one) == bits(&pooled),
                        "{n} elements, {threads} threads"
                    );
                }
            }
        }
    }

    /// The SIMD GEGLU gives the scalar one's bits: around ±10, on f16 rounding ties, on
    /// subnormals, infinities and large values.
    #[test]
    fn geglu_simd_equals_scalar() {
        let mut xs: Vec<f32> = (0..4000).map(|i| (i as f32 - 2000.0) * 0.0071).collect();
        xs.extend([
            -10.0, 10.0, -10.000001, 9.999999, 1e-6, -1e-7, 6e-8, 65504.0, 65520.0, 1e9,
        ]);
        xs.extend([f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0]);
        // Halfway between two f16 values: ties go to even.
        xs.extend((0..64).map(|i| half::f16::from_bits(0x3C00 + i).to_f32() + 2f32.powi(-11)));
        while xs.len() % 8 != 3 {
            xs.push(0.37);
        }
        let up: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.3).collect();
        let mut want = xs.clone();
        geglu_scalar(&mut want, &up, gelu_table());
        let mut got = xs.clone();
        geglu(&mut got, &up);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "x = {} ({g} vs {w})", xs[i]);
        }
    }

    /// The SIMD SiLU gives the scalar emulation's bits, and `expf_ggml` is a faithful e^x
    /// (ggml documents its error as under 1.5 ulp) with its 0 / ∞ limits.
    #[test]
    fn swiglu_simd_equals_scalar_and_expf_is_accurate() {
        let xs: Vec<f32> = (0..4000)
            .map(|i| (i as f32 - 2000.0) * 0.0517)
            .chain([
                0.0, -0.0, 87.0, -87.0, 88.5, -88.5, 100.0, -100.0, 1e-30, 150.0, -150.0,
            ])
            // Where 2^n is not a normal float (|x| from about 87 to 133) and past it.
            .chain((0..320).flat_map(|i| {
                let x = 85.0 + i as f32 * 0.17;
                [x, -x]
            }))
            // Densely where e^x is a subnormal float (x from about −87.3 to −104), which the
            // sixteen-lane version rounds in integers.
            .chain((0..1500).map(|i| -86.5 - i as f32 * 0.0123))
            .collect();
        let n = xs.len() / 16 * 16;
        let up: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut simd = xs[..n].to_vec();
        swiglu(&mut simd, &up);
        let mut scalar = xs[..n].to_vec();
        swiglu_scalar(&mut scalar, &up);
        for i in 0..n {
            assert_eq!(simd[i].to_bits(), scalar[i].to_bits(), "x = {}", xs[i]);
        }
        // The sixteen-lane version (`swiglu` takes it from `WIDE_ELEMENTS` on), and the
        // eight-lane one.
        #[cfg(target_arch = "x86_64")]
        if crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512 {
            let mut sixteen = xs[..n].to_vec();
            // SAFETY: AVX-512F (checked); two slices of n elements.
            assert_eq!(
                unsafe { super::super::ops_avx512::swiglu(&mut sixteen, &up) },
                n
            );
            for i in 0..n {
                assert_eq!(sixteen[i].to_bits(), scalar[i].to_bits(), "x = {}", xs[i]);
            }
        }
        #[cfg(target_arch = "x86_64")]
        if crate::quant::simd_level() != crate::quant::SimdLevel::Scalar {
            let mut eight = xs[..n].to_vec();
            // SAFETY: AVX2 and FMA (every non-scalar level); two slices of n elements.
            unsafe { x86::swiglu(&mut eight, &up) };
            let mut exps = xs.clone();
            // SAFETY: as above.
            unsafe { x86::expf_in_place(&mut exps) };
            for i in 0..n {
                assert_eq!(eight[i].to_bits(), scalar[i].to_bits(), "x = {}", xs[i]);
                assert_eq!(
                    exps[i].to_bits(),
                    expf_ggml(xs[i]).to_bits(),
                    "x = {}",
                    xs[i]
                );
            }
        }
        for &x in &xs {
            let (got, want) = (expf_ggml(x) as f64, (x as f64).exp());
            if want > 1e-37 && want < 1e38 {
                assert!(
                    (got - want).abs() <= want * 3e-7,
                    "exp({x}) = {got}, want {want}"
                );
            }
        }
        assert_eq!(expf_ggml(-200.0), 0.0);
        assert_eq!(expf_ggml(200.0), f32::INFINITY);
        // The slice version (SIMD where the CPU has it), limits and infinities included.
        let mut all: Vec<f32> = xs.clone();
        all.extend([
            f32::NEG_INFINITY,
            f32::INFINITY,
            -130.0,
            130.0,
            -95.0,
            95.0,
            -200.0,
        ]);
        let mut got = all.clone();
        expf_ggml_in_place(&mut got);
        for (x, g) in all.iter().zip(&got) {
            assert_eq!(g.to_bits(), expf_ggml(*x).to_bits(), "x = {x}");
        }
    }

    /// How long ggml's e^x takes on a slice, by the range of its inputs (`cargo test --release
    /// -p nucleus --lib expf_speed -- --ignored --nocapture`): a softmax's scores far below
    /// their maximum give subnormal results.
    #[test]
    #[ignore = "a timing, not a check"]
    fn expf_speed() {
        for lo in [-10.0f32, -200.0, -1000.0] {
            let orig: Vec<f32> = (0..64).map(|i| lo * (i as f32 * 0.61803 % 1.0)).collect();
            let (mut v, reps) = (orig.clone(), 2_000_000);
            let t = std::time::Instant::now();
            for _ in 0..reps {
                v.copy_from_slice(&orig);
                expf_ggml_in_place(&mut v);
            }
            let ns = t.elapsed().as_secs_f64() * 1e9 / (reps * v.len()) as f64;
            eprintln!("x in [{lo}, 0]: {ns:.3} ns a value");
        }
    }

    #[test]
    fn activations_match_formulas() {
        let mut g = [1.0f32, -1.0];
        swiglu(&mut g, &[2.0, 3.0]);
        assert!((g[0] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
        let mut g = [1.0f32, 20.0, -20.0];
        geglu(&mut g, &[1.0, 2.0, 3.0]);
        // gelu(1) = 0.841192 (tanh form), rounded to f16 as ggml's table holds it.
        assert_eq!(g[0], half::f16::from_f32(0.841192).to_f32());
        assert_eq!(g[1], 40.0);
        assert_eq!(g[2], 0.0);
        assert!((gelu(1.0) - 0.841192).abs() < 1e-5);
        assert!((logsumexp(&[0.0, 0.0]) - 2f32.ln()).abs() < 1e-6);
    }
}
