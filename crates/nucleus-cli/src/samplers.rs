//! llama-cli's flags for the community samplers (DRY, XTC, mirostat, top-n-σ, dynamic
//! temperature), with the request field names as aliases (an invalid value's error names the
//! field: `--mirostat-eta` is `--mirostat-lr`).

use anyhow::{bail, Result};
use clap::Args;
use nucleus::sampling::{order, ChainStage, CommunityParams};

#[derive(Args, Clone, Debug)]
pub struct CommunityArgs {
    /// DRY ("don't repeat yourself"): penalty scale for tokens that extend a repeat (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub dry_multiplier: f32,
    /// DRY: the penalty grows as BASE^(repeat length - allowed length).
    #[arg(long, default_value_t = 1.75)]
    pub dry_base: f32,
    /// DRY: repeats up to this long go unpenalised.
    #[arg(long, default_value_t = 2)]
    pub dry_allowed_length: usize,
    /// DRY: how many of the last tokens to scan (0 = off, -1 = the whole context).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub dry_penalty_last_n: i64,
    /// DRY: a string that cuts repeats; repeatable; replaces the defaults ("\n", ":", "\"",
    /// "*"); `none` for no breakers.
    #[arg(long, value_name = "STR", visible_alias = "dry-sequence-breakers")]
    pub dry_sequence_breaker: Vec<String>,
    /// XTC: chance per token of removing the top choices (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub xtc_probability: f32,
    /// XTC: tokens at least this likely are removed, all but the least likely (> 0.5 = off).
    #[arg(long, default_value_t = 0.1)]
    pub xtc_threshold: f32,
    /// Mirostat version (0 = off, 1, 2); replaces top-k/top-p/min-p/typical/XTC.
    #[arg(long, default_value_t = 0)]
    pub mirostat: u8,
    /// Mirostat's learning rate (eta).
    #[arg(long, default_value_t = 0.1, visible_alias = "mirostat-eta")]
    pub mirostat_lr: f32,
    /// Mirostat's target entropy (tau), in bits.
    #[arg(long, default_value_t = 5.0, visible_alias = "mirostat-tau")]
    pub mirostat_ent: f32,
    /// Top-n-σ: keep tokens within N standard deviations of the top logit (<= 0 = off).
    #[arg(long, default_value_t = -1.0, allow_negative_numbers = true, visible_alias = "top-n-sigma")]
    pub top_nsigma: f32,
    /// Dynamic temperature: temperature ± RANGE, from the candidates' entropy (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub dynatemp_range: f32,
    /// Dynamic temperature's exponent on the normalised entropy.
    #[arg(long, default_value_t = 1.0, visible_alias = "dynatemp-exponent")]
    pub dynatemp_exp: f32,
    /// The order of the sampler stages, llama.cpp's names separated by `;` (a stage left out
    /// is not applied). Default: "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"
    /// (llama.cpp's); `--explain` shows the order used.
    #[arg(long, value_name = "NAMES")]
    pub samplers: Option<String>,
    /// The same order as llama.cpp's letters (default "edskypmxt").
    #[arg(long, value_name = "LETTERS", conflicts_with = "samplers")]
    pub sampling_seq: Option<String>,
}

impl CommunityArgs {
    /// `--samplers` / `--sampling-seq`: `None` for llama.cpp's order.
    pub fn order(&self) -> Result<Option<Vec<ChainStage>>> {
        let parsed = match (&self.samplers, &self.sampling_seq) {
            (Some(names), _) => order::parse_list(names).map_err(|e| ("--samplers", e)),
            (None, Some(letters)) => {
                order::from_letters(letters).map_err(|e| ("--sampling-seq", e))
            }
            (None, None) => return Ok(None),
        };
        match parsed {
            Ok(o) => Ok(Some(o)),
            Err((flag, e)) => bail!("invalid {flag}: {e}"),
        }
    }

    pub fn params(&self) -> Result<CommunityParams> {
        let mut c = CommunityParams {
            dry_multiplier: self.dry_multiplier,
            dry_base: self.dry_base,
            dry_allowed_length: self.dry_allowed_length,
            dry_penalty_last_n: match self.dry_penalty_last_n {
                -1 => usize::MAX,
                n if n < -1 => bail!("invalid --dry-penalty-last-n: {n} must be >= -1"),
                n => n as usize,
            },
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            mirostat: self.mirostat,
            mirostat_tau: self.mirostat_ent,
            mirostat_eta: self.mirostat_lr,
            top_n_sigma: self.top_nsigma,
            dynatemp_range: self.dynatemp_range,
            dynatemp_exponent: self.dynatemp_exp,
            ..Default::default()
        };
        if self.dry_sequence_breaker == ["none"] {
            c.dry_sequence_breakers.clear();
        } else if !self.dry_sequence_breaker.is_empty() {
            c.dry_sequence_breakers = self.dry_sequence_breaker.clone();
        }
        Ok(c)
    }
}
