//! K-quants (Q4_K, Q5_K, Q6_K) against Q8_K activations (d f32 at 0, qs at 4, bsums at 260).

use std::arch::x86_64::*;

use super::helpers::*;

/// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block as two u32x2 (ggml's `utmp` trick):
/// returns [scales0..3, scales4..7, mins0..3, mins4..7] as little-endian u32 words.
#[inline(always)]
pub(super) unsafe fn k4_scales(sc: *const u8) -> [u32; 4] {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    unsafe {
        let mut u = [rd32(sc), rd32(sc.add(4)), rd32(sc.add(8)), 0];
        u[3] = ((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4);
        let uaux = u[1] & KMASK1;
        u[1] = (u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4);
        u[2] = uaux;
        u[0] &= KMASK1;
        u
    }
}

/// Shuffle picking i16 word `i` of each 128-bit lane into all 8 words of that lane (loaded
/// from a table: building it with byte inserts cost more than the dot products it serves).
#[inline(always)]
pub(super) unsafe fn word_bcast_mask(i: usize) -> __m256i {
    const MASKS: [[u8; 32]; 8] = {
        let mut m = [[0u8; 32]; 8];
        let mut i = 0;
        while i < 8 {
            let mut b = 0;
            while b < 32 {
                m[i][b] = (2 * i + b % 2) as u8;
                b += 1;
            }
            i += 1;
        }
        m
    };
    unsafe { _mm256_loadu_si256(MASKS[i].as_ptr() as *const __m256i) }
}

/// How a K-quant dot folds its integer sums into floats (see [`dot_k4_like`]).
pub(super) const LANES: u8 = 0;
pub(super) const BLOCK_SUMS: u8 = 1;
pub(super) const PAIR_SUMS: u8 = 2;
pub(super) const LANES_MIN_LANES: u8 = 3;
pub(super) const TILED: u8 = 4;

/// Shared by Q4_K and Q5_K: `qbits(j)` gives the unsigned low/high 32-element vectors of
/// sub-block pair `j` (0..4). `MODE` picks the float arithmetic:
/// - `LANES` (Q5_K): ggml's `vec_dot_q5_K_q8_K` order, 8 integer lanes per block each scaled into
///   an 8-lane accumulator, each block's min sum into a scalar one (`summs`).
/// - `BLOCK_SUMS` (Q4_K, one row): llama.cpp's repacked Q4_K gemv, which it uses for every Q4_K
///   matrix with a multiple of 8 rows on AVX2 machines: each block's integer sums reduced to one
///   integer, then `acc += isum·(d·dy)` and `acc_min += imin·(dmin·dy)` with one FMA each, and
///   the result is `acc − acc_min`.
/// - `PAIR_SUMS` (Q4_K, a prompt's rows in groups of four): the repacked gemm, the same but with
///   one FMA per sub-block pair.
/// - `LANES_MIN_LANES` (Q4_K not repacked, one row): ggml's `vec_dot_q4_K_q8_K`, as `LANES` but
///   the min sums' 4 lanes into a 4-lane accumulator (−dmin·dy), reduced (0+2) + (1+3).
/// - `TILED` (Q5_K, and Q4_K not repacked, in a prompt of 8+ rows): llama.cpp's tiled kernel,
///   per block r = isum·d − dmin·imin (one FMA) and acc += r·dy (one FMA).
#[inline(always)]
pub(super) unsafe fn dot_k4_like<const NX: usize, const WB: usize, const MODE: u8>(
    nb: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    out: *mut f32,
    qbits: impl Fn(*const u8, usize) -> (__m256i, __m256i),
) {
    unsafe {
        let mut acc = K4Accs::<NX>::new();
        for i in 0..nb {
            let wb = w.add(i * WB);
            for l in (0..WB).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + l) as *const i8);
            }
            let (d, dmin) = (f16(wb), f16(wb.add(2)));
            let u = k4_scales(wb.add(4));
            let ms = _mm256_cvtepu8_epi16(_mm_set_epi32(
                u[3] as i32,
                u[2] as i32,
                u[1] as i32,
                u[0] as i32,
            ));
            let mins = _mm256_extracti128_si256(ms, 1);
            let scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(ms));
            let xb = |k: usize| x.add(k * stride + i * 292);
            let dy = |k: usize| (xb(k) as *const f32).read_unaligned();
            // PAIR_SUMS and TILED: row k's min sums of the sub-block pairs (lane j).
            let mut pair_mins = [_mm_setzero_si128(); 4];
            for k in 0..NX {
                let bs = load256(xb(k).add(260));
                let q8s =
                    _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
                pair_mins[k] = _mm_madd_epi16(mins, q8s);
                acc.mins::<MODE>(k, pair_mins[k], dmin, dy(k));
            }
            let (mut d4, mut dmin4) = ([0f32; 4], [0f32; 4]);
            if MODE == PAIR_SUMS {
                for k in 0..NX {
                    (d4[k], dmin4[k]) = (d * dy(k), dmin * dy(k));
                }
                acc.pair_mins(pair_mins, _mm_loadu_ps(dmin4.as_ptr()));
            }
            let d4 = _mm_loadu_ps(d4.as_ptr());
            let mut sumi = [_mm256_setzero_si256(); NX];
            for j in 0..4 {
                let sl = _mm256_shuffle_epi8(scales, word_bcast_mask(2 * j));
                let sh = _mm256_shuffle_epi8(scales, word_bcast_mask(2 * j + 1));
                let (ql, qh) = qbits(wb, j);
                let mut p = [_mm256_setzero_si256(); 4];
                for k in 0..NX {
                    let xq = xb(k).add(4 + 64 * j);
                    let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(ql, load256(xq)));
                    let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(qh, load256(xq.add(32))));
                    p[k] = _mm256_add_epi32(pl, ph);
                    if MODE != PAIR_SUMS {
                        sumi[k] = _mm256_add_epi32(sumi[k], p[k]);
                    }
                }
                if MODE == PAIR_SUMS {
                    acc.pair_sums(p, d4);
                }
            }
            for k in 0..NX {
                acc.block::<MODE>(k, sumi[k], pair_mins[k], (d, dmin), dy(k));
            }
        }
        acc.finish::<MODE>(out);
    }
}

