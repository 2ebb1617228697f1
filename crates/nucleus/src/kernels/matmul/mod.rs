//! Quantized matrix × activation products, split across a [`ThreadPool`].

use std::sync::atomic::AtomicUsize;

use super::pool::{OutPtr, ThreadPool};
use crate::quant::{quantize_row_act, vec_dot_type, GgmlType};

mod rows;
pub use rows::matmul_rows;

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

    /// The rows `rows` of `src`, in that order: what quantizing those rows of its input would
    /// have made (each row is quantized alone).
    pub fn gather(&mut self, src: &QuantizedActs, rows: impl ExactSizeIterator<Item = usize>) {
        let (n, rb) = (rows.len(), src.row_bytes);
        if self.buf.len() < n * rb {
            self.buf.resize(n * rb, 0);
        }
        for (dst, t) in self.buf.chunks_exact_mut(rb.max(1)).zip(rows) {
            dst.copy_from_slice(src.row(t));
        }
        self.n_tokens = n;
        self.cols = src.cols;
        self.row_bytes = rb;
        self.ty = src.ty;
    }

    /// Row `t` alone, as a product of one token (decode) reads it (the tests).
    #[cfg(test)]
    pub(crate) fn copy_row(&self, t: usize) -> QuantizedActs {
        QuantizedActs {
            buf: self.row(t).to_vec(),
            n_tokens: 1,
            ..*self
        }
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
