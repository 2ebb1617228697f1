//! The C library's `expf`, four lanes at a time, to the bit.
//!
//! The one-query attention path computes one `expf` per key and head with the C library, as
//! llama.cpp's flash-attention decode path does; a call per head and key was 6 % of a
//! speculative run's time. glibc (2.27 and later) computes `expf` in double precision from a
//! table of 2^(i/32) and a cubic, and its x86-64 build for CPUs with FMA (`__expf_fma`, which
//! the library picks on every CPU nucleus runs its SIMD paths on) contracts five of its steps into
//! fused multiply-adds. [`expf_libm_in_place`] does the same operations on four lanes, with the
//! same table and coefficients (the values of `__exp2f_data` in the library), so it returns the
//! library's bits; lanes outside the main path's range (|x| ≥ 88, infinities, NaN) are handed to
//! the library itself. `expf_equals_the_c_librarys` checks it against the library on a sample
//! of every float, and `expf_equals_the_c_librarys_everywhere` (ignored: about a minute) on
//! all of them.

/// 2^(i/32) as f64 bits, less `i << 47` (`__exp2f_data.tab`).
const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// 32 / ln 2 (`invln2_scaled`).
const INV_LN2_N: u64 = 0x40471547652b82fe;
/// 1.5 · 2^52: adding it rounds to an integer, ties to even (`shift`).
const SHIFT: u64 = 0x4338000000000000;
/// The cubic's coefficients, scaled (`poly_scaled`).
const C0: u64 = 0x3ebc6af84b912394;
const C1: u64 = 0x3f2ebfce50fac4f3;
const C2: u64 = 0x3f962e42ff0c52d6;

/// Whether `x` takes the library's main path (|x| < 88, not NaN), which the lanes compute.
fn main_path(x: f32) -> bool {
    (x.to_bits() >> 20) & 0x7ff <= 0x42a
}

/// The main path, one value, in the library's order (each `mul_add` one rounding, as the
/// library's FMAs): what the lanes compute, for the tests.
#[cfg(test)]
fn expf_main_path(x: f32) -> f32 {
    let (inv, shift) = (f64::from_bits(INV_LN2_N), f64::from_bits(SHIFT));
    let xd = x as f64;
    let kd_shifted = inv.mul_add(xd, shift);
    let ki = kd_shifted.to_bits();
    let kd = kd_shifted - shift;
    let r = inv.mul_add(xd, -kd);
    let s = f64::from_bits(TABLE[(ki & 31) as usize].wrapping_add(ki << 47));
    let z = r.mul_add(f64::from_bits(C0), f64::from_bits(C1));
    let r2 = r * r;
    let y = r.mul_add(f64::from_bits(C2), 1.0);
    (z.mul_add(r2, y) * s) as f32
}

