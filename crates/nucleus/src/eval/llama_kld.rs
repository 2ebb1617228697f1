//! llama.cpp's KL-divergence base file, written from a nucleus run, so that llama.cpp's own tool
//! measures how far its build on this machine is from nucleus:
//! `llama-perplexity -m MODEL --kl-divergence-base FILE --kl-divergence` (it reads the tokens
//! from the file and reports mean KL divergence and "same top p").
//!
//! The format (`tools/perplexity/perplexity.cpp`): `_logits_`, then `n_ctx` (u32), `n_vocab` and
//! `n_chunk` (i32), the `n_chunk · n_ctx` evaluated tokens (i32), then for every scored position
//! of every window (the second half, as in [`super::perplexity`]) a row of
//! `2·⌈n_vocab/2⌉ + 4` u16: the f32 `scale` and `min_log_prob`, then each logit's offset above
//! `min_logit = max(min, max − 16)` in steps of `scale = (max − min_logit)/65535`, rounded to
//! nearest, even on ties (llama.cpp's `nearest_int`).

use std::io::{self, Write};

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
}
