//! Encoding through Hugging Face's `tokenizers` crate, for vocabularies that come with their
//! `tokenizer.json` (Hugging Face checkpoints, see [`crate::hf`]). nucleus still cuts special
//! tokens out of the text itself (so `parse_special` and escaped chat messages behave as for
//! any vocabulary); each piece of plain text between them goes through the Hugging Face
//! tokenizer, with its special tokens not matched and nothing added around it. For byte-level
//! BPE vocabularies (Llama 3, Qwen2) this is exactly Hugging Face's own split, since it too
//! encodes the text between added tokens piece by piece.

use super::{TokenId, TokenizerError};

/// The GGUF metadata key holding a whole `tokenizer.json` (the name gguf-py gives it).
pub const HF_JSON_KEY: &str = "tokenizer.huggingface.json";

pub(super) struct HfEncoder {
    inner: tokenizers::Tokenizer,
}

impl HfEncoder {
    pub(super) fn new(json: &str) -> Result<HfEncoder, TokenizerError> {
        let mut inner = tokenizers::Tokenizer::from_bytes(json.as_bytes())
            .map_err(|e| TokenizerError::Invalid(format!("{HF_JSON_KEY}: {e}")))?;
        // Special tokens are nucleus's to match (only with parse_special); the text it hands
        // over is plain. No truncation or padding a tokenizer.json may ask for.
        inner.set_encode_special_tokens(true);
        inner
            .with_truncation(None)
            .map_err(|e| TokenizerError::Invalid(format!("{HF_JSON_KEY}: {e}")))?;
        inner.with_padding(None);
        Ok(HfEncoder { inner })
    }

    /// Appends the ids of plain `text`.
    pub(super) fn encode(&self, text: &str, out: &mut Vec<TokenId>) -> Result<(), TokenizerError> {
        if text.is_empty() {
            return Ok(());
        }
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Invalid(format!("Hugging Face tokenizer: {e}")))?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }
}
