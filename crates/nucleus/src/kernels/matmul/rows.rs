//! The product of a matrix in the file's layout with activation rows, each row with the kernel
//! llama.cpp would compute it with ([`matmul_rows`]).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{
    OutPtr, PaddedCounter, PromptSlot, QMatrix, QuantizedActs, ThreadPool, CHUNKS_PER_THREAD,
    CLASS_UBATCH_2, CLASS_UBATCH_8, CLASS_WHOLE_FOUR, MAX_RANGES, MAX_ROW_CHUNK, MIN_ROW_CHUNK,
    SERIAL_WORK, TOKEN_BLOCK, UNPACK_MIN_TOKENS,
};
use crate::quant::{
    biased_q8_0, dot_q8_0_xs_fn, unpack_row_to_q8_0, vec_dot_type, BiasedQ8_0, DotFn, GgmlType,
};

/// [`DotFn`] with the activation block scales as f32 (`dot_q8_0_xs_fn`).
type XsDotFn = unsafe fn(usize, *const u8, *const u8, usize, *const f32, usize, usize, *mut f32);

/// [`matmul`], where activation row `t` sits at `slots[t]` (a missing entry: a generated token).
///
/// Kernels follow the arithmetic of llama.cpp's CPU backend, whose reference outputs we test
/// against, so that sums round the same way. A prompt's rows go through its batched kernels
/// where it has them: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS through the tiled kernel from 8
/// rows on, F32, F16 and BF16 through sgemm from 2; Q2_K and Q4_K matrices with a multiple of 8
/// rows, which it repacks, through its gemm for the rows in whole groups of four and its gemv
/// otherwise; repacked Q4_0 and IQ4_NL matrices through their interleaved kernels. Other rows, and
/// generated tokens, go through its one-row kernels. Which one a row gets is decided by the caller from the token's role (see
/// `Batch::push_prompt`), never from what else is in the batch, so results do not depend on
/// batching.
pub fn matmul_rows(
    pool: &ThreadPool,
    w: &QMatrix,
    x: &QuantizedActs,
    y: &mut [f32],
    slots: &[PromptSlot],
) {
    check_shapes(w, x, y);
    let (nt, rows, cols) = (x.n_tokens(), w.rows, w.cols);
    if nt == 0 || rows == 0 {
        return;
    }
    let kernels = RowKernels::choose(w);
    let is_prompt: Vec<bool> = (0..nt)
        .map(|t| kernels.takes_prompt_dot(slots, t))
        .collect();
    let prep = Prepared::new(w, x, kernels.dot);
    let job = RowsJob {
        w,
        x,
        y: OutPtr(y.as_mut_ptr()),
        kernels,
        prep: &prep,
        is_prompt: &is_prompt,
    };
    // The row chunks are split into one contiguous range per thread, each with its own counter
    // (no cache line bounces between cores while every thread works through its own range);
    // a thread that is done steals chunks from the others' ranges, one at a time, so a thread
    // that is descheduled or slow holds up at most one chunk.
    let row_chunk =
        (rows / (pool.n_threads() * CHUNKS_PER_THREAD)).clamp(MIN_ROW_CHUNK, MAX_ROW_CHUNK);
    let n_chunks = rows.div_ceil(row_chunk);
    let n_ranges = pool.n_threads().clamp(1, MAX_RANGES);
    let range_end = |r: usize| (r + 1) * n_chunks / n_ranges;
    let counters: [PaddedCounter; MAX_RANGES] =
        std::array::from_fn(|r| PaddedCounter(AtomicUsize::new(r * n_chunks / n_ranges)));
    let work = |ti: usize, _: usize| {
        let mut unpacked = vec![0u8; if prep.unpack { row_chunk * prep.krb } else { 0 }];
        let mut k = 0;
        while k < n_ranges {
            let range = (ti + k) % n_ranges;
            let c = counters[range].0.fetch_add(1, Ordering::Relaxed);
            if c >= range_end(range) {
                k += 1;
                continue;
            }
            job.rows(
                c * row_chunk,
                ((c + 1) * row_chunk).min(rows),
                &mut unpacked,
            );
        }
    };
    if pool.n_threads() == 1 || rows * cols * nt <= SERIAL_WORK || n_chunks == 1 {
        work(0, 1);
    } else {
        pool.run(work);
    }
}

