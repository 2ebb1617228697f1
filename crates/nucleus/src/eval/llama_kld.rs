//! llama.cpp's KL-divergence base file, written from a nucleus run, so that llama.cpp's own tool
//! measures how far its build on this machine is from nucleus:
//! `llama-perplexity -m MODEL --kl-divergence-base FILE --kl-divergence` (it reads the tokens
//! from the file and reports mean KL divergence and "same top p"); and read back, so that a
//! nucleus run is measured against the same file with llama.cpp's formula ([`compare_row`]):
//! over the whole vocabulary, where [`super::kl`]'s own base keeps the top 32 tokens and a
//! bucket (a lower bound, far below the full KL when the distribution is flat). Two runs
//! measured against one base this way are measured alike, whichever engine made them.
//!
//! The format (`tools/perplexity/perplexity.cpp`): `_logits_`, then `n_ctx` (u32), `n_vocab` and
//! `n_chunk` (i32), the `n_chunk · n_ctx` evaluated tokens (i32), then for every scored position
//! of every window (the second half, as in [`super::perplexity`]) a row of
//! `2·⌈n_vocab/2⌉ + 4` u16: the f32 `scale` and `min_log_prob`, then each logit's offset above
//! `min_logit = max(min, max − 16)` in steps of `scale = (max − min_logit)/65535`, rounded to
//! nearest, even on ties (llama.cpp's `nearest_int`).

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use crate::tokenizer::TokenId;

/// Writes a llama.cpp KL-divergence base, a scored position at a time.
pub struct LlamaKldWriter<W: Write> {
    out: W,
    n_vocab: usize,
    row: Vec<u16>,
    /// `row` as little-endian bytes (reused: a row is n_vocab values).
    bytes: Vec<u8>,
}

impl<W: Write> LlamaKldWriter<W> {
    /// Writes the header: `tokens` must hold at least `n_chunk · n_ctx` tokens (the text's,
    /// before the windows' first tokens are replaced by BOS, as llama.cpp writes them).
    pub fn new(
        mut out: W,
        n_ctx: usize,
        n_vocab: usize,
        n_chunk: usize,
        tokens: &[TokenId],
    ) -> io::Result<Self> {
        let too_big = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
        let n_ctx32 = u32::try_from(n_ctx).map_err(|_| too_big("n_ctx above u32"))?;
        let n_vocab32 = i32::try_from(n_vocab).map_err(|_| too_big("n_vocab above i32"))?;
        let n_chunk32 = i32::try_from(n_chunk).map_err(|_| too_big("n_chunk above i32"))?;
        let n_tokens = n_chunk * n_ctx;
        if tokens.len() < n_tokens {
            return Err(too_big("fewer tokens than n_chunk windows of n_ctx"));
        }
        out.write_all(b"_logits_")?;
        out.write_all(&n_ctx32.to_le_bytes())?;
        out.write_all(&n_vocab32.to_le_bytes())?;
        out.write_all(&n_chunk32.to_le_bytes())?;
        for &t in &tokens[..n_tokens] {
            out.write_all(&(t as i32).to_le_bytes())?;
        }
        Ok(LlamaKldWriter {
            out,
            n_vocab,
            row: vec![0u16; row_len(n_vocab)],
            bytes: Vec::with_capacity(2 * row_len(n_vocab)),
        })
    }

    /// Writes one scored position's row from its logits.
    pub fn push(&mut self, logits: &[f32]) -> io::Result<()> {
        if logits.len() != self.n_vocab {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} logits for a vocabulary of {}",
                    logits.len(),
                    self.n_vocab
                ),
            ));
        }
        encode_row(logits, &mut self.row);
        self.bytes.clear();
        for v in &self.row {
            self.bytes.extend_from_slice(&v.to_le_bytes());
        }
        self.out.write_all(&self.bytes)
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// u16 per row: two f32, the vocabulary rounded up to even.
fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// llama.cpp's `log_softmax` of a base run, into `row` (of [`row_len`]).
fn encode_row(logits: &[f32], row: &mut [u16]) {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let min = logits
        .iter()
        .copied()
        .fold(logits[0], f32::min)
        .max(max - 16.0);
    let sum_exp: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    let log_sum_exp = sum_exp.ln() as f32;
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0;
    row.fill(0);
    let (s, m) = (scale.to_le_bytes(), min_log_prob.to_le_bytes());
    row[0] = u16::from_le_bytes([s[0], s[1]]);
    row[1] = u16::from_le_bytes([s[2], s[3]]);
    row[2] = u16::from_le_bytes([m[0], m[1]]);
    row[3] = u16::from_le_bytes([m[2], m[3]]);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (q, &l) in row[4..].iter_mut().zip(logits) {
            *q = if l > min {
                (inv * (l - min)).round_ties_even() as u16
            } else {
                0
            };
        }
    }
}

