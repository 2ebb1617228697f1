//! The two products of llama.cpp's tiled flash attention (`simd_gemm` in ggml-cpu), with its
//! rounding: every output element is one chain of fused multiply-adds in order, which is the
//! same whatever the vector width, so the SIMD paths here compute the scalar paths' bits.
//!
//! - [`dot_keys`]: scores of up to 8 queries against a tile of keys, s = Σ_d k[d]·q[d] chained
//!   over d (the queries are the SIMD lanes);
//! - [`dot_keys_transposed`]: the same chains for one query, the keys as the SIMD lanes (a tile
//!   of keys stored transposed by [`widen_f16_transposed`]), for calls with few queries;
//! - [`mad_rows`]: acc[d] += Σ_j w[j]·row_j[d] chained over j (d is the SIMD lane).

use half::f16;

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::transpose8;

/// Queries per [`dot_keys`] call.
pub const QUERY_LANES: usize = 8;

/// `out[i] = f32(src[i])`.
pub fn widen_f16(dst: &mut [f32], src: &[f16]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the CPU has F16C, AVX2 and FMA (checked by `simd`); lengths are equal.
        return unsafe { x86::widen_f16(dst, src) };
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// Scores of the queries held transposed in `qt` (`dk` rows of [`QUERY_LANES`] floats: element
/// `d` of query `l` at `qt[d * 8 + l]`) against each key of `keys` (rows of `dk` floats):
/// `out[j][l] = fma(keys[j][dk-1], q_l[dk-1], … fma(keys[j][0], q_l[0], 0))`.
pub fn dot_keys(qt: &[f32], keys: &[f32], dk: usize, out: &mut [[f32; QUERY_LANES]]) {
    assert_eq!(qt.len(), dk * QUERY_LANES);
    assert_eq!(keys.len(), out.len() * dk);
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: as in `widen_f16`; the sizes are checked above.
        return unsafe { x86::dot_keys(qt, keys, dk, out) };
    }
    for (key, o) in keys.chunks_exact(dk).zip(out.iter_mut()) {
        *o = [0.0; QUERY_LANES];
        for (d, &k) in key.iter().enumerate() {
            for (l, s) in o.iter_mut().enumerate() {
                *s = k.mul_add(qt[d * QUERY_LANES + l], *s);
            }
        }
    }
}

/// Keys stored transposed by one [`widen_f16_transposed`] call.
pub const TRANSPOSE_KEYS: usize = 8;

/// `kt[d * stride + j0 + j] = f32(rows[j][d])` for the eight rows and every `d < dk`: a tile of
/// keys stored with the keys along each row, for [`dot_keys_transposed`].
pub fn widen_f16_transposed(
    kt: &mut [f32],
    stride: usize,
    j0: usize,
    rows: &[&[f16]; TRANSPOSE_KEYS],
    dk: usize,
) {
    assert!(j0 + TRANSPOSE_KEYS <= stride && rows.iter().all(|r| r.len() >= dk));
    assert!(dk == 0 || kt.len() >= (dk - 1) * stride + j0 + TRANSPOSE_KEYS);
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: as in `widen_f16`; the sizes are checked above.
        return unsafe { x86::widen_f16_transposed(kt, stride, j0, rows, dk) };
    }
    for (j, row) in rows.iter().enumerate() {
        for d in 0..dk {
            kt[d * stride + j0 + j] = row[d].to_f32();
        }
    }
}

/// One query's scores against keys stored transposed (`kt[d * stride + j]`: element `d` of key
/// `j`): `out[j] = fma(kt[(dk-1)·stride + j], q[dk-1], … fma(kt[j], q[0], 0))`, [`dot_keys`]'s
/// chain for that query and key (the same bits), with the keys as the SIMD lanes: the work of
/// one query, not of eight. Reads `kt` up to the next multiple of 8 keys past `out.len()`.
pub fn dot_keys_transposed(q: &[f32], kt: &[f32], stride: usize, out: &mut [f32]) {
    let dk = q.len();
    let n = out.len();
    assert!(n <= stride && stride.is_multiple_of(8));
    assert!(dk == 0 || kt.len() >= (dk - 1) * stride + n.div_ceil(8) * 8);
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: as in `widen_f16`; the sizes are checked above.
        return unsafe { x86::dot_keys_transposed(q, kt, stride, out) };
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = 0.0;
        for (d, &qd) in q.iter().enumerate() {
            *o = kt[d * stride + j].mul_add(qd, *o);
        }
    }
}

