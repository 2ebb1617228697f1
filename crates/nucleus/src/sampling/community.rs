//! llama.cpp's community samplers, each with llama.cpp's definition (`src/llama-sampler.cpp`)
//! and at llama.cpp's place in the chain (`common/sampling.cpp`: dry, top_n_sigma, top_k,
//! typ_p, top_p, min_p, xtc, temperature; mirostat replaces the truncations):
//!
//! - **DRY** ("don't repeat yourself", [`super::dry`]): a token that would extend a repeat of
//!   `n ≥ dry_allowed_length` tokens of the context loses `dry_multiplier · dry_base^(n −
//!   dry_allowed_length)` from its logit; sequence breakers (`"\n"`, `":"`, `"\""`, `"*"`) cut
//!   the repeats;
//! - **top-n-σ** ([`top_n_sigma`]): keep tokens with `logit ≥ max − n·σ`, σ the standard
//!   deviation of the finite logits;
//! - **XTC** ([`xtc`]): with probability `xtc_probability`, remove every token whose probability
//!   is `≥ xtc_threshold` except the least likely of them;
//! - **dynamic temperature** ([`dynatemp`]): `T = T_min + (T_max − T_min) · (H / ln N)^exponent`
//!   with `T_min,max = temperature ∓ dynatemp_range`, `H` the entropy of the `N` candidates;
//! - **mirostat** v1 and v2 ([`Mirostat`]): a target surprise `tau` (bits), a learning rate
//!   `eta` and a per-sequence state `mu` (starting at `2·tau`).
//!
//! Every random draw (XTC's coin, the pick) comes from the sequence's own seeded stream, and
//! mirostat's `mu` lives in the sequence's [`super::Sampler`], so a sequence's output depends
//! only on its tokens, settings and seed.

use serde::{Deserialize, Serialize};

use super::candidates::Candidates;
use super::SamplingError;

/// The settings of the community samplers (llama-server's field names); `Default` is off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CommunityParams {
    /// DRY penalty scale; `0` = off.
    pub dry_multiplier: f32,
    /// DRY base (`≥ 1`): the penalty grows as `base^(length − allowed_length)`.
    pub dry_base: f32,
    /// Repeats up to this long go unpenalised.
    pub dry_allowed_length: usize,
    /// How many of the last tokens DRY scans; `0` = off, `usize::MAX` = the whole context.
    pub dry_penalty_last_n: usize,
    /// Strings that cut a repeat (a token containing one is never penalised and no repeat
    /// spans it).
    pub dry_sequence_breakers: Vec<String>,
    /// Chance, per token, that XTC removes the top choices; `0` = off.
    pub xtc_probability: f32,
    /// XTC removes tokens at least this likely (all but the least likely of them); `> 0.5` =
    /// off.
    pub xtc_threshold: f32,
    /// Mirostat version: `0` = off, `1` or `2`.
    pub mirostat: u8,
    /// Mirostat's target surprise (entropy), in bits.
    pub mirostat_tau: f32,
    /// Mirostat's learning rate.
    pub mirostat_eta: f32,
    /// Keep tokens within `n` standard deviations of the top logit; `≤ 0` = off.
    pub top_n_sigma: f32,
    /// Dynamic temperature: `temperature ± dynatemp_range`; `0` = off.
    pub dynatemp_range: f32,
    /// Dynamic temperature's exponent on the normalised entropy.
    pub dynatemp_exponent: f32,
}

impl Default for CommunityParams {
    /// llama.cpp's defaults (`common/common.h`), every sampler off.
    fn default() -> Self {
        CommunityParams {
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_sequence_breakers: ["\n", ":", "\"", "*"].map(String::from).to_vec(),
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            top_n_sigma: -1.0,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
        }
    }
}

impl CommunityParams {
    pub fn dry_on(&self) -> bool {
        self.dry_multiplier > 0.0 && self.dry_penalty_last_n > 0
    }

    pub fn xtc_on(&self) -> bool {
        self.xtc_probability > 0.0 && self.xtc_threshold <= 0.5
    }

    pub fn top_n_sigma_on(&self) -> bool {
        self.top_n_sigma > 0.0
    }

    pub fn dynatemp_on(&self) -> bool {
        self.dynatemp_range > 0.0
    }