/// The programmer errors [`matmul_rows`] panics on: activations of the wrong type or width, a
/// weight buffer or an output of the wrong size.
fn check_shapes(w: &QMatrix, x: &QuantizedActs, y: &[f32]) {
    let nt = x.n_tokens();
    assert_eq!(
        x.ty(),
        vec_dot_type(w.ty),
        "matmul: activations are {}, {} weights need {}",
        x.ty(),
        w.ty,
        vec_dot_type(w.ty)
    );
    assert_eq!(
        x.cols(),
        w.cols,
        "matmul: activations have {} cols, weights {}",
        x.cols(),
        w.cols
    );
    let wrb = w.row_bytes();
    assert_eq!(
        w.data.len(),
        wrb * w.rows,
        "matmul: weight data has {} bytes, expected {} rows × {wrb}",
        w.data.len(),
        w.rows
    );
    assert_eq!(
        y.len(),
        nt * w.rows,
        "matmul: output has {} floats, expected {nt} × {}",
        y.len(),
        w.rows
    );
}

/// The two kernels llama.cpp has for a matrix: the one-row kernel, and the batched one with the
/// [`PromptSlot::matmul_class`] bit of the rows it takes.
#[derive(Clone, Copy)]
struct RowKernels {
    dot: DotFn,
    prompt_dot: DotFn,
    prompt_class: u8,
}

impl RowKernels {
    fn choose(w: &QMatrix) -> RowKernels {
        let kernels = crate::quant::dispatch_kernels();
        // llama.cpp repacks Q4_0, IQ4_NL and MXFP4 matrices whose row count is a multiple of 8 on x86
        // and computes them with its interleaved kernels (one FMA per block sum); its AVX-512
        // build repacks Q2_K and Q4_K matrices with a multiple of 8 rows (gemv for one row, gemm
        // for a prompt's rows in groups of four); others go through its vec_dot and tiled
        // kernels.
        let repacked = w.rows.is_multiple_of(8)
            && matches!(
                w.ty,
                GgmlType::Q4_0
                    | GgmlType::IQ4_NL
                    | GgmlType::MXFP4
                    | GgmlType::Q2_K
                    | GgmlType::Q4_K
            );
        let dot = match w.ty {
            GgmlType::Q4_0 if repacked => kernels.q4_0_block_sums,
            GgmlType::IQ4_NL if repacked => kernels.iq4_nl_block_sums,
            GgmlType::MXFP4 if repacked => kernels.mxfp4_block_sums,
            GgmlType::Q2_K if repacked => kernels.q2_k_block_sums,
            GgmlType::Q4_K if !repacked => kernels.q4_k_vec_dot,
            _ => kernels.dot_fn(w.ty),
        };
        let prompt_dot = match w.ty {
            GgmlType::Q6_K => kernels.q6_k_batched,
            GgmlType::Q5_K => kernels.q5_k_tiled,
            GgmlType::Q4_K if repacked => kernels.q4_k_gemm,
            GgmlType::Q4_K => kernels.q4_k_tiled,
            GgmlType::Q2_K if repacked => kernels.q2_k_gemm,
            GgmlType::Q2_K => kernels.q2_k_tiled,
            GgmlType::Q3_K => kernels.q3_k_tiled,
            GgmlType::IQ4_XS => kernels.iq4_xs_tiled,
            GgmlType::F16 if w.cols.is_multiple_of(16) => kernels.f16_sgemm,
            GgmlType::BF16 if w.cols.is_multiple_of(32) => kernels.bf16_sgemm,
            GgmlType::F32 if w.cols.is_multiple_of(16) => kernels.f32_sgemm,
            _ => dot,
        };
        let prompt_class = match w.ty {
            GgmlType::Q4_K | GgmlType::Q2_K if repacked => CLASS_WHOLE_FOUR,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS => CLASS_UBATCH_8,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => CLASS_UBATCH_2,
            _ => 0,
        };
        RowKernels {
            dot,
            prompt_dot,
            prompt_class,
        }
    }

    /// Whether row `t` (at `slots[t]`; a missing entry: a generated token) takes the batched
    /// kernel. Decided once per token, not once per token and weight row.
    fn takes_prompt_dot(&self, slots: &[PromptSlot], t: usize) -> bool {
        slots.get(t).copied().unwrap_or_default().matmul_class() & self.prompt_class != 0
    }
}