/// Whether [`dot_key_pairs`] runs on 512-bit vectors here (else its plain loops, slower than
/// [`dot_keys`]: a caller keeps the keys in rows then).
pub fn key_pairs_fast() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512;
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Keys' rows widened two by two, side by side: pair `p` (`2 · dk` floats at `dst[2·dk·p..]`)
/// holds `f32(rows[2p][d])` at `2d` and `f32(rows[2p + 1][d])` at `2d + 1`, an odd last row
/// paired with itself (the layout of [`dot_key_pairs`]).
pub fn widen_f16_pairs(dst: &mut [f32], rows: &[&[f16]], dk: usize) {
    assert!(rows.iter().all(|r| r.len() == dk));
    assert!(dst.len() >= rows.len().div_ceil(2) * 2 * dk);
    #[cfg(target_arch = "x86_64")]
    if key_pairs_fast() {
        // SAFETY: AVX-512F present; the lengths are checked above.
        return unsafe { super::tile_avx512::widen_f16_pairs(dst, rows, dk) };
    }
    for (p, pair) in rows.chunks(2).enumerate() {
        let (a, b) = (pair[0], pair[pair.len() - 1]);
        for d in 0..dk {
            dst[2 * dk * p + 2 * d] = a[d].to_f32();
            dst[2 * dk * p + 2 * d + 1] = b[d].to_f32();
        }
    }
}

/// [`dot_keys`] with the keys widened in pairs by [`widen_f16_pairs`] (pair `p`: keys `2p` and
/// `2p + 1`, `2 · dk` floats; an odd last key paired with anything): `out[j]` as there, the
/// same chains, so the same bits. On 512-bit vectors one fused multiply-add serves both keys
/// of a pair for eight queries, twice as many chains as [`dot_keys`]' (a decode step's few
/// queries: a chunk of eight lanes at most).
pub fn dot_key_pairs(qt: &[f32], pairs: &[f32], dk: usize, out: &mut [[f32; QUERY_LANES]]) {
    assert_eq!(qt.len(), dk * QUERY_LANES);
    assert!(pairs.len() >= out.len().div_ceil(2) * 2 * dk);
    #[cfg(target_arch = "x86_64")]
    if key_pairs_fast() {
        // SAFETY: AVX-512F (and AVX2, FMA) present; the sizes are checked above.
        return unsafe { super::tile_avx512::dot_key_pairs(qt, pairs, dk, out) };
    }
    for (j, o) in out.iter_mut().enumerate() {
        let pair = &pairs[j / 2 * 2 * dk..][..2 * dk];
        *o = [0.0; QUERY_LANES];
        for d in 0..dk {
            let k = pair[2 * d + j % 2];
            for (l, s) in o.iter_mut().enumerate() {
                *s = k.mul_add(qt[d * QUERY_LANES + l], *s);
            }
        }
    }
}