/// [`dot_k4_like`]'s accumulators for `NX` rows, those each `MODE` uses.
struct K4Accs<const NX: usize> {
    /// LANES, LANES_MIN_LANES: 8 lanes of scaled integer sums per row.
    acc: [__m256; NX],
    /// BLOCK_SUMS, TILED (and PAIR_SUMS at the end): one float per row.
    acc_s: [f32; NX],
    /// LANES, BLOCK_SUMS (and PAIR_SUMS at the end): the min sums, one float per row.
    acc_ms: [f32; NX],
    /// LANES_MIN_LANES: the min sums' 4 lanes per row.
    acc_m4: [__m128; NX],
    /// PAIR_SUMS: row k's two accumulators in lane k (the same FMAs per row, four rows per
    /// instruction).
    acc4: __m128,
    acc_min4: __m128,
}

impl<const NX: usize> K4Accs<NX> {
    #[inline(always)]
    unsafe fn new() -> Self {
        Self {
            acc: [_mm256_setzero_ps(); NX],
            acc_s: [0f32; NX],
            acc_ms: [0f32; NX],
            acc_m4: [_mm_setzero_ps(); NX],
            acc4: _mm_setzero_ps(),
            acc_min4: _mm_setzero_ps(),
        }
    }

    /// Row k's min sums of one block (`prod`: per pair, 4 lanes) folded in, where `MODE`
    /// folds them per block (PAIR_SUMS and TILED fold them later).
    #[inline(always)]
    unsafe fn mins<const MODE: u8>(&mut self, k: usize, prod: __m128i, dmin: f32, dy: f32) {
        unsafe {
            match MODE {
                LANES => {
                    // ggml: summs += (−dmin·dy)·Σmins, contracted into an FMA by GCC.
                    let imin = hsum_epi32_128(prod) as f32;
                    self.acc_ms[k] = (-(dmin * dy)).mul_add(imin, self.acc_ms[k])
                }
                BLOCK_SUMS => {
                    let imin = hsum_epi32_128(prod) as f32;
                    self.acc_ms[k] = imin.mul_add(dmin * dy, self.acc_ms[k])
                }
                LANES_MIN_LANES => {
                    self.acc_m4[k] = _mm_fmadd_ps(
                        _mm_set1_ps(-(dmin * dy)),
                        _mm_cvtepi32_ps(prod),
                        self.acc_m4[k],
                    )
                }
                _ => {}
            }
        }
    }

