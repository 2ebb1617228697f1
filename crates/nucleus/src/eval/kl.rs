//! KL divergence between two runs over the same text: how far one arithmetic (a quantized KV
//! cache, other kernels) moves the model's next-token distributions from a base run.
//!
//! The base run saves, for every scored position, its `k` most likely tokens with their
//! logits, the log-sum-exp of the whole row (so their log-probabilities are exact) and the NLL
//! of the true next token (for its perplexity). The full rows (150k floats a token) would be
//! gigabytes. The comparison computes, per position, the KL divergence KL(base ‖ new) over
//! the base's top-k tokens plus one bucket holding the rest of the mass in each run:
//!
//!   Σ_{i ∈ top-k} p_i ln(p_i / q_i) + p_rest ln(p_rest / q_rest)
//!
//! which, merging tokens, can only be below the full KL (the data-processing inequality), and
//! equals it when the top-k hold all the mass. With k = 32 the rest is usually well under 1 %
//! of the mass. Top-1 agreement compares the base's most likely token with the new run's.
//!
//! File format (little-endian): `NUCKLDB1`, u32 version (1), u32 n_vocab, u32 n_ctx, u32 k,
//! u32 mode (0: windows, 1: stream), u32 sink blocks, u64 token count and the text's token ids
//! (u32 each), u64 position count, then per position: u32 target index, f32 NLL, f64
//! log-sum-exp (f64: the top-k's probabilities must sum to 1 when k covers the vocabulary),
//! k × (u32 token, f32 logit), most likely first.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use super::perplexity::{Mode, NllStats, Scored};
use crate::tokenizer::TokenId;

const MAGIC: &[u8; 8] = b"NUCKLDB1";
const VERSION: u32 = 1;

/// What a base run was made with; a comparison must match it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseHeader {
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub k: usize,
    pub mode: Mode,
    pub tokens: Vec<TokenId>,
}

/// One saved position of the base run.
#[derive(Clone, Debug, PartialEq)]
pub struct BasePosition {
    pub target_index: usize,
    pub nll: f32,
    pub lse: f64,
    /// (token, logit), most likely first.
    pub top: Vec<(TokenId, f32)>,
}

/// log Σ exp(logits), in f64.
pub(crate) fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    max + logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

/// The `k` largest logits with their tokens, largest first (ties: lower id first).
pub fn top_k(logits: &[f32], k: usize) -> Vec<(TokenId, f32)> {
    let mut ids: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(ids.len());
    let cmp = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    if k < ids.len() {
        ids.select_nth_unstable_by(k, cmp);
        ids.truncate(k);
    }
    ids.sort_by(cmp);
    ids.into_iter().map(|i| (i as TokenId, logits[i])).collect()
}

/// Writes a base run as it is scored.
pub struct BaseWriter {
    out: BufWriter<File>,
    k: usize,
    positions: u64,
    count_offset: u64,
}

fn mode_words(mode: Mode) -> [u32; 2] {
    match mode {
        Mode::Windows => [0, 0],
        Mode::Stream { sink_blocks } => [1, sink_blocks as u32],
    }
}

impl BaseWriter {
    pub fn create(path: &Path, header: &BaseHeader) -> std::io::Result<BaseWriter> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(MAGIC)?;
        let [mode, sinks] = mode_words(header.mode);
        for v in [
            VERSION,
            header.n_vocab as u32,
            header.n_ctx as u32,
            header.k as u32,
            mode,
            sinks,
        ] {
            out.write_all(&v.to_le_bytes())?;
        }
        out.write_all(&(header.tokens.len() as u64).to_le_bytes())?;
        for t in &header.tokens {
            out.write_all(&t.to_le_bytes())?;
        }
        let count_offset = (8 + 6 * 4 + 8 + 4 * header.tokens.len()) as u64;
        out.write_all(&0u64.to_le_bytes())?; // the position count, written at the end
        Ok(BaseWriter {
            out,
            k: header.k,
            positions: 0,
            count_offset,
        })
    }

    pub fn push(&mut self, s: &Scored) -> std::io::Result<()> {
        let lse = log_sum_exp(s.logits);
        self.out.write_all(&(s.target_index as u32).to_le_bytes())?;
        self.out.write_all(&(s.nll as f32).to_le_bytes())?;
        self.out.write_all(&lse.to_le_bytes())?;
        for (id, l) in top_k(s.logits, self.k) {
            self.out.write_all(&id.to_le_bytes())?;
            self.out.write_all(&l.to_le_bytes())?;
        }
        self.positions += 1;
        Ok(())
    }

    pub fn finish(self) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom};
        let mut f = self.out.into_inner().map_err(|e| e.into_error())?;
        f.seek(SeekFrom::Start(self.count_offset))?;
        f.write_all(&self.positions.to_le_bytes())?;
        f.sync_all()
    }
}