/// [`dot_keys`] for two chunks of queries at once (`qt0`, `qt1`, each as `qt` there) against
/// the same keys: the same chains, so the same bits, with every key element broadcast once for
/// sixteen queries.
pub fn dot_keys_pair(
    qt0: &[f32],
    qt1: &[f32],
    keys: &[f32],
    dk: usize,
    out0: &mut [[f32; QUERY_LANES]],
    out1: &mut [[f32; QUERY_LANES]],
) {
    assert_eq!(qt0.len(), dk * QUERY_LANES);
    assert_eq!(qt1.len(), dk * QUERY_LANES);
    assert_eq!(keys.len(), out0.len() * dk);
    assert_eq!(out0.len(), out1.len());
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_level() >= crate::quant::SimdLevel::Avx512 {
        // SAFETY: AVX-512F (and AVX2, FMA) present; the sizes are checked above.
        let done = unsafe { super::tile_avx512::dot_keys_pair(qt0, qt1, keys, dk, out0, out1) };
        let rest = &keys[done * dk..];
        // SAFETY: as in `widen_f16`; the sizes follow from the checks above.
        return unsafe {
            x86::dot_keys_pair(qt0, qt1, rest, dk, &mut out0[done..], &mut out1[done..])
        };
    }
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: as in `widen_f16`; the sizes are checked above.
        return unsafe { x86::dot_keys_pair(qt0, qt1, keys, dk, out0, out1) };
    }
    dot_keys(qt0, keys, dk, out0);
    dot_keys(qt1, keys, dk, out1);
}

/// `acc[d] = fma(rows[n-1][d], w[n-1], … fma(rows[0][d], w[0], acc[d]))` for rows of
/// `acc.len()` floats.
pub fn mad_rows(acc: &mut [f32], rows: &[f32], w: &[f32]) {
    let dv = acc.len();
    assert_eq!(rows.len(), w.len() * dv);
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: as in `widen_f16`; the sizes are checked above.
        return unsafe { x86::mad_rows(acc, rows, w, 1) };
    }
    mad_rows_scalar(acc, rows, w);
}

/// Queries per [`mad_rows_many`] pass.
pub const MAD_QUERIES: usize = 4;

/// [`mad_rows`] for up to [`MAD_QUERIES`] accumulators over the same rows, each with its
/// weights, row `j`'s at `ws[q][j · stride]` (the tiled attention's weights hold eight queries
/// side by side): the same chains, so the same bits, with every row read once for all of them.
pub fn mad_rows_many(accs: &mut [&mut [f32]], rows: &[f32], ws: &[&[f32]], stride: usize) {
    assert!((1..=MAD_QUERIES).contains(&accs.len()) && ws.len() == accs.len() && stride > 0);
    let dv = accs[0].len();
    assert!(dv > 0 && accs.iter().all(|a| a.len() == dv) && rows.len().is_multiple_of(dv));
    let n = rows.len() / dv;
    assert!(n == 0 || ws.iter().all(|w| w.len() > (n - 1) * stride));
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: as in `widen_f16`; the sizes are checked above.
        return unsafe { x86::mad_rows_many(accs, rows, ws, stride) };
    }
    for (acc, w) in accs.iter_mut().zip(ws) {
        mad_rows_strided(acc, rows, w, stride);
    }
}

fn mad_rows_scalar(acc: &mut [f32], rows: &[f32], w: &[f32]) {
    mad_rows_strided(acc, rows, w, 1);
}