/// What a product prepares once for all its row chunks.
struct Prepared {
    /// With many tokens, Q4_0/Q5_0 rows are unpacked once per row chunk into Q8_0 rows (same
    /// scales and integers, so the Q8_0 kernel gives bit-identical results) instead of once per
    /// four tokens; with VNNI, Q8_0 rows are copied biased for [`BiasedQ8_0`]'s tiles.
    unpack: bool,
    /// Bytes of a row as the kernels read it (unpacked or not).
    krb: usize,
    /// The one-row kernel for the unpacked rows (the Q8_0 one), else the matrix's.
    dot: DotFn,
    biased: Option<BiasedQ8_0>,
    /// With many tokens and a Q8_0 kernel, the activation block scales converted to f32 once
    /// here rather than once per weight row (same values, so the same results).
    xs_dot: Option<XsDotFn>,
    xs: Vec<f32>,
    /// The activations' lane starts for [`BiasedQ8_0::rows`].
    act_bias: Vec<i32>,
}

impl Prepared {
    fn new(w: &QMatrix, x: &QuantizedActs, dot: DotFn) -> Prepared {
        let (nt, nb) = (x.n_tokens(), w.cols / 32);
        let q4_0_repacked = w.rows.is_multiple_of(8) && w.ty == GgmlType::Q4_0;
        let unpack_q8_0 = nt >= UNPACK_MIN_TOKENS
            && !q4_0_repacked
            && matches!(w.ty, GgmlType::Q4_0 | GgmlType::Q5_0);
        let kernel_ty = if unpack_q8_0 { GgmlType::Q8_0 } else { w.ty };
        let many_q8_0 = nt >= UNPACK_MIN_TOKENS && kernel_ty == GgmlType::Q8_0;
        let biased = if many_q8_0 { biased_q8_0() } else { None };
        let unpack = unpack_q8_0 || biased.is_some();
        let krb = if unpack {
            GgmlType::Q8_0
                .row_bytes(w.cols)
                .expect("Q8_0 and Q4_0/Q5_0 share the block size")
        } else {
            w.row_bytes()
        };
        let dot = if unpack_q8_0 {
            crate::quant::dispatch_kernels().dot_fn(GgmlType::Q8_0)
        } else {
            dot
        };
        let xs_dot = if many_q8_0 && biased.is_none() {
            dot_q8_0_xs_fn()
        } else {
            None
        };
        let xs: Vec<f32> = if xs_dot.is_some() || biased.is_some() {
            (0..nt)
                .flat_map(|t| {
                    let row = x.row(t);
                    (0..nb).map(move |i| {
                        half::f16::from_bits(u16::from_le_bytes([row[i * 34], row[i * 34 + 1]]))
                            .to_f32()
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut act_bias = Vec::new();
        if let Some(b) = biased {
            act_bias = vec![0i32; nt * nb * 8];
            for t in 0..nt {
                // SAFETY: row `t` holds `nb` Q8_0 blocks; `act_bias` has `nb * 8` i32 per row;
                // `biased_q8_0` returned kernels only because this CPU has their features.
                unsafe { (b.act_bias)(nb, x.row(t).as_ptr(), act_bias[t * nb * 8..].as_mut_ptr()) };
            }
        }
        Prepared {
            unpack,
            krb,
            dot,
            biased,
            xs_dot,
            xs,
            act_bias,
        }
    }
}

/// One product as its threads see it.
struct RowsJob<'a> {
    w: &'a QMatrix<'a>,
    x: &'a QuantizedActs,
    y: OutPtr,
    kernels: RowKernels,
    prep: &'a Prepared,
    is_prompt: &'a [bool],
}

impl RowsJob<'_> {
    /// Rows `r0..r1` for every token, `unpacked` holding at least `(r1 - r0) * krb` bytes when
    /// the rows are unpacked.
    fn rows(&self, r0: usize, r1: usize, unpacked: &mut [u8]) {
        let (w, prep) = (self.w, self.prep);
        let (wrb, krb, nb) = (w.row_bytes(), prep.krb, w.cols / 32);
        if prep.unpack {
            for r in r0..r1 {
                let (src, dst) = (
                    &w.data[r * wrb..(r + 1) * wrb],
                    &mut unpacked[(r - r0) * krb..(r - r0 + 1) * krb],
                );
                let ok = match prep.biased {
                    // SAFETY: `src` is one whole row of `nb` blocks of `w.ty`, `dst` holds
                    // `nb * 34` bytes; the CPU has the kernels' features.
                    Some(b) => unsafe { (b.unpack)(w.ty, nb, src.as_ptr(), dst.as_mut_ptr()) },
                    None => unpack_row_to_q8_0(w.ty, src, dst),
                };
                debug_assert!(ok);
            }
        }
        match prep.biased {
            Some(b) => self.rows_biased(b, r0, r1, unpacked),
            None => self.rows_dot(r0, r1, unpacked),
        }
    }

    /// [`Self::rows`] with [`BiasedQ8_0`]'s tiles over the biased rows in `unpacked`.
    fn rows_biased(&self, b: BiasedQ8_0, r0: usize, r1: usize, unpacked: &[u8]) {
        let (x, nt, rows, nb) = (self.x, self.x.n_tokens(), self.w.rows, self.w.cols / 32);
        let mut t0 = 0;
        while t0 < nt {
            let t1 = (t0 + TOKEN_BLOCK).min(nt);
            // SAFETY: `unpacked` holds rows r0..r1 biased, `krb = nb * 34` bytes each;
            // activation rows t0..t1 < nt lie in `x` at stride `row_bytes`, with `nb` scales
            // each in `xs` and `nb * 8` lane starts in `act_bias`; the outputs (t, r) for t in
            // t0..t1, r in r0..r1 lie in `y` and belong to this thread's chunk only; the CPU
            // has the kernels' features.
            unsafe {
                (b.rows)(
                    nb,
                    unpacked.as_ptr(),
                    r1 - r0,
                    x.row(t0).as_ptr(),
                    x.row_bytes(),
                    t1 - t0,
                    self.prep.xs.as_ptr().add(t0 * nb),
                    self.prep.act_bias.as_ptr().add(t0 * nb * 8),
                    self.y.at(t0 * rows + r0),
                    rows,
                )
            };
            t0 = t1;
        }
    }

    /// [`Self::rows`] with the one-row kernels, up to four tokens that share their arithmetic
    /// per call.
    fn rows_dot(&self, r0: usize, r1: usize, unpacked: &[u8]) {
        let (w, x, prep) = (self.w, self.x, self.prep);
        let (nt, rows, cols, nb) = (x.n_tokens(), w.rows, w.cols, w.cols / 32);
        let (wrb, xrb) = (w.row_bytes(), x.row_bytes());
        let mut t0 = 0;
        while t0 < nt {
            let t1 = (t0 + TOKEN_BLOCK).min(nt);
            for r in r0..r1 {
                let wr = if prep.unpack {
                    unpacked[(r - r0) * prep.krb..].as_ptr()
                } else {
                    w.data[r * wrb..].as_ptr()
                };
                let mut t = t0;
                while t < t1 {
                    // Up to four rows that share their arithmetic.
                    let prompt = self.is_prompt[t];
                    let mut nx = 1;
                    while nx < (t1 - t).min(4) && self.is_prompt[t + nx] == prompt {
                        nx += 1;
                    }
                    let dot = if prompt {
                        self.kernels.prompt_dot
                    } else {
                        prep.dot
                    };
                    let mut out = [0f32; 4];
                    let xt = x.row(t).as_ptr();
                    // SAFETY: row `r < rows` lies inside `w.data` (length checked), or its
                    // unpacked Q8_0 copy of `krb` bytes inside `unpacked`; activation rows
                    // t..t+nx < n_tokens lie inside `x` at stride `xrb`; `out` has 4 floats; nx
                    // in 1..=4; the kernel comes from the dispatch table (features detected).
                    // With `xs_dot`, `xs` holds `nb` scales for each of the `nt` rows.
                    unsafe {
                        match prep.xs_dot {
                            Some(f) => f(
                                cols,
                                wr,
                                xt,
                                xrb,
                                prep.xs.as_ptr().add(t * nb),
                                nb,
                                nx,
                                out.as_mut_ptr(),
                            ),
                            None => dot(cols, wr, xt, xrb, nx, out.as_mut_ptr()),
                        }
                    };
                    for (k, v) in out[..nx].iter().enumerate() {
                        // SAFETY: (t + k) < nt and r < rows, so the index is inside `y`; row r
                        // belongs to this thread's chunk only, so no other thread writes it.
                        unsafe { *self.y.at((t + k) * rows + r) = *v };
                    }
                    t += nx;
                }
            }
            t0 = t1;
        }
    }
}
