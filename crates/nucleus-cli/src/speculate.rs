//! `--speculate`, `--draft-model`, `--draft-max` on `run` and `chat`: speculative decoding.

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
}

#[derive(Args, Clone, Debug)]
pub struct SpeculateArgs {
    /// Speculative decoding: `ngram` (prompt lookup: proposes what followed the last few
    /// tokens earlier in the prompt or output; best when the answer repeats the prompt, as
    /// code edits do) or `draft` (the smaller model --draft-model runs ahead). Proposals are
    /// checked in one pass of the model; the output is the same, token for token, as without.
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
    /// Checks the flags together; `beams` is the request's.
    pub fn check(&self, beams: usize) -> Result<()> {
        if !(1..=MAX_DRAFT).contains(&self.draft_max) {
            bail!("invalid --draft-max: must be between 1 and {MAX_DRAFT}");
        }
        match (self.speculate, &self.draft_model) {
            (Some(Method::Draft), None) => {
                bail!("--speculate draft needs --draft-model MODEL")
            }
            (Some(Method::Ngram) | None, Some(_)) => {
                bail!("--draft-model is for --speculate draft")
            }
            _ => {}
        }
        if self.speculate.is_some() && beams > 1 {
            bail!("--speculate does not combine with --beams (beam search decodes no single sequence)");
        }
        Ok(())
    }

    /// The draft model, loaded, when `--speculate draft`.
    pub(crate) fn load_draft(&self, threads: usize) -> Result<Option<Loaded>> {
        let Some(spec) = self.draft_model.as_deref() else {
            return Ok(None);
        };
        let path = resolve_model(Some(spec))?;
        load_path(&path, threads)
            .map(Some)
            .with_context(|| format!("cannot use the draft model {spec}"))
    }

    /// The speculator these flags describe, over `draft` (from [`load_draft`]).
    pub(crate) fn speculator<'d>(
        &self,
        draft: Option<&'d Loaded>,
        tokenizer: &Tokenizer,
        n_ctx: usize,
        kv_type: KvType,
    ) -> Result<Option<Speculator<'d>>> {
        let proposer: Box<dyn nucleus::engine::speculate::Proposer + 'd> = match self.speculate {
            None => return Ok(None),
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