/// [`mad_rows_scalar`] with row `j`'s weight at `w[j · stride]`.
fn mad_rows_strided(acc: &mut [f32], rows: &[f32], w: &[f32], stride: usize) {
    let dv = acc.len();
    for (row, &wj) in rows.chunks_exact(dv).zip(w.iter().step_by(stride)) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a = v.mul_add(wj, *a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn simd() -> bool {
    crate::quant::simd_level() >= crate::quant::SimdLevel::Avx2
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::QUERY_LANES;
    use half::f16;
    use std::arch::x86_64::*;

    /// # Safety
    /// Requires F16C and AVX2; `dst.len() == src.len()`.
    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn widen_f16(dst: &mut [f32], src: &[f16]) {
        let n8 = dst.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= both lengths; unaligned accesses.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
        }
        for i in n8..dst.len() {
            dst[i] = src[i].to_f32();
        }
    }

    /// The 8×8 transpose of rows `v` (result `c`: element `r` of column `c` is `v[r][c]`).
    #[inline(always)]
    pub(crate) fn transpose8(v: [__m256; 8]) -> [__m256; 8] {
        // SAFETY (every intrinsic): AVX (the callers' target features).
        unsafe {
            let t0 = _mm256_unpacklo_ps(v[0], v[1]);
            let t1 = _mm256_unpackhi_ps(v[0], v[1]);
            let t2 = _mm256_unpacklo_ps(v[2], v[3]);
            let t3 = _mm256_unpackhi_ps(v[2], v[3]);
            let t4 = _mm256_unpacklo_ps(v[4], v[5]);
            let t5 = _mm256_unpackhi_ps(v[4], v[5]);
            let t6 = _mm256_unpacklo_ps(v[6], v[7]);
            let t7 = _mm256_unpackhi_ps(v[6], v[7]);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            [
                _mm256_permute2f128_ps::<0x20>(s0, s4),
                _mm256_permute2f128_ps::<0x20>(s1, s5),
                _mm256_permute2f128_ps::<0x20>(s2, s6),
                _mm256_permute2f128_ps::<0x20>(s3, s7),
                _mm256_permute2f128_ps::<0x31>(s0, s4),
                _mm256_permute2f128_ps::<0x31>(s1, s5),
                _mm256_permute2f128_ps::<0x31>(s2, s6),
                _mm256_permute2f128_ps::<0x31>(s3, s7),
            ]
        }
    }

    /// # Safety
    /// Requires F16C, AVX2 and FMA; the sizes checked by the caller.
    #[target_feature(enable = "f16c,avx2,fma")]
    pub unsafe fn widen_f16_transposed(
        kt: &mut [f32],
        stride: usize,
        j0: usize,
        rows: &[&[f16]; 8],
        dk: usize,
    ) {
        let d8 = dk / 8 * 8;
        let kp = kt.as_mut_ptr();
        for d in (0..d8).step_by(8) {
            // SAFETY: d + 8 <= dk <= every row's length; the stores land at
            // (d + i) * stride + j0 .. + 8, inside `kt` by the caller's check.
            unsafe {
                let r: [__m256; 8] = std::array::from_fn(|j| {
                    _mm256_cvtph_ps(_mm_loadu_si128(rows[j].as_ptr().add(d) as *const __m128i))
                });
                // An 8×8 transpose: column i of the rows becomes vector c[i].
                let c = transpose8(r);
                for (i, ci) in c.iter().enumerate() {
                    _mm256_storeu_ps(kp.add((d + i) * stride + j0), *ci);
                }
            }
        }
        for (j, row) in rows.iter().enumerate() {
            for d in d8..dk {
                kt[d * stride + j0 + j] = row[d].to_f32();
            }
        }
    }

    /// # Safety
    /// Requires AVX2 and FMA; the sizes checked by the caller.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_keys_transposed(q: &[f32], kt: &[f32], stride: usize, out: &mut [f32]) {
        // Up to 64 keys at a time: eight independent chains, one broadcast per eight FMAs.
        const VECS: usize = 8;
        let n = out.len();
        let kp = kt.as_ptr();
        let mut j = 0;
        while j < n {
            let nv = (n - j).div_ceil(8).min(VECS);
            let mut acc = [_mm256_setzero_ps(); VECS];
            for (d, &qd) in q.iter().enumerate() {
                let qv = _mm256_set1_ps(qd);
                for (v, a) in acc.iter_mut().enumerate().take(nv) {
                    // SAFETY: key j + 8v + 8 <= n rounded up to 8, inside row d of `kt`
                    // (the caller's check).
                    let k = unsafe { _mm256_loadu_ps(kp.add(d * stride + j + 8 * v)) };
                    *a = _mm256_fmadd_ps(k, qv, *a);
                }
            }
            let mut lanes = [0f32; 8 * VECS];
            for (v, a) in acc.iter().enumerate().take(nv) {
                // SAFETY: lanes holds 8 floats per vector.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * v), *a) };
            }
            let m = (n - j).min(8 * VECS);
            out[j..j + m].copy_from_slice(&lanes[..m]);
            j += m;
        }
    }

    /// # Safety
    /// Requires AVX2 and FMA; `qt.len() == dk * 8`, `keys.len() == out.len() * dk`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_keys(qt: &[f32], keys: &[f32], dk: usize, out: &mut [[f32; QUERY_LANES]]) {
        // Eight keys at a time: eight independent chains hide the FMA latency.
        const KEYS: usize = 8;
        let n8 = out.len() / KEYS * KEYS;
        let (qp, kp) = (qt.as_ptr(), keys.as_ptr());
        let mut j = 0;
        while j < out.len() {
            let nk = if j < n8 { KEYS } else { 1 };
            let mut acc = [_mm256_setzero_ps(); KEYS];
            for d in 0..dk {
                // SAFETY: d < dk: row d of `qt` and element d of keys j..j+nk are in bounds.
                unsafe {
                    let q = _mm256_loadu_ps(qp.add(d * QUERY_LANES));
                    for (k, a) in acc.iter_mut().enumerate().take(nk) {
                        let kv = _mm256_broadcast_ss(&*kp.add((j + k) * dk + d));
                        *a = _mm256_fmadd_ps(kv, q, *a);
                    }
                }
            }
            for (k, a) in acc.iter().enumerate().take(nk) {
                // SAFETY: out[j + k] holds 8 floats.
                unsafe { _mm256_storeu_ps(out[j + k].as_mut_ptr(), *a) };
            }
            j += nk;
        }
    }

    /// # Safety
    /// Requires AVX2 and FMA; `qt0.len() == qt1.len() == dk * 8`,
    /// `keys.len() == out0.len() * dk`, `out0.len() == out1.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_keys_pair(
        qt0: &[f32],
        qt1: &[f32],
        keys: &[f32],
        dk: usize,
        out0: &mut [[f32; QUERY_LANES]],
        out1: &mut [[f32; QUERY_LANES]],
    ) {
        // Four keys at a time against both chunks: eight independent chains, and four
        // broadcasts and two loads per eight FMAs (one chunk alone: nine loads).
        const KEYS: usize = 4;
        let n4 = out0.len() / KEYS * KEYS;
        let (q0, q1, kp) = (qt0.as_ptr(), qt1.as_ptr(), keys.as_ptr());
        for j in (0..n4).step_by(KEYS) {
            let mut a0 = [_mm256_setzero_ps(); KEYS];
            let mut a1 = [_mm256_setzero_ps(); KEYS];
            for d in 0..dk {
                // SAFETY: d < dk: row d of both chunks and element d of keys j..j+4 are in
                // bounds.
                unsafe {
                    let (x0, x1) = (
                        _mm256_loadu_ps(q0.add(d * QUERY_LANES)),
                        _mm256_loadu_ps(q1.add(d * QUERY_LANES)),
                    );
                    for k in 0..KEYS {
                        let kv = _mm256_broadcast_ss(&*kp.add((j + k) * dk + d));
                        a0[k] = _mm256_fmadd_ps(kv, x0, a0[k]);
                        a1[k] = _mm256_fmadd_ps(kv, x1, a1[k]);
                    }
                }
            }
            for k in 0..KEYS {
                // SAFETY: out0[j + k] and out1[j + k] hold 8 floats each.
                unsafe {
                    _mm256_storeu_ps(out0[j + k].as_mut_ptr(), a0[k]);
                    _mm256_storeu_ps(out1[j + k].as_mut_ptr(), a1[k]);
                }
            }
        }
        if n4 < out0.len() {
            let rest = &keys[n4 * dk..];
            // SAFETY: the sizes of the rest follow from the caller's.
            unsafe {
                dot_keys(qt0, rest, dk, &mut out0[n4..]);
                dot_keys(qt1, rest, dk, &mut out1[n4..]);
            }
        }
    }

    /// # Safety
    /// Requires AVX2 and FMA; `rows.len() == n * acc.len()`, `w` holding `n` weights
    /// `stride` apart.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mad_rows(acc: &mut [f32], rows: &[f32], w: &[f32], stride: usize) {
        let dv = acc.len();
        let n32 = dv / 32 * 32;
        let (ap, rp) = (acc.as_mut_ptr(), rows.as_ptr());
        let n = rows.len() / dv;
        // 32 outputs at a time: four independent chains over the rows.
        for d in (0..n32).step_by(32) {
            // SAFETY: d + 32 <= dv: in bounds of `acc` and of every row.
            unsafe {
                let mut a = [0, 1, 2, 3].map(|c| _mm256_loadu_ps(ap.add(d + 8 * c)));
                for (j, &wj) in w.iter().step_by(stride).take(n).enumerate() {
                    let wv = _mm256_set1_ps(wj);
                    for (c, ac) in a.iter_mut().enumerate() {
                        let v = _mm256_loadu_ps(rp.add(j * dv + d + 8 * c));
                        *ac = _mm256_fmadd_ps(v, wv, *ac);
                    }
                }
                for (c, ac) in a.iter().enumerate() {
                    _mm256_storeu_ps(ap.add(d + 8 * c), *ac);
                }
            }
        }
        if n32 < dv {
            for (j, &wj) in w.iter().step_by(stride).take(n).enumerate() {
                for d in n32..dv {
                    acc[d] = rows[j * dv + d].mul_add(wj, acc[d]);
                }
            }
        }
    }

    /// # Safety
    /// Requires AVX2 and FMA; 1 to 4 accumulators of one length `dv`, `rows.len() == n * dv`,
    /// as many weight slices with `n` weights `stride` apart (checked by the caller).
    pub unsafe fn mad_rows_many(
        accs: &mut [&mut [f32]],
        rows: &[f32],
        ws: &[&[f32]],
        stride: usize,
    ) {
        // SAFETY: forwarded; the count picks the instantiation.
        unsafe {
            match accs.len() {
                1 => mad_rows(accs[0], rows, ws[0], stride),
                2 => mad_rows_nq::<2>(accs, rows, ws, stride),
                3 => mad_rows_nq::<3>(accs, rows, ws, stride),
                _ => mad_rows_nq::<4>(accs, rows, ws, stride),
            }
        }
    }

    /// Sixteen outputs of `NQ` accumulators at a time: 2·NQ independent chains over the
    /// rows, each row's sixteen values loaded once for all of them.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mad_rows_nq<const NQ: usize>(
        accs: &mut [&mut [f32]],
        rows: &[f32],
        ws: &[&[f32]],
        stride: usize,
    ) {
        let dv = accs[0].len();
        let n = rows.len() / dv;
        let n16 = dv / 16 * 16;
        let rp = rows.as_ptr();
        let ap: [*mut f32; NQ] = std::array::from_fn(|q| accs[q].as_mut_ptr());
        let wp: [*const f32; NQ] = std::array::from_fn(|q| ws[q].as_ptr());
        for d in (0..n16).step_by(16) {
            // SAFETY: d + 16 <= dv: in bounds of every accumulator and row; j < n weights.
            unsafe {
                let mut a: [[__m256; 2]; NQ] = std::array::from_fn(|q| {
                    [
                        _mm256_loadu_ps(ap[q].add(d)),
                        _mm256_loadu_ps(ap[q].add(d + 8)),
                    ]
                });
                for j in 0..n {
                    let v0 = _mm256_loadu_ps(rp.add(j * dv + d));
                    let v1 = _mm256_loadu_ps(rp.add(j * dv + d + 8));
                    for (q, aq) in a.iter_mut().enumerate() {
                        let wv = _mm256_broadcast_ss(&*wp[q].add(j * stride));
                        aq[0] = _mm256_fmadd_ps(v0, wv, aq[0]);
                        aq[1] = _mm256_fmadd_ps(v1, wv, aq[1]);
                    }
                }
                for (q, aq) in a.iter().enumerate() {
                    _mm256_storeu_ps(ap[q].add(d), aq[0]);
                    _mm256_storeu_ps(ap[q].add(d + 8), aq[1]);
                }
            }
        }
        if n16 < dv {
            for (acc, w) in accs.iter_mut().zip(ws) {
                for (j, &wj) in w.iter().step_by(stride).take(n).enumerate() {
                    for d in n16..dv {
                        acc[d] = rows[j * dv + d].mul_add(wj, acc[d]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "tile_tests.rs"]
mod tests;