    /// Check every value is in range; the error names the parameter.
    pub fn validate(&self) -> Result<(), SamplingError> {
        fn bad(name: &'static str, reason: String) -> Result<(), SamplingError> {
            Err(SamplingError::InvalidParam { name, reason })
        }
        let nonneg = |name: &'static str, v: f32| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                bad(name, format!("{v} must be finite and >= 0"))
            }
        };
        let unit = |name: &'static str, v: f32| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                bad(name, format!("{v} must be in [0, 1]"))
            }
        };
        nonneg("dry_multiplier", self.dry_multiplier)?;
        if !(self.dry_base.is_finite() && self.dry_base >= 1.0) {
            return bad(
                "dry_base",
                format!("{} must be finite and >= 1", self.dry_base),
            );
        }
        if self.dry_sequence_breakers.iter().any(String::is_empty) {
            return bad("dry_sequence_breakers", "a breaker is empty".into());
        }
        unit("xtc_probability", self.xtc_probability)?;
        unit("xtc_threshold", self.xtc_threshold)?;
        if self.mirostat > 2 {
            return bad("mirostat", format!("{} must be 0, 1 or 2", self.mirostat));
        }
        nonneg("mirostat_tau", self.mirostat_tau)?;
        nonneg("mirostat_eta", self.mirostat_eta)?;
        if !self.top_n_sigma.is_finite() {
            return bad("top_n_sigma", "must be finite (<= 0 = off)".into());
        }
        nonneg("dynatemp_range", self.dynatemp_range)?;
        nonneg("dynatemp_exponent", self.dynatemp_exponent)
    }
}

/// Top-n-σ (Tang et al. 2024, llama.cpp's `top_n_sigma`): with `max` the largest finite logit
/// and `σ` the (population) standard deviation of the finite logits, every logit below
/// `max − n·σ` becomes `-inf`. Scaling the logits scales `max` and `σ` alike, so it commutes
/// with temperature. `n ≤ 0` is off. Returns how many logits are left finite.
pub fn top_n_sigma(logits: &mut [f32], n: f32) -> usize {
    let finite = || logits.iter().filter(|l| **l > f32::NEG_INFINITY);
    let count = finite().count();
    if n <= 0.0 || count <= 1 {
        return count;
    }
    let max = finite().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    let mean = finite().map(|&l| l as f64).sum::<f64>() / count as f64;
    let var = finite().map(|&l| (l as f64 - mean).powi(2)).sum::<f64>() / count as f64;
    let thr = (max as f64 - n as f64 * var.sqrt()) as f32;
    let mut left = 0;
    for l in logits.iter_mut() {
        if *l < thr {
            *l = f32::NEG_INFINITY;
        } else if *l > f32::NEG_INFINITY {
            left += 1;
        }
    }
    left
}

/// XTC, "exclude top choices" (llama.cpp's `xtc`): when `coin ≤ probability` and at least two
/// candidates have probability `≥ threshold`, remove all of those but the least likely one
/// (lowest logit; among equal logits the highest id, the last in the chain's order).
///
/// The probabilities are those of `logit · scale`: the sampler passes the temperature it has
/// already divided by, so that XTC sees the untempered distribution, as in llama.cpp where
/// temperature comes after it. `threshold > 0.5` can never hold for two tokens: off.
pub fn xtc(c: &mut Candidates, probability: f32, threshold: f32, scale: f32, coin: f64) {
    if probability <= 0.0 || threshold > 0.5 || c.len() < 2 || coin > probability as f64 {
        return;
    }
    let m = c.v.iter().fold(f32::NEG_INFINITY, |m, x| m.max(x.logit));
    let z: f64 =
        c.v.iter()
            .map(|x| (((x.logit - m) * scale) as f64).exp())
            .sum();
    // ln(threshold · z) in the scaled space: p ≥ thr  ⇔  (logit − m)·scale ≥ ln(thr · z).
    let cut = (threshold as f64 * z).ln();
    let above = |l: f32| (((l - m) * scale) as f64) >= cut;
    let mut last: Option<(f32, u32)> = None;
    let mut n_above = 0;
    for x in c.v.iter().filter(|x| above(x.logit)) {
        n_above += 1;
        let later = match last {
            None => true,
            Some((l, id)) => x.logit < l || (x.logit == l && x.id > id),
        };
        if later {
            last = Some((x.logit, x.id));
        }
    }
    let Some((_, keep_id)) = last else { return };
    if n_above < 2 {
        return;
    }
    c.v.retain(|x| x.id == keep_id || !above(x.logit));
    c.mark_unsorted();
}