/// A llama.cpp KL-divergence base being read, a scored position at a time, in the order
/// [`LlamaKldWriter`] (and llama-perplexity) write them.
pub struct LlamaKldBase {
    input: BufReader<File>,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// The `n_chunk · n_ctx` evaluated tokens.
    pub tokens: Vec<TokenId>,
    /// Rows not yet read.
    rows_left: usize,
    row: Vec<u16>,
    bytes: Vec<u8>,
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_i32(r: &mut impl Read) -> io::Result<i32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)
        .map_err(|_| bad("llama.cpp KL base is truncated"))?;
    Ok(i32::from_le_bytes(b))
}

/// Scored positions of a window of `n_ctx` (llama-perplexity's: its second half, less the
/// last token, which has nothing to predict).
fn scored_per_window(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

impl LlamaKldBase {
    /// Opens a base, checking its header and its length against each other before reading on.
    pub fn open(path: &Path) -> io::Result<LlamaKldBase> {
        let len = std::fs::metadata(path)?.len();
        let mut input = BufReader::new(File::open(path)?);
        let mut magic = [0u8; 8];
        input
            .read_exact(&mut magic)
            .map_err(|_| bad("not a llama.cpp KL base (too short)"))?;
        if &magic != b"_logits_" {
            return Err(bad(
                "not a llama.cpp KL base (it does not start with _logits_)",
            ));
        }
        let [n_ctx, n_vocab, n_chunk] = [0; 3].map(|_| read_i32(&mut input));
        let (n_ctx, n_vocab, n_chunk) = (n_ctx? as u32 as u64, n_vocab?, n_chunk?);
        if n_ctx < 4 || n_vocab < 1 || n_chunk < 1 {
            return Err(bad(format!(
                "corrupt llama.cpp KL base header: n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}"
            )));
        }
        let (n_vocab, n_chunk) = (n_vocab as u64, n_chunk as u64);
        let n_tokens = n_ctx * n_chunk;
        let rows = n_chunk * scored_per_window(n_ctx as usize) as u64;
        let row_bytes = 2 * row_len(n_vocab as usize) as u64;
        let want = rows
            .checked_mul(row_bytes)
            .and_then(|b| b.checked_add(20 + 4 * n_tokens));
        if want != Some(len) {
            return Err(bad(format!(
                "llama.cpp KL base is truncated or corrupt: {n_chunk} windows of {n_ctx} over {n_vocab} tokens do not fill its {len} bytes"
            )));
        }
        let tokens = (0..n_tokens)
            .map(|_| read_i32(&mut input).map(|t| t as TokenId))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(LlamaKldBase {
            input,
            n_ctx: n_ctx as usize,
            n_vocab: n_vocab as usize,
            n_chunk: n_chunk as usize,
            tokens,
            rows_left: rows as usize,
            row: vec![0; row_len(n_vocab as usize)],
            bytes: vec![0; row_bytes as usize],
        })
    }

    /// The next scored position's row: f32 scale and min log-probability in its first four
    /// u16, then a u16 per token.
    pub fn next_row(&mut self) -> io::Result<&[u16]> {
        if self.rows_left == 0 {
            return Err(bad("the llama.cpp KL base has no more positions"));
        }
        self.input.read_exact(&mut self.bytes)?;
        for (v, b) in self.row.iter_mut().zip(self.bytes.chunks_exact(2)) {
            *v = u16::from_le_bytes([b[0], b[1]]);
        }
        self.rows_left -= 1;
        Ok(&self.row)
    }

    /// Positions not yet read.
    pub fn rows_left(&self) -> usize {
        self.rows_left
    }
}

/// One position of a run against a base row, by llama-perplexity's `log_softmax` for
/// `--kl-divergence`, operation for operation (f32 as it has them, sums in f64).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowComparison {
    /// KL(base ‖ run) over every token whose base log-probability is above −16.
    pub kl: f64,
    /// Whether the run's most likely token is the base's (the first of equals, in each).
    pub same_top: bool,
    /// −ln p(target), in the run and in the base.
    pub nll: f64,
    pub nll_base: f64,
}