    /// PAIR_SUMS: the rows' min sums transposed to lane k = row k, one vector per pair j,
    /// folded in pair by pair (their own accumulator, so ahead of the integer sums).
    #[inline(always)]
    unsafe fn pair_mins(&mut self, [p0, p1, p2, p3]: [__m128i; 4], dmin4: __m128) {
        unsafe {
            let (t0, t1) = (_mm_unpacklo_epi32(p0, p1), _mm_unpacklo_epi32(p2, p3));
            let (t2, t3) = (_mm_unpackhi_epi32(p0, p1), _mm_unpackhi_epi32(p2, p3));
            for imin in [
                _mm_unpacklo_epi64(t0, t1),
                _mm_unpackhi_epi64(t0, t1),
                _mm_unpacklo_epi64(t2, t3),
                _mm_unpackhi_epi64(t2, t3),
            ] {
                self.acc_min4 = _mm_fmadd_ps(_mm_cvtepi32_ps(imin), dmin4, self.acc_min4);
            }
        }
    }

    /// PAIR_SUMS: lane k of one FMA takes row k's integer sum over the pair (`p[k]`).
    #[inline(always)]
    unsafe fn pair_sums(&mut self, p: [__m256i; 4], d4: __m128) {
        unsafe {
            let t = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            let isum = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            self.acc4 = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), d4, self.acc4);
        }
    }

    /// Row k's integer sums of one block (`sumi`: 8 lanes; `pair_min`: TILED's min sums)
    /// folded in, where `MODE` folds them per block.
    #[inline(always)]
    unsafe fn block<const MODE: u8>(
        &mut self,
        k: usize,
        sumi: __m256i,
        pair_min: __m128i,
        (d, dmin): (f32, f32),
        dy: f32,
    ) {
        unsafe {
            let isum = || {
                let lanes = _mm_add_epi32(
                    _mm256_castsi256_si128(sumi),
                    _mm256_extracti128_si256(sumi, 1),
                );
                hsum_epi32_128(lanes) as f32
            };
            match MODE {
                LANES | LANES_MIN_LANES => {
                    self.acc[k] = _mm256_fmadd_ps(
                        _mm256_set1_ps(d * dy),
                        _mm256_cvtepi32_ps(sumi),
                        self.acc[k],
                    )
                }
                TILED => {
                    let imin = hsum_epi32_128(pair_min) as f32;
                    let r = (-dmin).mul_add(imin, isum() * d);
                    self.acc_s[k] = r.mul_add(dy, self.acc_s[k]);
                }
                BLOCK_SUMS => self.acc_s[k] = isum().mul_add(d * dy, self.acc_s[k]),
                _ => {}
            }
        }
    }

    /// The rows' results to `out[0..NX]`.
    #[inline(always)]
    unsafe fn finish<const MODE: u8>(mut self, out: *mut f32) {
        unsafe {
            if MODE == PAIR_SUMS {
                let (mut a, mut m) = ([0f32; 4], [0f32; 4]);
                _mm_storeu_ps(a.as_mut_ptr(), self.acc4);
                _mm_storeu_ps(m.as_mut_ptr(), self.acc_min4);
                self.acc_s.copy_from_slice(&a[..NX]);
                self.acc_ms.copy_from_slice(&m[..NX]);
            }
            for k in 0..NX {
                *out.add(k) = match MODE {
                    LANES => hsum_ps(self.acc[k]) + self.acc_ms[k],
                    LANES_MIN_LANES => hsum_ps(self.acc[k]) + hsum_ps128(self.acc_m4[k]),
                    TILED => self.acc_s[k],
                    _ => self.acc_s[k] - self.acc_ms[k],
                };
            }
        }
    }
}

