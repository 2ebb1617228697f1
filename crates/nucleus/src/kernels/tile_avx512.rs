//! [`super::tile`]'s scores of a pair of query chunks on 512-bit vectors: the same chains (one
//! per query and key, over the key's elements in order), so the same bits, twice as many
//! lanes a fused multiply-add. (The values' products ran slower on 512 bits:
//! `tile::tests::mad_rows_speed`.)

use std::arch::x86_64::*;

use super::tile::QUERY_LANES;

/// Keys a step: eight independent chains in each lane, enough to cover the latency of the
/// fused multiply-adds at two a cycle.
const KEYS: usize = 8;

/// [`super::tile::dot_keys_pair`] with the two chunks' sixteen queries as one vector's lanes,
/// eight keys a step (a key element broadcast once for sixteen queries); the keys past the
/// last multiple of eight go to the 256-bit kernel.
///
/// # Safety
/// AVX-512F, AVX2 and FMA; `qt0.len() == qt1.len() == dk * 8`, `keys.len() == out0.len() *
/// dk`, `out0.len() == out1.len()`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn dot_keys_pair(
    qt0: &[f32],
    qt1: &[f32],
    keys: &[f32],
    dk: usize,
    out0: &mut [[f32; QUERY_LANES]],
    out1: &mut [[f32; QUERY_LANES]],
) -> usize {
    let n8 = out0.len() / KEYS * KEYS;
    let (q0, q1, kp) = (qt0.as_ptr(), qt1.as_ptr(), keys.as_ptr());
    for j in (0..n8).step_by(KEYS) {
        let mut acc = [_mm512_setzero_ps(); KEYS];
        for d in 0..dk {
            // SAFETY: d < dk: row d of both chunks and element d of keys j..j + 8 are in
            // bounds (the caller's sizes).
            unsafe {
                let lo = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(
                    q0.add(d * QUERY_LANES),
                )));
                let hi = _mm256_castps_pd(_mm256_loadu_ps(q1.add(d * QUERY_LANES)));
                let x = _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, hi));
                for (k, a) in acc.iter_mut().enumerate() {
                    let kv = _mm512_set1_ps(*kp.add((j + k) * dk + d));
                    *a = _mm512_fmadd_ps(kv, x, *a);
                }
            }
        }
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: out0[j + k] and out1[j + k] hold 8 floats each.
            unsafe {
                _mm256_storeu_ps(out0[j + k].as_mut_ptr(), _mm512_castps512_ps256(*a));
                let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a));
                _mm256_storeu_ps(out1[j + k].as_mut_ptr(), _mm256_castpd_ps(hi));
            }
        }
    }
    n8
}

/// Key pairs a step of [`dot_key_pairs`]: eight independent chains in each lane.
const PAIRS: usize = 8;

/// [`super::tile::widen_f16_pairs`]: sixteen elements of each row a step, converted and
/// interleaved in registers.
///
/// # Safety
/// AVX-512F; every row `dk` long, `dst.len() >= rows.len().div_ceil(2) * 2 * dk`.
#[target_feature(enable = "avx512f,avx2,f16c")]
pub(super) unsafe fn widen_f16_pairs(dst: &mut [f32], rows: &[&[half::f16]], dk: usize) {
    let n16 = dk / 16 * 16;
    let lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (p, pair) in rows.chunks(2).enumerate() {
        let (a, b) = (pair[0], pair[pair.len() - 1]);
        let (ap, bp) = (a.as_ptr() as *const u16, b.as_ptr() as *const u16);
        let out = &mut dst[2 * dk * p..2 * dk * (p + 1)];
        let dp = out.as_mut_ptr();
        for d in (0..n16).step_by(16) {
            // SAFETY: d + 16 <= dk: sixteen halves of each row, 32 floats of `out` from 2d.
            unsafe {
                let x = _mm512_cvtph_ps(_mm256_loadu_si256(ap.add(d) as *const __m256i));
                let y = _mm512_cvtph_ps(_mm256_loadu_si256(bp.add(d) as *const __m256i));
                _mm512_storeu_ps(dp.add(2 * d), _mm512_permutex2var_ps(x, lo, y));
                _mm512_storeu_ps(dp.add(2 * d + 16), _mm512_permutex2var_ps(x, hi, y));
            }
        }
        for d in n16..dk {
            out[2 * d] = a[d].to_f32();
            out[2 * d + 1] = b[d].to_f32();
        }
    }
}

/// [`super::tile::dot_key_pairs`]: a pair's two elements `d` broadcast as one 64-bit load
/// against the queries with each lane doubled (query `l` in lanes `2l` and `2l + 1`), so that
/// one fused multiply-add serves sixteen chains, eight pairs a step; the pairs past the last
/// multiple of eight one at a time. Each lane is one key's chain for one query, in order, so
/// the bits of [`super::tile::dot_keys`].
///
/// # Safety
/// AVX-512F; `qt.len() == dk * 8`, `pairs.len() >= out.len().div_ceil(2) * 2 * dk`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn dot_key_pairs(
    qt: &[f32],
    pairs: &[f32],
    dk: usize,
    out: &mut [[f32; QUERY_LANES]],
) {
    let doubled = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let split = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    let np = out.len().div_ceil(2);
    let (qp, kp) = (qt.as_ptr(), pairs.as_ptr() as *const f64);
    let mut p = 0;
    while p < np {
        let step = if np - p >= PAIRS { PAIRS } else { 1 };
        let mut acc = [_mm512_setzero_ps(); PAIRS];
        for d in 0..dk {
            // SAFETY: d < dk: row d of `qt` and element pair d of pairs p..p + step are in
            // bounds (the caller's sizes).
            unsafe {
                let q = _mm512_castps256_ps512(_mm256_loadu_ps(qp.add(d * QUERY_LANES)));
                let q = _mm512_permutexvar_ps(doubled, q);
                for (k, a) in acc.iter_mut().enumerate().take(step) {
                    let kv = _mm512_castpd_ps(_mm512_set1_pd(*kp.add((p + k) * dk + d)));
                    *a = _mm512_fmadd_ps(kv, q, *a);
                }
            }
        }
        for (k, a) in acc.iter().enumerate().take(step) {
            let s = _mm512_permutexvar_ps(split, *a);
            let key = 2 * (p + k);
            // SAFETY: out[key] (and out[key + 1] where it exists) hold 8 floats each.
            unsafe {
                _mm256_storeu_ps(out[key].as_mut_ptr(), _mm512_castps512_ps256(s));
                if key + 1 < out.len() {
                    let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s));
                    _mm256_storeu_ps(out[key + 1].as_mut_ptr(), _mm256_castpd_ps(hi));
                }
            }
        }
        p += step;
    }
}
