//! Q8_0 in llama.cpp's own arithmetic for it (`ggml_vec_dot_q8_0_q8_0`, which its CPU backend
//! runs for every row of a Q8_0 matrix, a prompt's as a generated token's): per block, eight
//! lane sums of four products each (values `4k..4k + 4` in lane `k`), each converted to f32
//! and fused-multiply-added into its lane's accumulator with the block's `dw · dx`; at the
//! end the lanes summed as `hsum_float_8` does, `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 +
//! l7))`. `--exact` runs a repacked Q8_0 matrix through these instead of reading the file's
//! rows, with the same bits as [`crate::kernels::matmul::matmul_rows`]
//! (`tests::q8_0_lanes_match_the_one_row_kernel`).
//!
//! The stored layout holds each block's values as eight chunks of 32 bytes, chunk `k` being
//! values `4k..4k + 4` of the group's eight rows, so one chunk's products by a token's four
//! activation bytes give lane `k` of all eight rows at once: the lanes live in eight
//! accumulators over the rows, and their final sums are additions of whole vectors.

use super::{GroupView, Tile, GROUP_ROWS, QK};

/// `hsum_float_8`'s order over the eight lanes.
#[inline(always)]
fn lane_sum(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// The chain in plain code, on an unpacked view (signed values, `32·k + 4·j + i` of a block
/// holding row `j`'s value `4k + i`).
///
/// # Safety
/// As [`super::TileFn`].
pub(crate) unsafe fn tile_scalar(group: &GroupView, t: &Tile) {
    let blocks = t.blocks;
    for n in 0..t.nx {
        // SAFETY: the caller guarantees token n's activation row (`blocks` Q8_0 blocks of 34
        // bytes), its `blocks` scales, and 8 output floats.
        let (x, scales, out) = unsafe {
            (
                std::slice::from_raw_parts(t.x.add(n * t.x_stride), blocks * 34),
                std::slice::from_raw_parts(t.scales.add(n * blocks), blocks),
                std::slice::from_raw_parts_mut(t.out.add(n * t.out_stride), GROUP_ROWS),
            )
        };
        let mut lanes = [[0f32; 8]; GROUP_ROWS];
        for b in 0..blocks {
            let xq = &x[34 * b + 2..34 * b + 2 + QK];
            let v = &group.values[group.stride * b..group.stride * b + 256];
            for (j, acc) in lanes.iter_mut().enumerate() {
                let d = group.scales[GROUP_ROWS * b + j] * scales[b];
                for (k, a) in acc.iter_mut().enumerate() {
                    let lane: i32 = (0..4)
                        .map(|i| v[32 * k + 4 * j + i] as i8 as i32 * xq[4 * k + i] as i8 as i32)
                        .sum();
                    *a = d.mul_add(lane as f32, *a);
                }
            }
        }
        for (o, l) in out.iter_mut().zip(&lanes) {
            *o = lane_sum(l);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::tile_stored;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::x86::{prefetch_ahead, uses_vnni, x_quad};
    use super::super::Tile;

    /// Stored bytes of a group's block: eight f16 scales, eight chunks of 32 values.
    const STORED_BLOCK: usize = 16 + 256;

    /// [`super::tile_scalar`]'s chain on a group read as stored: with AVX-512 VNNI up to four
    /// tokens a pass over its blocks ([`wide`]), with AVX2 one ([`lanes`]).
    ///
    /// # Safety
    /// As [`super::super::TileFn`] with `stored` the group's stored bytes (272 per block);
    /// the CPU has AVX2, FMA and F16C.
    pub(crate) unsafe fn tile_stored(stored: &[u8], tile: &Tile) {
        // SAFETY: the caller's contract.
        unsafe { tile_stored_at(stored, tile, uses_vnni()) }
    }

    /// [`tile_stored`] in the VNNI bodies (`with_vnni`: the CPU has AVX-512 VNNI) or the AVX2 one.
    ///
    /// # Safety
    /// As [`tile_stored`].
    pub(super) unsafe fn tile_stored_at(stored: &[u8], tile: &Tile, with_vnni: bool) {
        assert!(stored.len() >= STORED_BLOCK * tile.blocks);
        // SAFETY: the caller's contract; the VNNI body only where the CPU has it.
        unsafe {
            if with_vnni {
                let mut n = 0;
                while n < tile.nx {
                    match tile.nx - n {
                        1 => wide::<1>(stored, tile, n),
                        2 => wide::<2>(stored, tile, n),
                        3 => wide::<3>(stored, tile, n),
                        _ => wide::<4>(stored, tile, n),
                    }
                    n += 4;
                }
            } else {
                for n in 0..tile.nx {
                    avx2(stored, tile, n);
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2(stored: &[u8], tile: &Tile, n0: usize) {
        // SAFETY: forwarded.
        unsafe { lanes(stored, tile, n0) }
    }

    /// Tokens `n0..n0 + P` (at most four: their 16 accumulators take half the registers) on
    /// 512-bit registers, two lanes `k, k + 1` of the eight rows in each (the chunks' 64
    /// bytes as stored). The activations are made unsigned (`x + 128`) instead of the
    /// weights: `vpdpbusd` from `−128 · Σ w` of the lane's four weights (one `vpdpbusd` a
    /// chunk pair for all the tokens) gives `Σ (x + 128) · w − 128 · Σ w = Σ x · w`, ggml's
    /// integer, with no sign instructions (`|lane| ≤ 4 · 255 · 128`). The lanes end in
    /// `hsum_float_8`'s order: `(l0 + l4) + (l2 + l6)` in the low half of one sum of
    /// accumulators, `(l1 + l5) + (l3 + l7)` in its high half.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn wide<const P: usize>(stored: &[u8], t: &Tile, n0: usize) {
        let bias = _mm512_set1_epi8(0x80u8 as i8);
        // Per chunk pair, the dword to put in every lane of each half: k and k + 1.
        let pick: [__m512i; 4] = std::array::from_fn(|p| {
            let (lo, hi) = (2 * p as i32, 2 * p as i32 + 1);
            _mm512_set_epi32(
                hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo,
            )
        });
        let mut acc = [[_mm512_setzero_ps(); 4]; P];
        // SAFETY: block b < blocks: 272 stored bytes (checked by the caller); token n0 + n <
        // nx has `blocks` activation blocks of 34 bytes and scales, and 8 outputs.
        unsafe {
            for b in 0..t.blocks {
                let s = stored.as_ptr().add(STORED_BLOCK * b);
                prefetch_ahead(s, 5);
                let ws = _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i));
                let ws = _mm512_castsi512_ps(_mm512_broadcast_i64x4(_mm256_castps_si256(ws)));
                let mut d = [_mm512_setzero_ps(); P];
                let mut xb = [_mm512_setzero_si512(); P];
                for n in 0..P {
                    let dx = *t.scales.add((n0 + n) * t.blocks + b);
                    d[n] = _mm512_mul_ps(ws, _mm512_set1_ps(dx));
                    let xp = t.x.add((n0 + n) * t.x_stride + 34 * b + 2);
                    let x = _mm256_loadu_si256(xp as *const __m256i);
                    xb[n] =
                        _mm512_castsi256_si512(_mm256_xor_si256(x, _mm512_castsi512_si256(bias)));
                }
                for (p, pick) in pick.iter().enumerate() {
                    let w = _mm512_loadu_si512(s.add(16 + 64 * p) as *const _);
                    let start = _mm512_sub_epi32(
                        _mm512_setzero_si512(),
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, w),
                    );
                    for n in 0..P {
                        let x = _mm512_permutexvar_epi32(*pick, xb[n]);
                        let lane = _mm512_dpbusd_epi32(start, x, w);
                        acc[n][p] = _mm512_fmadd_ps(d[n], _mm512_cvtepi32_ps(lane), acc[n][p]);
                    }
                }
            }
            for (n, a) in acc.iter().enumerate() {
                let halves = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
                let high = _mm512_extracti64x4_epi64::<1>(_mm512_castps_si512(halves));
                let sum = _mm256_add_ps(_mm512_castps512_ps256(halves), _mm256_castsi256_ps(high));
                _mm256_storeu_ps(t.out.add((n0 + n) * t.out_stride), sum);
            }
        }
    }

    /// Token `n0` on AVX2: |w| (at most 128) by x carrying w's sign (at most 127 in
    /// magnitude) in `vpmaddubsw` (a pair at most 32,512: no saturation), then `vpmaddwd`;
    /// the same lane sums as ggml's.
    #[inline(always)]
    unsafe fn lanes(stored: &[u8], t: &Tile, n0: usize) {
        let mut acc = [_mm256_setzero_ps(); 8];
        // SAFETY: block b < blocks: 272 stored bytes (checked by the caller); token n0 < nx
        // has `blocks` activation blocks of 34 bytes and scales, and 8 outputs.
        unsafe {
            for b in 0..t.blocks {
                let s = stored.as_ptr().add(STORED_BLOCK * b);
                prefetch_ahead(s, 5);
                let ws = _mm256_cvtph_ps(_mm_loadu_si128(s as *const __m128i));
                let d = _mm256_mul_ps(ws, _mm256_set1_ps(*t.scales.add(n0 * t.blocks + b)));
                for (k, acc) in acc.iter_mut().enumerate() {
                    let wk = _mm256_loadu_si256(s.add(16 + 32 * k) as *const __m256i);
                    let sx = _mm256_sign_epi8(x_quad(t, n0, b, k), wk);
                    let aw = _mm256_abs_epi8(wk);
                    let lane =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
                    *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lane), *acc);
                }
            }
            let a = acc;
            let sum = _mm256_add_ps(
                _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])),
            );
            _mm256_storeu_ps(t.out.add(n0 * t.out_stride), sum);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{acts, matrix};
    use super::super::*;
    use crate::kernels::matmul::{matmul_rows, QMatrix};
    use crate::kernels::test_rng::Rng;
    use crate::kernels::PromptSlot;

    /// Packed Q8_0 in [`Chain::Q8Lanes`] computes what llama.cpp's one-row kernel computes
    /// (`matmul_rows` for generated tokens, and for a prompt's rows, which it computes alike),
    /// bit for bit, for every token count, with the SIMD kernels (the VNNI and AVX2 bodies,
    /// where the CPU has them) and the scalar ones; weights of −128 and 127 among them.
    #[test]
    fn q8_0_lanes_match_the_one_row_kernel() {
        let mut rng = Rng(29);
        let pool = ThreadPool::new(2);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for (rows, cols) in [(8, 32), (24, 896), (64, 4864)] {
            let ty = GgmlType::Q8_0;
            let mut data = matrix(&mut rng, ty, rows, cols);
            for (i, b) in data.chunks_exact_mut(34).enumerate() {
                if i % 7 == 3 {
                    for (j, v) in b[2..].iter_mut().enumerate() {
                        *v = [0x80, 127, *v][j % 3];
                    }
                }
            }
            let qm = QMatrix {
                ty,
                data: &data,
                rows,
                cols,
            };
            let w = pack::pack(&qm).unwrap();
            for nt in [1, 2, 3, 4, 5, 9, 40] {
                let (x, xa) = acts(&mut rng, nt, cols);
                let at = format!("{rows}x{cols}, {nt} tokens");
                let mut want = vec![0f32; nt * rows];
                matmul_rows(&pool, &qm, &x, &mut want, &[]);
                let mut prompt = vec![0f32; nt * rows];
                matmul_rows(&pool, &qm, &x, &mut prompt, &vec![PromptSlot::BATCHED; nt]);
                assert_eq!(bits(&prompt), bits(&want), "{at}: a prompt's rows");
                for simd in [true, false] {
                    let mut y = vec![0f32; nt * rows];
                    matmul_packed_with(&pool, &mut [(&w, &mut y)], &x, &xa, simd, Chain::Q8Lanes);
                    assert_eq!(bits(&y), bits(&want), "{at}: simd {simd}");
                }
                #[cfg(target_arch = "x86_64")]
                for vnni in [false, true] {
                    let level = if vnni { "avx512vnni" } else { "avx2" };
                    if !std::arch::is_x86_feature_detected!("avx2")
                        || vnni && !std::arch::is_x86_feature_detected!("avx512vnni")
                    {
                        continue;
                    }
                    let mut y = vec![0f32; nt * rows];
                    for g in 0..rows / GROUP_ROWS {
                        let tile = Tile {
                            blocks: cols / QK,
                            x: x.row(0).as_ptr(),
                            x_stride: x.row_bytes(),
                            scales: xa.scales.as_ptr(),
                            offsets: std::ptr::null(),
                            nx: nt,
                            out: y[GROUP_ROWS * g..].as_mut_ptr(),
                            out_stride: rows,
                        };
                        // SAFETY: nt activation rows of cols / 32 blocks and their scales;
                        // group g's stored bytes; outputs t·rows + 8g .. + 8 inside y; the
                        // CPU has the level's features (checked above).
                        unsafe { super::x86::tile_stored_at(w.group(g), &tile, vnni) };
                    }
                    assert_eq!(bits(&y), bits(&want), "{at}: {level} body");
                }
            }
        }
    }
}
