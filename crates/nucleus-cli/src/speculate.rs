//! `--speculate`, `--draft-model`, `--draft-max` on `run`, `chat` and `serve`: speculative
//! decoding, prompt lookup by default.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use nucleus::engine::speculate::draft::DraftProposer;
use nucleus::engine::speculate::ngram::NgramProposer;
use nucleus::engine::speculate::{Speculator, MAX_DRAFT};
use nucleus::kv_cache::KvType;
use nucleus::tokenizer::Tokenizer;

use crate::commands::{load_path, resolve_model, Loaded};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// Prompt lookup: what followed the last few tokens earlier in the prompt or output.
    Ngram,
    /// A smaller model with the same vocabulary (`--draft-model`) runs ahead.
    Draft,
    /// No speculation.
    Off,
}

#[derive(Args, Clone, Debug)]
pub struct SpeculateArgs {
    /// Speculative decoding: `ngram` (the default; prompt lookup: proposes what followed the
    /// last few tokens earlier in the prompt or output; best when the answer repeats the
    /// prompt, as code edits do), `draft` (the smaller model --draft-model runs ahead) or
    /// `off`. Proposals are checked in one pass of the model; the output is the same, token
    /// for token, as without. Speculation pauses by itself when it does not pay.
    #[arg(long, value_name = "METHOD")]
    pub speculate: Option<Method>,
    /// The draft model for `--speculate draft`: a catalog name or a GGUF path, with the same
    /// vocabulary as the model.
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<String>,
    /// The most tokens proposed at once (the number adapts to how many are accepted).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub draft_max: usize,
}

impl SpeculateArgs {
    /// Checks the flags together and gives the method in effect (`None`: no speculation);
    /// `beams` is the request's. Without `--speculate`: `draft` when `--draft-model` is
    /// given, else `ngram`, except with beam search.
    pub fn method(&self, beams: usize) -> Result<Option<Method>> {
        if !(1..=MAX_DRAFT).contains(&self.draft_max) {
            bail!("invalid --draft-max: must be between 1 and {MAX_DRAFT}");
        }
        let method = match (self.speculate, &self.draft_model) {
            (Some(Method::Draft), None) => {
                bail!("--speculate draft needs --draft-model MODEL")
            }
            (Some(m @ (Method::Ngram | Method::Off)), Some(_)) => {
                bail!("--draft-model is for --speculate draft, not {m:?}")
            }
            (None, Some(_)) => Method::Draft,
            (Some(m), _) => m,
            // Beam search decodes no single sequence: no speculation unless asked for.
            (None, None) if beams > 1 => Method::Off,
            (None, None) => Method::Ngram,
        };
        if method != Method::Off && beams > 1 {
            bail!("--speculate does not combine with --beams (beam search decodes no single sequence)");
        }
        Ok((method != Method::Off).then_some(method))
    }

    /// The draft model, loaded, when the method is `draft`.
    pub(crate) fn load_draft(
        &self,
        method: Option<Method>,
        threads: usize,
    ) -> Result<Option<Loaded>> {
        let (Some(Method::Draft), Some(spec)) = (method, self.draft_model.as_deref()) else {
            return Ok(None);
        };
        let what = || format!("cannot use the draft model {spec}");
        let path = resolve_model(Some(spec)).with_context(what)?;
        load_path(&path, threads).map(Some).with_context(what)
    }

    /// The speculator of `method` (from [`method`](Self::method)), over `draft` (from
    /// [`load_draft`](Self::load_draft)).
    pub(crate) fn speculator<'d>(
        &self,
        method: Option<Method>,
        draft: Option<&'d Loaded>,
        tokenizer: &Tokenizer,
        n_ctx: usize,
        kv_type: KvType,
    ) -> Result<Option<Speculator<'d>>> {
        let proposer: Box<dyn nucleus::engine::speculate::Proposer + 'd> = match method {
            None | Some(Method::Off) => return Ok(None),
            Some(Method::Ngram) => Box::new(NgramProposer::default()),
            Some(Method::Draft) => {
                let d = draft.context("--speculate draft needs --draft-model MODEL")?;
                let p = DraftProposer::new(&d.model, &d.tokenizer, tokenizer, n_ctx, kv_type)
                    .map_err(anyhow::Error::msg)
                    .context("cannot use the draft model")?;
                Box::new(p)
            }
        };
        Ok(Some(Speculator::new(proposer, self.draft_max)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(
        speculate: Option<Method>,
        draft_model: Option<&str>,
        draft_max: usize,
    ) -> SpeculateArgs {
        SpeculateArgs {
            speculate,
            draft_model: draft_model.map(String::from),
            draft_max,
        }
    }

    #[test]
    fn the_method_in_effect_and_the_refused_combinations() {
        // Prompt lookup by default, none with beams unless asked for, a draft model implies draft.
        assert_eq!(args(None, None, 16).method(1).unwrap(), Some(Method::Ngram));
        assert_eq!(args(None, None, 16).method(4).unwrap(), None);
        assert_eq!(args(Some(Method::Off), None, 16).method(1).unwrap(), None);
        assert_eq!(
            args(None, Some("m"), 16).method(1).unwrap(),
            Some(Method::Draft)
        );
        assert_eq!(
            args(Some(Method::Draft), Some("m"), 64).method(1).unwrap(),
            Some(Method::Draft)
        );
        let err = |a: SpeculateArgs, beams| a.method(beams).unwrap_err().to_string();
        assert!(err(args(None, None, 0), 1).contains("--draft-max"));
        assert!(err(args(None, None, 65), 1).contains("--draft-max"));
        assert!(err(args(Some(Method::Draft), None, 16), 1).contains("--draft-model"));
        assert!(err(args(Some(Method::Ngram), Some("m"), 16), 1).contains("--draft-model"));
        assert!(err(args(Some(Method::Ngram), None, 16), 2).contains("--beams"));
        assert!(err(args(None, Some("m"), 16), 2).contains("--beams"));
    }
}