// The kernel functions of the K-quants, one per arithmetic `MODE` of a shared body.
mode_kernels! {
    /// Q4_K as llama.cpp's repacked gemv computes one row (its default Q4_K kernel on x86).
    q4_k = q4_k_impl::<BLOCK_SUMS>;
    /// Q4_K as ggml's `vec_dot_q4_K_q8_K` (a matrix llama.cpp does not repack, one row).
    q4_k_vec_dot = q4_k_impl::<LANES_MIN_LANES>;
    /// Q4_K as llama.cpp's tiled kernel computes a prompt's rows of a matrix it does not repack.
    q4_k_tiled = q4_k_impl::<TILED>;
    /// Q4_K as llama.cpp's repacked gemm computes a prompt's rows (see [`dot_k4_like`]).
    q4_k_gemm = q4_k_impl::<PAIR_SUMS>;
    /// Q5_K as ggml's `vec_dot_q5_K_q8_K`.
    q5_k = q5_k_impl::<LANES>;
    /// Q5_K as llama.cpp's tiled kernel computes a prompt's rows.
    q5_k_tiled = q5_k_impl::<TILED>;
    /// Q6_K as ggml's `vec_dot_q6_K_q8_K`.
    q6_k = q6_k_impl::<false>;
    /// Q6_K with the arithmetic of ggml's tiled kernel (see
    /// [`crate::quant::dispatch::Kernels::q6_k_batched`]).
    q6_k_batched = q6_k_impl::<true>;
}

#[inline(always)]
pub(super) unsafe fn q4_k_impl<const NX: usize, const MODE: u8>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_k4_like::<NX, 144, MODE>(
            n / 256,
            w,
            x,
            s,
            out,
            #[inline(always)]
            |wb, j| {
                let m4 = _mm256_set1_epi8(0xF);
                let bits = load256(wb.add(16 + 32 * j));
                (
                    _mm256_and_si256(bits, m4),
                    _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                )
            },
        )
    }
}

#[inline(always)]
pub(super) unsafe fn q5_k_impl<const NX: usize, const MODE: u8>(
    n: usize,
    w: *const u8,
    x: *const u8,
    s: usize,
    out: *mut f32,
) {
    unsafe {
        dot_k4_like::<NX, 176, MODE>(
            n / 256,
            w,
            x,
            s,
            out,
            #[inline(always)]
            |wb, j| {
                let m4 = _mm256_set1_epi8(0xF);
                let bits = load256(wb.add(48 + 32 * j));
                let hb = load256(wb.add(16));
                let sixteen = _mm256_set1_epi8(16);
                let m1 = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
                let m2 = _mm256_set1_epi8((2u8 << (2 * j)) as i8);
                let h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, m1), m1), sixteen);
                let h2 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, m2), m2), sixteen);
                (
                    _mm256_or_si256(_mm256_and_si256(bits, m4), h1),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h2),
                )
            },
        )
    }
}

/// Shuffle for Q6_K scales: bytes [2i ×8, 2i+1 ×8].
#[inline(always)]
pub(super) unsafe fn q6_scale_mask(i: usize) -> __m128i {
    unsafe {
        let a = (2 * i) as i8;
        let b = (2 * i + 1) as i8;
        _mm_setr_epi8(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b)
    }
}

