//! Quantized matrix × activation products, split across a [`ThreadPool`].

use std::sync::atomic::{AtomicUsize, Ordering};

use super::pool::{OutPtr, ThreadPool};
use crate::quant::{
    biased_q8_0, dot_q8_0_xs_fn, quantize_row_act, unpack_row_to_q8_0, vec_dot_type, GgmlType,
};

/// A weight matrix as stored in GGUF: `rows` output features, each a contiguous row of `cols`
/// input features of type `ty` (`ne[0] = cols`, `ne[1] = rows`).
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl QMatrix<'_> {
    fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.cols).unwrap_or_else(|| {
            panic!(
                "QMatrix: {} cols is not a whole number of {} blocks",
                self.cols, self.ty
            )
        })
    }
}

/// Activation rows quantized to one vec_dot type, in a reusable buffer (grows, never shrinks).
#[derive(Debug, Default)]
pub struct QuantizedActs {
    buf: Vec<u8>,
    n_tokens: usize,
    cols: usize,
    row_bytes: usize,
    ty: Option<GgmlType>,
}

/// Quantized bytes from which a call shares its rows among the pool's threads: below, a pass
/// of the pool costs more than it saves.
const PARALLEL_ACT_BYTES: usize = 1 << 15;

impl QuantizedActs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes `n_tokens` rows of `cols` floats from `x` to `vec_dot_type` the way ggml's CPU
    /// backend quantizes activations ([`quantize_row_act`]).
    pub fn quantize(&mut self, x: &[f32], n_tokens: usize, cols: usize, vec_dot_type: GgmlType) {
        self.quantize_with(None, x, n_tokens, cols, vec_dot_type)
    }

    /// [`quantize`](Self::quantize) with the rows shared among `pool`'s threads when there are
    /// many (a prompt): each row is quantized alone, so the bytes are the same.
    pub fn quantize_in(
        &mut self,
        pool: &ThreadPool,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
        vec_dot_type: GgmlType,
    ) {
        self.quantize_with(Some(pool), x, n_tokens, cols, vec_dot_type)
    }

    fn quantize_with(
        &mut self,
        pool: Option<&ThreadPool>,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
        vec_dot_type: GgmlType,
    ) {
        assert_eq!(
            x.len(),
            n_tokens * cols,
            "QuantizedActs::quantize: x has {} floats, expected {n_tokens} × {cols}",
            x.len()
        );
        let rb = vec_dot_type.row_bytes(cols).unwrap_or_else(|| {
            panic!("QuantizedActs: {cols} cols is not a whole number of {vec_dot_type} blocks")
        });
        let need = rb * n_tokens;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        let rows = |src: &[f32], dst: &mut [u8]| {
            for (src, dst) in src.chunks_exact(cols.max(1)).zip(dst.chunks_exact_mut(rb)) {
                quantize_row_act(vec_dot_type, src, dst);
            }
        };
        let threads = pool.map_or(1, |p| p.n_threads());
        match pool {
            Some(pool) if threads > 1 && n_tokens >= 2 * threads && need >= PARALLEL_ACT_BYTES => {
                pool.for_runs(
                    n_tokens,
                    (&mut self.buf[..need], rb),
                    (x, cols),
                    |dst, src| rows(src, dst),
                )
            }
            _ => rows(x, &mut self.buf[..need]),
        }
        self.n_tokens = n_tokens;
        self.cols = cols;
        self.row_bytes = rb;
        self.ty = Some(vec_dot_type);
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The vec_dot type of the rows. Panics before the first [`quantize`](Self::quantize).
    pub fn ty(&self) -> GgmlType {
        self.ty.expect("QuantizedActs: nothing quantized yet")
    }

    /// Bytes of one quantized row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Quantized row `t`.
    pub fn row(&self, t: usize) -> &[u8] {
        assert!(t < self.n_tokens);
        &self.buf[t * self.row_bytes..(t + 1) * self.row_bytes]
    }
}

/// Rows per work item: about `CHUNKS_PER_THREAD` items per thread, at least `MIN_ROW_CHUNK`
/// and at most `MAX_ROW_CHUNK` rows.
const MIN_ROW_CHUNK: usize = 16;
const MAX_ROW_CHUNK: usize = 256;
const CHUNKS_PER_THREAD: usize = 64;
/// Most per-thread work ranges (more threads share ranges).
const MAX_RANGES: usize = 16;