/// Dynamic temperature (llama.cpp's `temp_ext`, "entropy sampling"): with `N` candidates whose
/// distribution has entropy `H` (nats), the temperature is
/// `T_min + (T_max − T_min) · (H / ln N)^exponent`, `T_min = max(0, temp − range)`,
/// `T_max = temp + range`; then the logits are divided by it (a temperature of 0 keeps the top
/// candidate alone). With one candidate nothing changes. Returns the temperature used.
pub fn dynatemp(
    c: &mut Candidates,
    temp: f32,
    range: f32,
    exponent: f32,
    scratch: &mut Vec<f64>,
) -> f32 {
    if c.len() <= 1 {
        return temp;
    }
    let (t_min, t_max) = ((temp - range).max(0.0), temp + range);
    let max_entropy = (c.len() as f64).ln();
    c.probs(scratch);
    let h: f64 = -scratch
        .iter()
        .filter(|&&p| p > 0.0)
        .map(|&p| p * p.ln())
        .sum::<f64>();
    let norm = (h / max_entropy) as f32;
    let t = t_min + (t_max - t_min) * norm.powf(exponent);
    if t > 0.0 {
        c.temperature(t);
    } else {
        c.top_k(1);
    }
    t
}

/// Mirostat (Basu et al. 2021) as llama.cpp runs it: it replaces the truncations and the pick,
/// and keeps `mu`, the surprise budget, per sequence.
#[derive(Clone, Debug)]
pub struct Mirostat {
    pub version: u8,
    pub tau: f32,
    pub eta: f32,
    /// Starts at `2·tau`; after each pick `mu −= eta · (surprise − tau)`, the surprise being
    /// `−log2 p` of the chosen token in the distribution it was drawn from.
    pub mu: f32,
}

/// Mirostat v1 estimates Zipf's exponent from the top `M` tokens (llama.cpp's `m = 100`).
const MIROSTAT_M: usize = 100;

impl Mirostat {
    pub fn new(version: u8, tau: f32, eta: f32) -> Mirostat {
        Mirostat {
            version,
            tau,
            eta,
            mu: 2.0 * tau,
        }
    }

    /// Truncate `c` as this version does and pick with the uniform `u`; returns the index into
    /// `c.v` and updates `mu`. `n_vocab` is the vocabulary size (v1's `N`).
    pub fn sample(
        &mut self,
        c: &mut Candidates,
        n_vocab: usize,
        u: f64,
        probs: &mut Vec<f64>,
    ) -> usize {
        if self.version == 1 {
            self.truncate_v1(c, n_vocab);
        } else {
            self.truncate_v2(c, probs);
        }
        let i = c.pick(u);
        c.probs(probs);
        let surprise = -(probs[i] as f32).log2();
        self.mu -= self.eta * (surprise - self.tau);
        i
    }

    /// v1: `ŝ = Σ t_i b_i / Σ t_i²` over the top `M` tokens, `t_i = ln((i+2)/(i+1))`,
    /// `b_i = ln(p_i / p_{i+1})`; `ε = ŝ − 1`; keep the top
    /// `k = ((ε · 2^mu) / (1 − N^−ε))^(1/ŝ)` tokens (at least one).
    fn truncate_v1(&self, c: &mut Candidates, n_vocab: usize) {
        c.sort_prefix(MIROSTAT_M);
        let top = &c.v[..c.v.len().min(MIROSTAT_M)];
        let (mut sum_tb, mut sum_tt) = (0.0f32, 0.0f32);
        for (i, w) in top.windows(2).enumerate() {
            let t = ((i + 2) as f32 / (i + 1) as f32).ln();
            // ln(p_i / p_{i+1}) = logit_i − logit_{i+1}: the normaliser cancels.
            let b = w[0].logit - w[1].logit;
            sum_tb += t * b;
            sum_tt += t * t;
        }
        let s_hat = sum_tb / sum_tt;
        let eps = s_hat - 1.0;
        let k =
            ((eps * 2f32.powf(self.mu)) / (1.0 - (n_vocab as f32).powf(-eps))).powf(1.0 / s_hat);
        // `as` saturates (NaN → 0), so a degenerate estimate keeps one token.
        c.top_k((k as usize).max(1));
    }

    /// v2: keep the tokens whose surprise `−log2 p` is at most `mu` (at least the top one).
    fn truncate_v2(&self, c: &mut Candidates, probs: &mut Vec<f64>) {
        c.probs(probs);
        let min_p = (-self.mu as f64).exp2();
        if !probs.iter().any(|&p| p >= min_p) {
            c.top_k(1);
            return;
        }
        let mut i = 0;
        c.v.retain(|_| {
            i += 1;
            probs[i - 1] >= min_p
        });
        c.mark_unsorted();
    }
}

#[cfg(test)]
#[path = "community_tests.rs"]
mod tests;