/// `BATCHED = false`: `ggml_vec_dot_q6_K_q8_K` (8 integer lanes per super-block, each scaled
/// by d·dy into an 8-lane float accumulator). `BATCHED = true`: the super-block's whole
/// integer sum s, then acc = acc + (s·d)·dy, one rounding per operation.
#[inline(always)]
pub(super) unsafe fn q6_k_impl<const NX: usize, const BATCHED: bool>(
    n: usize,
    w: *const u8,
    x: *const u8,
    stride: usize,
    out: *mut f32,
) {
    unsafe {
        let nb = n / 256;
        let m4 = _mm256_set1_epi8(0xF);
        let m3 = _mm256_set1_epi8(3);
        let mut acc = [_mm256_setzero_ps(); NX];
        let mut acc_batched = [0f32; NX];
        for i in 0..nb {
            let wb = w.add(i * 210);
            for l in (0..210).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(wb.add(PREFETCH + l) as *const i8);
            }
            let d = f16(wb.add(208));
            let sc8 = load128(wb.add(192));
            // Σ (q - 32) q8 sc = Σ q q8 sc - 32 Σ sc bsum: start every sum at -32 Σ sc·bsum.
            let sc16 = _mm256_cvtepi8_epi16(sc8);
            let mut sumi = [_mm256_setzero_si256(); NX];
            for k in 0..NX {
                let bs = load256(x.add(k * stride + i * 292 + 260));
                let corr = _mm256_madd_epi16(sc16, bs);
                sumi[k] = _mm256_sub_epi32(sumi[k], _mm256_slli_epi32(corr, 5));
            }
            for h in 0..2 {
                let b1 = load256(wb.add(64 * h));
                let b2 = load256(wb.add(64 * h + 32));
                let bh = load256(wb.add(128 + 32 * h));
                let q0 = _mm256_or_si256(
                    _mm256_and_si256(b1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4),
                );
                let q1 = _mm256_or_si256(
                    _mm256_and_si256(b2, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m3), 4),
                );
                let q2 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m3), 4),
                );
                let q3 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m3), 4),
                );
                let s0 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, q6_scale_mask(4 * h)));
                let s1 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, q6_scale_mask(4 * h + 1)));
                let s2 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, q6_scale_mask(4 * h + 2)));
                let s3 = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, q6_scale_mask(4 * h + 3)));
                for k in 0..NX {
                    let xq = x.add(k * stride + i * 292 + 4 + 128 * h);
                    let p0 = _mm256_madd_epi16(s0, _mm256_maddubs_epi16(q0, load256(xq)));
                    let p1 = _mm256_madd_epi16(s1, _mm256_maddubs_epi16(q1, load256(xq.add(32))));
                    let p2 = _mm256_madd_epi16(s2, _mm256_maddubs_epi16(q2, load256(xq.add(64))));
                    let p3 = _mm256_madd_epi16(s3, _mm256_maddubs_epi16(q3, load256(xq.add(96))));
                    let p = _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3));
                    sumi[k] = _mm256_add_epi32(sumi[k], p);
                }
            }
            for k in 0..NX {
                let dy = (x.add(k * stride + i * 292) as *const f32).read_unaligned();
                if BATCHED {
                    let s = hsum_epi32_128(_mm_add_epi32(
                        _mm256_castsi256_si128(sumi[k]),
                        _mm256_extracti128_si256::<1>(sumi[k]),
                    ));
                    acc_batched[k] = (s as f32 * d).mul_add(dy, acc_batched[k]);
                } else {
                    acc[k] = _mm256_fmadd_ps(
                        _mm256_set1_ps(d * dy),
                        _mm256_cvtepi32_ps(sumi[k]),
                        acc[k],
                    );
                }
            }
        }
        for k in 0..NX {
            *out.add(k) = if BATCHED {
                acc_batched[k]
            } else {
                hsum_ps(acc[k])
            };
        }
    }
}