/// A work counter on its own cache line.
#[repr(align(64))]
struct PaddedCounter(AtomicUsize);

/// Tokens per block in prefill (their quantized rows stay in L1/L2 while a row chunk is done).
const TOKEN_BLOCK: usize = 32;
/// From this many tokens on, Q4_0/Q5_0 weight rows are unpacked to Q8_0 once per row chunk.
const UNPACK_MIN_TOKENS: usize = 8;
/// Below this many multiply-adds the product runs on the calling thread only.
const SERIAL_WORK: usize = 1 << 15;

/// `y[t * w.rows + r] = dot(W[r], x[t])` for every token `t < x.n_tokens()` and row
/// `r < w.rows`, with the rows split across the pool; every token with decode arithmetic.
///
/// Panics when `x.ty() != vec_dot_type(w.ty)` or the sizes do not match (programmer errors).
pub fn matmul(pool: &ThreadPool, w: &QMatrix, x: &QuantizedActs, y: &mut [f32]) {
    matmul_rows(pool, w, x, y, &[]);
}

/// Where an activation row sits among the rows llama.cpp would compute it with: the length of
/// its prompt (0 for a generated token, which llama.cpp computes on its own) and its index in
/// that prompt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptSlot {
    pub len: usize,
    pub index: usize,
    /// Whether every token of the prompt wants its logits. Otherwise llama.cpp computes the
    /// last layer after attention, and the output projection, only for the tokens that want
    /// logits (the last one): as a row of its own.
    pub all_logits: bool,
}

/// llama.cpp's default micro-batch: it computes a longer prompt 512 tokens at a time.
const LLAMA_UBATCH: usize = 512;

/// [`PromptSlot::matmul_class`] bits. In a micro-batch of 2+ rows: sgemm for F32/F16/BF16.
pub const CLASS_UBATCH_2: u8 = 1;
/// In a micro-batch of 8+ rows: the tiled K-quant kernels.
pub const CLASS_UBATCH_8: u8 = 2;
/// Among the micro-batch's rows in whole groups of four: the repacked Q2_K and Q4_K gemms.
pub const CLASS_WHOLE_FOUR: u8 = 4;

impl PromptSlot {
    /// A generated token.
    pub const GENERATED: PromptSlot = PromptSlot {
        len: 0,
        index: 0,
        all_logits: true,
    };

    /// A row that gets every batched kernel llama.cpp has for its matrix's type (one in the
    /// middle of a long prompt).
    pub const BATCHED: PromptSlot = PromptSlot {
        len: LLAMA_UBATCH,
        index: 0,
        all_logits: true,
    };

    /// The slot of the row in llama.cpp's last layer after attention and in the output
    /// projection, which it computes for the tokens that want logits only.
    pub fn for_outputs(self) -> PromptSlot {
        if self.all_logits {
            self
        } else {
            PromptSlot::GENERATED
        }
    }

    /// The number of tokens of the llama.cpp micro-batch the row falls in (0 for a generated
    /// token).
    pub fn ubatch_len(self) -> usize {
        self.ubatch().0
    }

    /// Which of llama.cpp's product kernels the row gets, as bits (`CLASS_*`): two rows with
    /// the same class are computed with the same arithmetic by [`matmul_rows`].
    pub fn matmul_class(self) -> u8 {
        let (len, index) = self.ubatch();
        let mut class = 0;
        if len >= 2 {
            class |= CLASS_UBATCH_2;
        }
        if len >= 8 {
            class |= CLASS_UBATCH_8;
        }
        if index < len - len % 4 {
            class |= CLASS_WHOLE_FOUR;
        }
        class
    }