/// Compares a run's `logits` with a base `row` at a position predicting `target`.
pub fn compare_row(logits: &[f32], row: &[u16], target: usize) -> RowComparison {
    let (mut max_logit, mut imax) = (logits[0], 0);
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > max_logit {
            (max_logit, imax) = (l, i);
        }
    }
    let sum_exp: f64 = logits.iter().map(|&l| (l - max_logit).exp() as f64).sum();
    let log_sum_exp = sum_exp.ln() as f32;
    let word = |i: usize| f32::from_bits(row[i] as u32 | (row[i + 1] as u32) << 16);
    let (scale, min_log_prob) = (word(0), word(2));
    let base = &row[4..4 + logits.len()];
    let nll = max_logit + log_sum_exp - logits[target];
    let nll_base = -(scale * base[target] as f32 + min_log_prob);
    let log_norm = max_logit + log_sum_exp;
    let (mut kl, mut imax_base, mut top_base) = (0.0f64, 0, 0.0f32);
    for (i, (&q, &l)) in base.iter().zip(logits).enumerate() {
        let p_log = scale * q as f32 + min_log_prob;
        if i == 0 || p_log > top_base {
            (top_base, imax_base) = (p_log, i);
        }
        if p_log > -16.0 {
            kl += (p_log.exp() * (p_log - l + log_norm)) as f64;
        }
    }
    RowComparison {
        kl,
        same_top: imax == imax_base,
        nll: nll as f64,
        nll_base: nll_base as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header as llama.cpp reads it, and rows that decode to the log-probabilities within
    /// half a step.
    #[test]
    fn rows_decode_to_the_log_probabilities() {
        let tokens: Vec<TokenId> = (0..20).collect();
        let mut w = LlamaKldWriter::new(Vec::new(), 4, 5, 2, &tokens).unwrap();
        let logits = [
            [1.0f32, -3.0, 2.5, 0.0, -40.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            [7.0, 6.5, -2.0, 3.25, 1.0],
        ];
        for l in &logits {
            w.push(l).unwrap();
        }
        let bytes = w.finish().unwrap();
        assert_eq!(&bytes[..8], b"_logits_");
        let word = |i: usize| i32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        assert_eq!((word(8), word(12), word(16)), (4, 5, 2));
        assert_eq!((word(20), word(24), word(48)), (0, 1, 7));
        let rows = &bytes[20 + 4 * 8..];
        let nv = row_len(5);
        assert_eq!(nv, 10);
        assert_eq!(rows.len(), 3 * nv * 2);
        for (r, l) in logits.iter().enumerate() {
            let u =
                |i: usize| u16::from_le_bytes([rows[2 * (r * nv + i)], rows[2 * (r * nv + i) + 1]]);
            let f = |i: usize| f32::from_bits(u(i) as u32 | (u(i + 1) as u32) << 16);
            let (scale, min_log_prob) = (f(0), f(2));
            let max = l.iter().copied().fold(f32::MIN, f32::max);
            let lse = max as f64
                + l.iter()
                    .map(|&x| ((x - max) as f64).exp())
                    .sum::<f64>()
                    .ln();
            let floor = (max - 16.0).max(l.iter().copied().fold(f32::MAX, f32::min));
            for (i, &x) in l.iter().enumerate() {
                let want = (x.max(floor) as f64 - lse) as f32;
                let got = min_log_prob + scale * u(4 + i) as f32;
                assert!(
                    (got - want).abs() <= scale / 2.0 + 1e-5,
                    "row {r} token {i}: {got} vs {want}"
                );
            }
        }
        assert!(LlamaKldWriter::new(Vec::new(), 4, 5, 6, &tokens).is_err());
    }

    /// Logits of `n` tokens from a seed, spread `spread` around 0.
    fn logits(seed: u64, n: usize, spread: f32) -> Vec<f32> {
        let mut rng = crate::kernels::test_rng::Rng(seed);
        (0..n).map(|_| spread * rng.f32()).collect()
    }

    /// A base written to a temporary file from `rows` (windows of 8: 3 scored each).
    fn base_file(name: &str, rows: &[Vec<f32>]) -> std::path::PathBuf {
        let n_chunk = rows.len() / scored_per_window(8);
        let tokens: Vec<TokenId> = (0..8 * n_chunk as u32).collect();
        let n_vocab = rows[0].len();
        let mut w = LlamaKldWriter::new(Vec::new(), 8, n_vocab, n_chunk, &tokens).unwrap();
        for r in rows {
            w.push(r).unwrap();
        }
        let path = std::env::temp_dir().join(format!("nucleus-{name}-{}.kld", std::process::id()));
        std::fs::write(&path, w.finish().unwrap()).unwrap();
        path
    }

    /// Read back, a run against its own base is at KL ~0 with the same top token and NLL; a
    /// run with other logits is at the full KL (within the u16 steps of the base), on flat
    /// and on peaked distributions, where the top-32 bucket bound is far below it when flat.
    #[test]
    fn a_base_read_back_measures_the_full_kl() {
        let n_vocab = 3000;
        let base: Vec<Vec<f32>> = (0..6)
            .map(|i| logits(i + 1, n_vocab, if i % 2 == 0 { 0.5 } else { 12.0 }))
            .collect();
        let path = base_file("full-kl", &base);
        let mut reader = LlamaKldBase::open(&path).unwrap();
        assert_eq!(
            (reader.n_ctx, reader.n_vocab, reader.n_chunk),
            (8, n_vocab, 2)
        );
        assert_eq!(reader.tokens, (0..16).collect::<Vec<TokenId>>());
        assert_eq!(reader.rows_left(), 6);
        for (i, b) in base.iter().enumerate() {
            let row = reader.next_row().unwrap().to_vec();
            let same = compare_row(b, &row, 7);
            assert!(same.kl.abs() < 1e-5, "row {i}: {same:?}");
            assert!((same.nll - same.nll_base).abs() < 1e-3, "row {i}: {same:?}");
            // The base's top is the first of its largest u16: the run's top unless two
            // logits are within a step of the base's quantization (likelier when flat).
            let top = (0..n_vocab).fold(0, |t, j| if b[j] > b[t] { j } else { t });
            assert_eq!(
                same.same_top,
                row[4 + top] == *row[4..].iter().max().unwrap()
                    && row[4..4 + top].iter().all(|&q| q < row[4 + top]),
                "row {i}"
            );
            if i % 2 == 1 {
                assert!(same.same_top, "peaked row {i}");
            }
            let other: Vec<f32> = b
                .iter()
                .zip(logits(100 + i as u64, n_vocab, 0.05))
                .map(|(a, d)| a + d)
                .collect();
            let got = compare_row(&other, &row, 7).kl;
            let want = crate::eval::kl::tests::exact_kl(b, &other);
            // Within 3 %: llama.cpp's rows floor the log-probabilities at 16 below the top.
            assert!(
                (got - want).abs() < 0.03 * want + 1e-6,
                "row {i}: {got} vs {want}"
            );
            let bucketed = crate::eval::kl::kl_top_k(
                &crate::eval::kl::BasePosition {
                    target_index: 0,
                    nll: 0.0,
                    lse: crate::eval::kl::log_sum_exp(b),
                    top: crate::eval::kl::top_k(b, 32),
                },
                &other,
            );
            assert!(bucketed <= want * 1.001, "row {i}: {bucketed} vs {want}");
            if i % 2 == 0 {
                assert!(bucketed < want / 5.0, "flat row {i}: {bucketed} vs {want}");
            }
        }
        assert!(reader.next_row().is_err());
        std::fs::remove_file(&path).unwrap();
    }

    /// The top token: the first of equals in each, so a tie breaks the same way in both.
    #[test]
    fn the_top_token_is_the_first_of_equals() {
        let mut row = vec![0u16; row_len(4)];
        encode_row(&[1.0, 3.0, 3.0, 0.0], &mut row);
        assert!(compare_row(&[1.0, 3.0, 3.0, 0.0], &row, 0).same_top);
        assert!(!compare_row(&[1.0, 3.0, 3.5, 0.0], &row, 0).same_top);
    }

    /// Files that are not bases, or whose header disagrees with their length, are errors
    /// before anything is read on.
    #[test]
    fn malformed_bases_are_errors() {
        let base: Vec<Vec<f32>> = (0..3).map(|i| logits(i + 7, 10, 2.0)).collect();
        let path = base_file("malformed", &base);
        let bytes = std::fs::read(&path).unwrap();
        let cases: [(&str, Vec<u8>); 4] = [
            ("short", bytes[..5].to_vec()),
            ("magic", [b"_logitz_", &bytes[8..]].concat()),
            ("truncated", bytes[..bytes.len() - 2].to_vec()),
            (
                "n_chunk",
                [&bytes[..16], &9i32.to_le_bytes()[..], &bytes[20..]].concat(),
            ),
        ];
        for (what, b) in cases {
            std::fs::write(&path, b).unwrap();
            let e = LlamaKldBase::open(&path).err();
            assert!(e.is_some(), "{what} was accepted");
            assert_eq!(e.unwrap().kind(), io::ErrorKind::InvalidData, "{what}");
        }
        std::fs::remove_file(&path).unwrap();
    }
}
