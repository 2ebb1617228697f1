//! A draft model: a second, smaller GGUF with the same vocabulary runs ahead greedily, with
//! its own KV cache, which follows the target's sequence and is rolled back with it.

use super::{Proposer, MAX_DRAFT};
use crate::engine::session::{argmax, Session, MAX_CHUNK};
use crate::kv_cache::KvType;
use crate::model::{Model, ModelError, TILED_MIN_BATCH};
use crate::tokenizer::{TokenId, Tokenizer};

pub struct DraftProposer<'d> {
    session: Session<'d>,
    /// The end-of-generation tokens: nothing is proposed after one.
    eog: Vec<TokenId>,
    /// The current sequence's prompt length ([`Proposer::start`]).
    prompt_len: usize,
}

impl<'d> DraftProposer<'d> {
    /// A proposer running `draft` over a context of `n_ctx` tokens. `target` and `draft` are
    /// the two models' tokenizers: they must be the same vocabulary, token for token.
    pub fn new(
        draft: &'d Model,
        draft_tokenizer: &Tokenizer,
        target: &Tokenizer,
        n_ctx: usize,
        kv_type: KvType,
    ) -> Result<DraftProposer<'d>, String> {
        check_draft(draft, draft_tokenizer, target)?;
        let mut session = Session::with_kv_type(draft, n_ctx, n_ctx, kv_type)
            .map_err(|e| format!("draft model: {e}"))?;
        // Its drafts are cut back by up to MAX_DRAFT tokens from its last forward: its window
        // pool (sized for chunks of MAX_CHUNK) keeps that many more positions, and it feeds
        // at most MAX_CHUNK - MAX_DRAFT tokens at a time.
        session.kv.set_rollback_slack(MAX_DRAFT);
        Ok(DraftProposer {
            session,
            eog: target.eog_tokens().to_vec(),
            prompt_len: 0,
        })
    }
}

/// Whether `draft` (with its tokenizer) can propose tokens for a model whose tokenizer is
/// `target`: the same vocabulary, and one logit per token. The error names the difference.
pub fn check_draft(
    draft: &Model,
    draft_tokenizer: &Tokenizer,
    target: &Tokenizer,
) -> Result<(), String> {
    check_vocabularies(target, draft_tokenizer)?;
    if draft.hp.n_vocab != draft_tokenizer.vocab_size() {
        return Err(format!(
            "the draft model's output has {} logits for a vocabulary of {} tokens",
            draft.hp.n_vocab,
            draft_tokenizer.vocab_size()
        ));
    }
    Ok(())
}

/// Whether two tokenizers are one vocabulary: the same tokens with the same ids, and the same
/// special tokens. The error names the first difference.
pub fn check_vocabularies(target: &Tokenizer, draft: &Tokenizer) -> Result<(), String> {
    if target.vocab_size() != draft.vocab_size() {
        return Err(format!(
            "the draft model's vocabulary has {} tokens, the model's {}: they must be the same",
            draft.vocab_size(),
            target.vocab_size()
        ));
    }
    if let Some(id) = (0..target.vocab_size() as TokenId)
        .find(|&id| target.token_bytes(id) != draft.token_bytes(id))
    {
        return Err(format!(
            "the draft model's token {id} is {:?}, the model's {:?}: the vocabularies differ",
            String::from_utf8_lossy(draft.token_bytes(id)),
            String::from_utf8_lossy(target.token_bytes(id))
        ));
    }
    if target.eog_tokens() != draft.eog_tokens() || target.bos() != draft.bos() {
        return Err("the draft model's special tokens differ from the model's".into());
    }
    Ok(())
}

impl Proposer for DraftProposer<'_> {
    fn start(&mut self, prompt_len: usize) {
        self.prompt_len = prompt_len;
    }

    fn propose(&mut self, context: &[TokenId], max: usize) -> Result<Vec<TokenId>, ModelError> {
        let s = &mut self.session;
        if context.is_empty() || context.len() + max > s.n_ctx() {
            return Ok(Vec::new());
        }
        // Keep what the draft has of the context (all but the last token at least, which it
        // must evaluate to give the next logits), drop its rejected drafts.
        let common = s
            .tokens()
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count()
            .min(context.len() - 1);
        if s.len() - common > MAX_DRAFT {
            s.reset();
        } else {
            s.rollback(s.len() - common)?;
        }
        let have = s.len();
        // The prompt as the model computed it (in `--exact`, its rows, 64 or more in a
        // micro-batch, take the tiled attention); then generated tokens (those of a pause, the
        // model's own token) in micro-batches too short for it, as the model computed them.
        // Otherwise the draft's cache would end a rounding away from the model's, and a
        // proposal could part from the model's choice where both are the same network.
        let split = self.prompt_len.clamp(have, context.len());
        let mut logits = Vec::new();
        if split > have {
            logits = s.feed(&context[have..split], MAX_CHUNK - MAX_DRAFT, false)?;
        }
        if context.len() > split {
            logits = s.feed(&context[split..], TILED_MIN_BATCH - 1, false)?;
        }
        let mut out = Vec::with_capacity(max);
        while out.len() < max {
            let t = argmax(&logits);
            out.push(t);
            // What would follow the end of the generation is never verified.
            if self.eog.contains(&t) {
                break;
            }
            if out.len() < max {
                logits = s.feed(&[t], 1, false)?;
            }
        }
        Ok(out)
    }
}