    /// The size of the llama.cpp micro-batch the row falls in, and its index there.
    fn ubatch(self) -> (usize, usize) {
        let start = self.index / LLAMA_UBATCH * LLAMA_UBATCH;
        (
            self.len.saturating_sub(start).min(LLAMA_UBATCH),
            self.index - start,
        )
    }
}

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
    if nt == 0 || w.rows == 0 {
        return;
    }
    let xrb = x.row_bytes();
    let kernels = crate::quant::dispatch_kernels();
    // llama.cpp repacks Q4_0 and IQ4_NL matrices whose row count is a multiple of 8 on x86 and
    // computes them with its interleaved kernels (one FMA per block sum); its AVX-512 build
    // repacks Q2_K and Q4_K matrices with a multiple of 8 rows (gemv for one row, gemm for a
    // prompt's rows in groups of four); others go through its vec_dot and tiled kernels.
    let repacked = w.rows.is_multiple_of(8)
        && matches!(
            w.ty,
            GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::Q2_K | GgmlType::Q4_K
        );
    let q4_0_repacked = repacked && w.ty == GgmlType::Q4_0;
    let dot = match w.ty {
        GgmlType::Q4_0 if repacked => kernels.q4_0_block_sums,
        GgmlType::IQ4_NL if repacked => kernels.iq4_nl_block_sums,
        GgmlType::Q2_K if repacked => kernels.q2_k_block_sums,
        GgmlType::Q4_K if !repacked => kernels.q4_k_vec_dot,
        _ => kernels.dot_fn(w.ty),
    };
    // The batched kernel llama.cpp has for this weight type, and which rows it takes.
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
    let takes_prompt_dot = |t: usize| {
        let class = slots.get(t).copied().unwrap_or_default().matmul_class();
        let bit = match w.ty {
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
        class & bit != 0
    };
    // Decided once per token here, not once per token and weight row in the loop below.
    let is_prompt: Vec<bool> = (0..nt).map(takes_prompt_dot).collect();
    let (rows, cols) = (w.rows, w.cols);
    let wp = w.data.as_ptr() as usize;
    let xp = x.buf.as_ptr() as usize;
    let yp = OutPtr(y.as_mut_ptr());
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

    // With many tokens, Q4_0/Q5_0 rows are unpacked once per row chunk into Q8_0 rows (same
    // scales and integers, so the Q8_0 kernel gives bit-identical results) instead of once per
    // four tokens.
    let unpack_q8_0 = nt >= UNPACK_MIN_TOKENS
        && !q4_0_repacked
        && matches!(w.ty, GgmlType::Q4_0 | GgmlType::Q5_0);
    let kernel_ty = if unpack_q8_0 { GgmlType::Q8_0 } else { w.ty };
    let many_q8_0 = nt >= UNPACK_MIN_TOKENS && kernel_ty == GgmlType::Q8_0;
    // With VNNI, those Q8_0 products take tiles of rows by tokens over rows stored biased
    // (Q8_0 rows copied so too), the same bits again.
    let biased = if many_q8_0 { biased_q8_0() } else { None };
    let unpack = unpack_q8_0 || biased.is_some();
    let krb = if unpack {
        GgmlType::Q8_0
            .row_bytes(cols)
            .expect("Q8_0 and Q4_0/Q5_0 share the block size")
    } else {
        wrb
    };
    let dot = if unpack_q8_0 {
        kernels.dot_fn(GgmlType::Q8_0)
    } else {
        dot
    };

    // With many tokens and a Q8_0 kernel, the activation block scales are converted to f32
    // once here rather than once per weight row (same values, so the same results).
    let xs_dot = if many_q8_0 && biased.is_none() {
        dot_q8_0_xs_fn()
    } else {
        None
    };
    let nb = cols / 32;
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
    let biasp = act_bias.as_ptr() as usize;
    let xsp = xs.as_ptr() as usize;

    let work = |ti: usize, _: usize| {
        let mut unpacked = if unpack {
            vec![0u8; row_chunk * krb]
        } else {
            Vec::new()
        };
        let mut k = 0;
        while k < n_ranges {
            let range = (ti + k) % n_ranges;
            let c = counters[range].0.fetch_add(1, Ordering::Relaxed);
            if c >= range_end(range) {
                k += 1;
                continue;
            }
            let (r0, r1) = (c * row_chunk, ((c + 1) * row_chunk).min(rows));
            if unpack {
                for r in r0..r1 {
                    let (src, dst) = (
                        &w.data[r * wrb..(r + 1) * wrb],
                        &mut unpacked[(r - r0) * krb..(r - r0 + 1) * krb],
                    );
                    let ok = match biased {
                        // SAFETY: `src` is one whole row of `nb` blocks of `w.ty`, `dst` holds
                        // `nb * 34` bytes; the CPU has the kernels' features.
                        Some(b) => unsafe { (b.unpack)(w.ty, nb, src.as_ptr(), dst.as_mut_ptr()) },
                        None => unpack_row_to_q8_0(w.ty, src, dst),
                    };
                    debug_assert!(ok);
                }
            }
            if let Some(b) = biased {
                let mut t0 = 0;
                while t0 < nt {
                    let t1 = (t0 + TOKEN_BLOCK).min(nt);
                    // SAFETY: `unpacked` holds rows r0..r1 biased, `krb = nb * 34` bytes
                    // each; activation rows t0..t1 < nt lie in `x.buf` at stride `xrb`, with
                    // `nb` scales each in `xs` and `nb * 8` lane starts in `act_bias`; the
                    // outputs (t, r) for t in t0..t1, r in r0..r1 lie in `y` and belong to
                    // this thread's chunk only; the CPU has the kernels' features.
                    unsafe {
                        (b.rows)(
                            nb,
                            unpacked.as_ptr(),
                            r1 - r0,
                            (xp + t0 * xrb) as *const u8,
                            xrb,
                            t1 - t0,
                            (xsp as *const f32).add(t0 * nb),
                            (biasp as *const i32).add(t0 * nb * 8),
                            yp.at(t0 * rows + r0),
                            rows,
                        )
                    };
                    t0 = t1;
                }
                continue;
            }
            let mut t0 = 0;
            while t0 < nt {
                let t1 = (t0 + TOKEN_BLOCK).min(nt);
                for r in r0..r1 {
                    let wr = if unpack {
                        unpacked[(r - r0) * krb..].as_ptr()
                    } else {
                        (wp + r * wrb) as *const u8
                    };
                    let mut t = t0;
                    while t < t1 {
                        // Up to four rows that share their arithmetic.
                        let prompt = is_prompt[t];
                        let mut nx = 1;
                        while nx < (t1 - t).min(4) && is_prompt[t + nx] == prompt {
                            nx += 1;
                        }
                        let dot = if prompt { prompt_dot } else { dot };
                        let mut out = [0f32; 4];
                        // SAFETY: row `r < rows` lies inside `w.data` (length checked above), or
                        // its unpacked Q8_0 copy of `krb` bytes inside `unpacked`;
                        // activation rows t..t+nx < n_tokens lie inside `x.buf` at stride
                        // `xrb`; `out` has 4 floats; nx in 1..=4; the kernel comes from the
                        // dispatch table (features detected).
                        // With `xs_dot`, `xs` holds `nb` scales for each of the `nt` rows.
                        unsafe {
                            match xs_dot {
                                Some(f) => f(
                                    cols,
                                    wr,
                                    (xp + t * xrb) as *const u8,
                                    xrb,
                                    (xsp as *const f32).add(t * nb),
                                    nb,
                                    nx,
                                    out.as_mut_ptr(),
                                ),
                                None => dot(
                                    cols,
                                    wr,
                                    (xp + t * xrb) as *const u8,
                                    xrb,
                                    nx,
                                    out.as_mut_ptr(),
                                ),
                            }
                        };
                        for (k, v) in out[..nx].iter().enumerate() {
                            // SAFETY: (t + k) < nt and r < rows, so the index is inside `y`;
                            // row r belongs to this thread's chunk only, so no other thread
                            // writes it.
                            unsafe { *yp.at((t + k) * rows + r) = *v };
                        }
                        t += nx;
                    }
                }
                t0 = t1;
            }
        }
    };

    if pool.n_threads() == 1 || rows * cols * nt <= SERIAL_WORK || n_chunks == 1 {
        work(0, 1);
    } else {
        pool.run(work);
    }
}

/// Quantizes `x` (`n_tokens` rows of `w.cols` floats) into `scratch`, then [`matmul`].
pub fn matmul_f32(
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    scratch: &mut QuantizedActs,
) {
    scratch.quantize(x, n_tokens, w.cols, vec_dot_type(w.ty));
    matmul(pool, w, scratch, y);
}

#[cfg(test)]
mod tests;
