//! RMS normalisation as ggml computes it: the sum of a row's squares in one f64 chain, in the
//! row's order (residual streams, Gemma's especially, hold values in the hundreds, where an
//! f32 sum loses the bits that the following 8-bit activation quantization then magnifies).
//! A prompt's rows go eight at a time, their chains side by side, each its own.

/// 1/sqrt(mean(x²) + eps), the sum of squares accumulated in f64 as ggml does.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// Rows whose sums of squares [`rms_scales`] adds side by side.
const RMS_ROWS: usize = 8;

/// [`rms_scale`] of each of the `RMS_ROWS` rows of `dim` in `x`: each row's own chain, in
/// its order, so the same bits, the rows' chains interleaved. One row's chain waits on its
/// f64 additions (four cycles an element); eight independent ones overlap them.
fn rms_scales(x: &[f32], dim: usize, eps: f32) -> [f32; RMS_ROWS] {
    let rows: [&[f32]; RMS_ROWS] = std::array::from_fn(|r| &x[r * dim..(r + 1) * dim]);
    let mut sums = [0f64; RMS_ROWS];
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::quant::simd_level() != crate::quant::SimdLevel::Scalar {
        // SAFETY: AVX2 (every non-scalar dispatch level has it); eight rows of `dim`.
        done = unsafe { x86::sums_of_squares(rows, &mut sums) };
    }
    for i in done..dim {
        for (sum, row) in sums.iter_mut().zip(&rows) {
            *sum += (row[i] * row[i]) as f64;
        }
    }
    sums.map(|sum| 1.0 / ((sum / dim as f64) as f32 + eps).sqrt())
}

/// out = x / sqrt(mean(x²) + eps) * weight
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    scale_by(out, x, weight, scale);
}

/// out = x · scale · weight
fn scale_by(out: &mut [f32], x: &[f32], weight: &[f32], scale: f32) {
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// `out` row t = rmsnorm(`x` row t) · weight, for rows of `dim`.
pub fn rmsnorm_rows(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32, dim: usize) {
    let group = RMS_ROWS * dim;
    let (mut out, mut x) = (out, x);
    while x.len() >= group && out.len() >= group && dim > 0 {
        let scales = rms_scales(&x[..group], dim, eps);
        let (o_head, o_rest) = out.split_at_mut(group);
        for ((o, r), scale) in o_head
            .chunks_exact_mut(dim)
            .zip(x.chunks_exact(dim))
            .zip(scales)
        {
            scale_by(o, r, weight, scale);
        }
        (out, x) = (o_rest, &x[group..]);
    }
    for (o, r) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
        rmsnorm(o, r, weight, eps);
    }
}

/// In-place RMS norm of each `dim`-sized chunk (per-head q/k norms, Gemma's post-norms).
pub fn rmsnorm_chunks(x: &mut [f32], weight: &[f32], eps: f32, dim: usize) {
    let group = RMS_ROWS * dim;
    let mut x = x;
    while x.len() >= group && dim > 0 {
        let (head, rest) = x.split_at_mut(group);
        let scales = rms_scales(head, dim, eps);
        for (chunk, scale) in head.chunks_exact_mut(dim).zip(scales) {
            for (v, &w) in chunk.iter_mut().zip(weight) {
                *v = *v * scale * w;
            }
        }
        x = rest;
    }
    for chunk in x.chunks_exact_mut(dim) {
        let scale = rms_scale(chunk, eps);
        for (v, &w) in chunk.iter_mut().zip(weight) {
            *v = *v * scale * w;
        }
    }
}

/// [`rmsnorm_rows`] with the rows shared among `pool`'s threads when there are many (each row
/// normalized alone: the same bits).
pub fn rmsnorm_rows_in(
    pool: &super::pool::ThreadPool,
    out: &mut [f32],
    x: &[f32],
    weight: &[f32],
    eps: f32,
    dim: usize,
) {
    assert_eq!(out.len(), x.len());
    super::ops::in_runs(pool, dim, out, x, |o, x| {
        rmsnorm_rows(o, x, weight, eps, dim)
    })
}