/// `x[i] = expf(x[i])`, with the C library's bits.
pub fn expf_libm_in_place(x: &mut [f32]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_level() != crate::quant::SimdLevel::Scalar {
        done = x.len() / 4 * 4;
        // SAFETY: every non-scalar dispatch level has AVX2 and FMA; `done` is a multiple of 4
        // within `x`.
        unsafe { x86::expf_lanes(&mut x[..done]) };
    }
    for v in &mut x[done..] {
        *v = v.exp();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::*;

    /// # Safety
    /// AVX2 and FMA; `x.len()` a multiple of 4.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn expf_lanes(x: &mut [f32]) {
        let (inv, shift) = (
            _mm256_set1_pd(f64::from_bits(INV_LN2_N)),
            _mm256_set1_pd(f64::from_bits(SHIFT)),
        );
        let c = [C0, C1, C2].map(|b| _mm256_set1_pd(f64::from_bits(b)));
        let (abs, limit) = (_mm_set1_epi32(0x7ff0_0000), _mm_set1_epi32(0x42a0_0000));
        for v in x.chunks_exact_mut(4) {
            // SAFETY: four floats in, four out; the gather's indices are below 32.
            unsafe {
                let xs = _mm_loadu_ps(v.as_ptr());
                // Lanes off the main path: (bits >> 20) & 0x7ff above 0x42a.
                let top = _mm_and_si128(_mm_castps_si128(xs), abs);
                let off = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(top, limit)));
                let lanes: [f32; 4] = std::mem::transmute(xs);
                let xd = _mm256_cvtps_pd(xs);
                let kd_shifted = _mm256_fmadd_pd(inv, xd, shift);
                let ki = _mm256_castpd_si256(kd_shifted);
                let kd = _mm256_sub_pd(kd_shifted, shift);
                let r = _mm256_fmsub_pd(inv, xd, kd);
                let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
                let tab = _mm256_i64gather_epi64::<8>(TABLE.as_ptr() as *const i64, idx);
                let s = _mm256_castsi256_pd(_mm256_add_epi64(tab, _mm256_slli_epi64::<47>(ki)));
                let z = _mm256_fmadd_pd(r, c[0], c[1]);
                let r2 = _mm256_mul_pd(r, r);
                let y = _mm256_fmadd_pd(r, c[2], _mm256_set1_pd(1.0));
                let y = _mm256_mul_pd(_mm256_fmadd_pd(z, r2, y), s);
                _mm_storeu_ps(v.as_mut_ptr(), _mm256_cvtpd_ps(y));
                if off != 0 {
                    for (out, &x) in v.iter_mut().zip(&lanes) {
                        if !main_path(x) {
                            *out = x.exp();
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the C library's `expf` here is the one these lanes follow: glibc's FMA build
    /// (an x86-64 CPU with FMA, glibc 2.27 or later). Elsewhere the tests say so and pass.
    fn library_is_glibcs_fma_build() -> bool {
        #[cfg(target_arch = "x86_64")]
        let fma = std::arch::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let fma = false;
        fma && [-1.5f32, -0.3, -20.0, 3.7]
            .iter()
            .all(|&x| expf_main_path(x).to_bits() == x.exp().to_bits())
    }

    fn check(bits: impl Iterator<Item = u32>) {
        let xs: Vec<f32> = bits.map(f32::from_bits).collect();
        let mut got = xs.clone();
        expf_libm_in_place(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = x.exp();
            assert!(
                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                "expf({x:e} = {:#x}): {g:e} against the library's {want:e}",
                x.to_bits()
            );
            if main_path(x) {
                assert_eq!(
                    expf_main_path(x).to_bits(),
                    want.to_bits(),
                    "scalar form, {x:e}"
                );
            }
        }
    }

    /// A sample of every float (every 4,099th bit pattern, and the edges of the main path).
    #[test]
    fn expf_equals_the_c_librarys() {
        if !library_is_glibcs_fma_build() {
            eprintln!("skipped: the C library's expf is not glibc's FMA build here");
            return;
        }
        check((0..=u32::MAX).step_by(4099));
        let edges = [
            88.0f32, -88.0, 87.99999, -87.99999, -103.5, 0.0, -0.0, 1e-30, -1e-30,
        ];
        check(edges.iter().map(|x| x.to_bits()));
        check(
            [f32::INFINITY, f32::NEG_INFINITY, f32::NAN]
                .iter()
                .map(|x| x.to_bits()),
        );
        // Every length, so that the lanes and the scalar rest both run.
        for n in 0..9 {
            check((0..n).map(|i| (-0.37f32 * i as f32).to_bits()));
        }
    }

    /// Every float (about a minute): `cargo test --release -p nucleus --lib expf_libm -- --ignored`.
    #[test]
    #[ignore]
    fn expf_equals_the_c_librarys_everywhere() {
        if !library_is_glibcs_fma_build() {
            eprintln!("skipped: the C library's expf is not glibc's FMA build here");
            return;
        }
        for hi in 0..=u16::MAX as u32 {
            check((0..=u16::MAX as u32).map(|lo| hi << 16 | lo));
        }
    }
}
