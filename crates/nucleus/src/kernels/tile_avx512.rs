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