/// [`rmsnorm_chunks`] with the chunks shared among `pool`'s threads when there are many.
pub fn rmsnorm_chunks_in(
    pool: &super::pool::ThreadPool,
    x: &mut [f32],
    weight: &[f32],
    eps: f32,
    dim: usize,
) {
    super::ops::in_runs(pool, dim, x, &[], |x, _| {
        rmsnorm_chunks(x, weight, eps, dim)
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::kernels::tile::transpose8;

    /// The first `len / 8 · 8` steps of [`super::rms_scales`]' eight chains (`sums[r] +=
    /// (x·x) as f64` along row `r`, in its order), the rows as the lanes: eight values of
    /// each row loaded and transposed, then each column squared in f32, widened and added
    /// to the rows' sums, four in each of two f64 vectors. The same operations per lane, so
    /// the same bits. Returns the steps done.
    ///
    /// # Safety
    /// Requires AVX2; the eight rows of one length.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sums_of_squares(rows: [&[f32]; 8], sums: &mut [f64; 8]) -> usize {
        let n8 = rows[0].len() / 8 * 8;
        let mut lo = _mm256_loadu_pd(sums.as_ptr());
        let mut hi = _mm256_loadu_pd(sums.as_ptr().add(4));
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= every row's length.
            let v: [__m256; 8] =
                std::array::from_fn(|r| unsafe { _mm256_loadu_ps(rows[r].as_ptr().add(i)) });
            for column in transpose8(v) {
                let sq = _mm256_mul_ps(column, column);
                lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
                hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(sq)));
            }
        }
        // SAFETY: eight f64 of `sums`.
        unsafe {
            _mm256_storeu_pd(sums.as_mut_ptr(), lo);
            _mm256_storeu_pd(sums.as_mut_ptr().add(4), hi);
        }
        n8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's norm has the bits of that row alone, whatever rows come with it: the rows
    /// normalized eight at a time (their chains interleaved) against [`rms_scale`]'s one
    /// chain, values large enough for the f64 sum's rounding to show in f32.
    #[test]
    fn grouped_norms_have_each_rows_bits() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (dim, rows) in [(896, 19), (128, 8), (128, 40), (3584, 9), (5, 17)] {
            let x: Vec<f32> = (0..dim * rows)
                .map(|i| ((i * 7919 % 4099) as f32 - 2049.5) * 0.173 + (i % 3) as f32 * 1e-4)
                .collect();
            let w: Vec<f32> = (0..dim).map(|i| 0.25 + (i % 7) as f32 * 0.5).collect();
            let mut alone = vec![0.0; x.len()];
            for (o, r) in alone.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
                rmsnorm(o, r, &w, 1e-6);
            }
            let mut grouped = vec![0.0; x.len()];
            rmsnorm_rows(&mut grouped, &x, &w, 1e-6, dim);
            assert_eq!(bits(&grouped), bits(&alone), "rows: {dim} x {rows}");
            let mut chunks = x.clone();
            rmsnorm_chunks(&mut chunks, &w, 1e-6, dim);
            assert_eq!(bits(&chunks), bits(&alone), "chunks: {dim} x {rows}");
        }
    }

    /// The norms shared among threads give one call's bits, whatever the split.
    #[test]
    fn norms_in_the_pool_have_one_calls_bits() {
        for threads in [2, 3] {
            let pool = super::super::pool::ThreadPool::new(threads);
            for (dim, rows) in [(640, 7), (640, 101), (256, 300), (896, 513)] {
                let n = dim * rows;
                let x: Vec<f32> = (0..n)
                    .map(|i| ((i * 53 % 1999) as f32 - 999.0) * 0.37)
                    .collect();
                let w: Vec<f32> = (0..dim).map(|i| 0.5 + (i % 5) as f32 * 0.25).collect();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let (mut one, mut pooled) = (vec![0f32; n], vec![0f32; n]);
                rmsnorm_rows(&mut one, &x, &w, 1e-6, dim);
                rmsnorm_rows_in(&pool, &mut pooled, &x, &w, 1e-6, dim);
                assert!(
                    bits(&one) == bits(&pooled),
                    "rows: {rows} of {dim}, {threads} threads"
                );
                let (mut one, mut pooled) = (x.clone(), x.clone());
                rmsnorm_chunks(&mut one, &w, 1e-6, dim);
                rmsnorm_chunks_in(&pool, &mut pooled, &w, 1e-6, dim);
                assert!(
                    bits(&one) == bits(&pooled),
                    "chunks: {rows} of {dim}, {threads} threads"
                );
            }
        }
    }

    #[test]
    fn rmsnorm_matches_formula() {
        let x = [1.0, -2.0, 3.0, 0.5];
        let w = [1.0, 2.0, 0.5, 1.0];
        let mut out = [0.0; 4];
        rmsnorm(&mut out, &x, &w, 1e-6);
        let rms = ((1.0 + 4.0 + 9.0 + 0.25) / 4.0f32 + 1e-6).sqrt();
        for i in 0..4 {
            assert!((out[i] - x[i] / rms * w[i]).abs() < 1e-6);
        }
    }

    /// How long the RMS norm of a prompt's rows takes, eight rows' chains at a time against
    /// one row's alone (`cargo test --release -p nucleus --lib rmsnorm_speed -- --ignored
    /// --nocapture`).
    #[test]
    #[ignore = "a timing, not a check"]
    fn rmsnorm_speed() {
        for dim in [896, 1536, 3584] {
            let rows = 64;
            let x: Vec<f32> = (0..dim * rows)
                .map(|i| (i % 97) as f32 * 0.3 - 14.0)
                .collect();
            let w = vec![1.5f32; dim];
            let mut out = vec![0.0; x.len()];
            let reps = 200;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                rmsnorm_rows(&mut out, &x, &w, 1e-6, dim);
            }
            let grouped = t.elapsed().as_secs_f64() * 1e9 / (reps * x.len()) as f64;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for (o, r) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
                    rmsnorm(o, r, &w, 1e-6);
                }
            }
            let alone = t.elapsed().as_secs_f64() * 1e9 / (reps * x.len()) as f64;
            eprintln!("dim {dim}: {grouped:.3} ns a value in groups, {alone:.3} row by row");
        }
    }
}