/// A saved base run.
pub struct Base {
    pub header: BaseHeader,
    pub positions: Vec<BasePosition>,
}

fn bad(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

impl Base {
    /// Reads a base file, checking its sizes against the file's length before allocating.
    pub fn load(path: &Path) -> std::io::Result<Base> {
        let len = std::fs::metadata(path)?.len();
        let mut r = BufReader::new(File::open(path)?);
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)
            .map_err(|_| bad("not a KL-divergence base file (too short)"))?;
        if &magic != MAGIC {
            return Err(bad("not a KL-divergence base file (bad magic)"));
        }
        let mut u32s = [0u32; 6];
        for v in u32s.iter_mut() {
            *v = read_u32(&mut r)?;
        }
        let [version, n_vocab, n_ctx, k, mode, sinks] = u32s;
        if version != VERSION {
            return Err(bad(format!(
                "KL base version {version}; this build reads {VERSION}"
            )));
        }
        let mode = match mode {
            0 => Mode::Windows,
            1 => Mode::Stream {
                sink_blocks: sinks as usize,
            },
            m => return Err(bad(format!("unknown evaluation mode {m}"))),
        };
        let n_tokens = read_u64(&mut r)?;
        let (k, n_vocab) = (k as usize, n_vocab as usize);
        if k == 0 || k > n_vocab || n_tokens > len / 4 {
            return Err(bad("corrupt KL base header"));
        }
        let tokens = (0..n_tokens)
            .map(|_| read_u32(&mut r))
            .collect::<std::io::Result<Vec<_>>>()?;
        let n_pos = read_u64(&mut r)?;
        let per = 16 + 8 * k as u64;
        let header_len = 8 + 24 + 8 + 4 * n_tokens + 8;
        if n_pos
            .checked_mul(per)
            .and_then(|b| b.checked_add(header_len))
            != Some(len)
        {
            return Err(bad(format!(
                "KL base file is truncated or corrupt: {n_pos} positions of {per} bytes do not fill its {len} bytes"
            )));
        }
        let mut positions = Vec::with_capacity(n_pos as usize);
        for _ in 0..n_pos {
            let target_index = read_u32(&mut r)? as usize;
            let nll = f32::from_bits(read_u32(&mut r)?);
            let lse = f64::from_bits(read_u64(&mut r)?);
            let mut top = Vec::with_capacity(k);
            for _ in 0..k {
                let id = read_u32(&mut r)?;
                let l = f32::from_bits(read_u32(&mut r)?);
                if id as usize >= n_vocab {
                    return Err(bad("corrupt KL base: token outside the vocabulary"));
                }
                top.push((id, l));
            }
            positions.push(BasePosition {
                target_index,
                nll,
                lse,
                top,
            });
        }
        Ok(Base {
            header: BaseHeader {
                n_vocab,
                n_ctx: n_ctx as usize,
                k,
                mode,
                tokens,
            },
            positions,
        })
    }
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)
        .map_err(|_| bad("KL base file is truncated"))?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)
        .map_err(|_| bad("KL base file is truncated"))?;
    Ok(u64::from_le_bytes(b))
}

/// KL(base ‖ new) over the base's top-k tokens plus the rest (see the module doc), in nats.
pub fn kl_top_k(base: &BasePosition, new_logits: &[f32]) -> f64 {
    let new_lse = log_sum_exp(new_logits);
    let (mut kl, mut p_top, mut q_top) = (0.0, 0.0, 0.0);
    for &(id, l) in &base.top {
        let lp = l as f64 - base.lse;
        let lq = new_logits[id as usize] as f64 - new_lse;
        let p = lp.exp();
        kl += p * (lp - lq);
        p_top += p;
        q_top += lq.exp();
    }
    let p_rest = (1.0 - p_top).max(0.0);
    let q_rest = (1.0 - q_top).max(1e-300);
    if p_rest > 1e-12 {
        kl += p_rest * (p_rest.ln() - q_rest.ln());
    }
    kl.max(0.0)
}

/// A comparison of a run with a base, position by position.
#[derive(Default)]
pub struct KlStats {
    pub kl: Vec<f64>,
    pub top1_same: usize,
    pub base_nll: NllStats,
    pub new_nll: NllStats,
}

impl KlStats {
    pub fn push(&mut self, base: &BasePosition, new: &Scored) {
        let new_top = top_k(new.logits, 1)[0].0;
        self.record(
            kl_top_k(base, new.logits),
            base.top[0].0 == new_top,
            base.nll as f64,
            new.nll,
        );
    }

    /// One position's comparison, however it was computed.
    pub fn record(&mut self, kl: f64, same_top: bool, base_nll: f64, new_nll: f64) {
        self.kl.push(kl);
        self.top1_same += usize::from(same_top);
        self.base_nll.add(base_nll);
        self.new_nll.add(new_nll);
    }

    pub fn mean_kl(&self) -> f64 {
        self.kl.iter().sum::<f64>() / self.kl.len().max(1) as f64
    }

    /// Standard error of the mean KL.
    pub fn kl_stderr(&self) -> f64 {
        let n = self.kl.len() as f64;
        if n < 2.0 {
            return f64::NAN;
        }
        let m = self.mean_kl();
        let var = self.kl.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0);
        (var / n).sqrt()
    }

    /// The `q`-quantile of the per-position KL (nearest rank).
    pub fn kl_quantile(&self, q: f64) -> f64 {
        let mut v = self.kl.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    }

    pub fn top1_agreement(&self) -> f64 {
        self.top1_same as f64 / self.kl.len().max(1) as f64
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn position(logits: &[f32], k: usize) -> BasePosition {
        BasePosition {
            target_index: 0,
            nll: 0.0,
            lse: log_sum_exp(logits),
            top: top_k(logits, k),
        }
    }

    /// KL(p ‖ q) over the whole vocabulary, in f64 from the logits themselves.
    pub(crate) fn exact_kl(p: &[f32], q: &[f32]) -> f64 {
        let (lp, lq) = (log_sum_exp(p), log_sum_exp(q));
        p.iter()
            .zip(q)
            .map(|(&a, &b)| {
                let (a, b) = (a as f64 - lp, b as f64 - lq);
                a.exp() * (a - b)
            })
            .sum()
    }

    #[test]
    fn top_k_kl_is_exact_with_the_whole_vocabulary_and_a_lower_bound_otherwise() {
        let p: Vec<f32> = (0..50)
            .map(|i| ((i * 37 % 50) as f32 * 0.13).sin() * 3.0)
            .collect();
        let q: Vec<f32> = p
            .iter()
            .enumerate()
            .map(|(i, x)| x + (i as f32 * 0.7).cos() * 0.4)
            .collect();
        let exact = exact_kl(&p, &q);
        assert!(
            (kl_top_k(&position(&p, 50), &q) - exact).abs() < 1e-6,
            "{exact}"
        );
        let approx = kl_top_k(&position(&p, 8), &q);
        assert!(
            approx <= exact + 1e-9 && approx > 0.2 * exact,
            "{approx} vs {exact}"
        );
        assert!(
            kl_top_k(&position(&p, 8), &p).abs() < 1e-7,
            "a run against itself"
        );
    }

    #[test]
    fn top_k_is_sorted_and_breaks_ties_by_id() {
        assert_eq!(
            top_k(&[1.0, 3.0, 3.0, 2.0], 3),
            [(1, 3.0), (2, 3.0), (3, 2.0)]
        );
    }

    #[test]
    fn base_files_round_trip_and_bad_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("nucleus-kl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("base.kld");
        let header = BaseHeader {
            n_vocab: 6,
            n_ctx: 16,
            k: 2,
            mode: Mode::Stream { sink_blocks: 1 },
            tokens: vec![1, 2, 3, 4],
        };
        let logits = [0.5f32, 2.0, -1.0, 1.0, 0.0, 3.0];
        let mut w = BaseWriter::create(&path, &header).unwrap();
        for t in 0..3 {
            let s = Scored {
                target_index: t + 1,
                target: header.tokens[t + 1],
                logits: &logits,
                nll: 1.5,
            };
            w.push(&s).unwrap();
        }
        w.finish().unwrap();
        let base = Base::load(&path).unwrap();
        assert_eq!(base.header, header);
        assert_eq!(base.positions.len(), 3);
        assert_eq!(base.positions[2].target_index, 3);
        assert_eq!(base.positions[0].top, [(5, 3.0), (1, 2.0)]);
        // Truncated, or not ours: clear errors.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let e = Base::load(&path).err().unwrap().to_string();
        assert!(e.contains("truncated"), "{e}");
        std::fs::write(&path, b"GGUF....").unwrap();
        assert!(Base::load(&path)
            .err()
            .unwrap()
            .to_string()
            .contains("magic"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
