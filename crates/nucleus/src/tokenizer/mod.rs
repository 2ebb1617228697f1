//! Tokenizer: text ↔ token ids, built from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! It reproduces llama.cpp's tokenizers exactly (checked against llama.cpp's own test vectors and
//! reference outputs):
//! - `tokenizer.ggml.model = "llama"`: SentencePiece-style; score-ordered bigram merges over UTF-8
//!   characters, spaces escaped as "▁" (plus a leading space when `add_space_prefix`), and byte
//!   fallback to `<0xXX>` tokens ([`spm`]);
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE; the text is split by the regexes llama.cpp
//!   uses for the vocabulary's `tokenizer.ggml.pre`, then merged by rank ([`bpe`]).
//!
//! Before either, special tokens are cut out of the text the way llama.cpp's
//! `tokenizer_st_partition` does: control (and unknown) tokens only when `parse_special`,
//! user-defined tokens always, longest token text first ([`encode`]). [`Escapes`] keeps text
//! that passes through a chat template (a message's content) from becoming control tokens while
//! the template's own text still does.
//!
//! Decoding concatenates each token's piece (what llama.cpp's `token_to_piece` outputs, with
//! `special = !skip_special`); [`StreamDecoder`] does the same incrementally and only ever emits
//! whole UTF-8 characters.

mod bpe;
mod encode;
mod escape;
mod from_gguf;
mod hf;
mod names;
mod spm;
mod stream;

use std::collections::HashMap;

pub use escape::Escapes;
pub use hf::HF_JSON_KEY;
pub use stream::StreamDecoder;

pub use names::FimTokens;

pub type TokenId = u32;

/// Token attributes, as llama.cpp's `llama_token_attr` (bit flags).
pub(crate) mod attr {
    pub const UNKNOWN: u32 = 1 << 1;
    pub const UNUSED: u32 = 1 << 2;
    pub const NORMAL: u32 = 1 << 3;
    pub const CONTROL: u32 = 1 << 4;
    pub const USER_DEFINED: u32 = 1 << 5;
    pub const BYTE: u32 = 1 << 6;
    pub const LSTRIP: u32 = 1 << 8;
    pub const RSTRIP: u32 = 1 << 9;
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata is missing `{0}`")]
    MissingKey(&'static str),
    #[error("unknown tokenizer model `{0}` (supported: \"llama\", \"gpt2\")")]
    UnknownModel(String),
    #[error("unknown pre-tokenizer `{0}` for a gpt2 (byte-level BPE) vocabulary")]
    UnknownPre(String),
    #[error("invalid tokenizer metadata: {0}")]
    Invalid(String),
    #[error("pre-tokenizer regex failed: {0}")]
    Regex(String),
    #[error("cannot add special token: the vocabulary has no {0} token")]
    NoSpecialToken(&'static str),
}

/// The two vocabulary algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// SentencePiece-style (`tokenizer.ggml.model = "llama"`).
    Spm,
    /// Byte-level BPE (`tokenizer.ggml.model = "gpt2"`).
    Bpe,
}

pub struct Tokenizer {
    kind: VocabKind,
    pre: String,
    texts: Vec<Box<str>>,
    scores: Vec<f32>,
    attrs: Vec<u32>,
    token_to_id: HashMap<Box<str>, TokenId>,
    /// `token_to_piece(id, special = true)` for every token, concatenated; `piece_offsets[id]..
    /// piece_offsets[id + 1]` is token `id`'s piece.
    pieces: Vec<u8>,
    piece_offsets: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest text first (partitioning order).
    special_tokens: Vec<TokenId>,
    /// The token for each byte: `<0xXX>` (SPM) or the byte-level character (BPE).
    byte_tokens: [Option<TokenId>; 256],
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    eot: Option<TokenId>,
    eom: Option<TokenId>,
    unk: Option<TokenId>,
    pad: Option<TokenId>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    eog: Vec<TokenId>,
    fim: FimTokens,
    bpe: Option<bpe::Bpe>,
    /// Hugging Face's tokenizer, when the vocabulary came with its `tokenizer.json`: it then
    /// encodes the plain text (instead of `bpe` or SentencePiece).
    hf: Option<hf::HfEncoder>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("pre", &self.pre)
            .field("vocab_size", &self.texts.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("add_space_prefix", &self.add_space_prefix)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// The token-to-piece cache (llama.cpp builds it with `special = true`, before the
    /// per-model strip attributes).
    fn build_pieces(&mut self) {
        let n = self.texts.len();
        let mut pieces = Vec::with_capacity(n * 6);
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        for id in 0..n {
            self.piece_into(id, &mut pieces);
            offsets.push(pieces.len() as u32);
        }
        self.pieces = pieces;
        self.piece_offsets = offsets;
    }

    fn piece_into(&self, id: usize, out: &mut Vec<u8>) {
        let text = &*self.texts[id];
        let a = self.attrs[id];
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            match self.kind {
                VocabKind::Spm => {
                    for part in text.split('▁').enumerate() {
                        if part.0 > 0 {
                            out.push(b' ');
                        }
                        out.extend_from_slice(part.1.as_bytes());
                    }
                }
                VocabKind::Bpe => bpe::decode_text(text, out),
            }
        } else if a & attr::BYTE != 0 {
            let hex = text.get(3..5).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
            }
        }
    }

    /// Concatenates the tokens' pieces (llama.cpp's `token_to_piece` with `special =
    /// !skip_special`), invalid UTF-8 replaced by U+FFFD. Unknown ids are skipped.
    pub fn decode(&self, ids: &[TokenId], skip_special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.piece(id, skip_special));
        }
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// Raw bytes of one token as llama.cpp's `token_to_piece(special = true)` gives them: byte
    /// tokens give their byte, "▁" becomes a space (SPM), byte-level characters map back to
    /// bytes (BPE), control and user-defined tokens give their text. Empty for an unknown id.
    pub fn token_bytes(&self, id: TokenId) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_offsets.len() {
            return &[];
        }
        &self.pieces[self.piece_offsets[i] as usize..self.piece_offsets[i + 1] as usize]
    }

    /// [`Self::token_bytes`], except that control and unknown tokens give nothing when
    /// `skip_special` (llama.cpp's `token_to_piece(special = !skip_special)`).
    pub fn piece(&self, id: TokenId, skip_special: bool) -> &[u8] {
        if skip_special && self.is_special(id) {
            return &[];
        }
        self.token_bytes(id)
    }

    /// Control or unknown token (hidden when decoding with `skip_special`).
    pub fn is_special(&self, id: TokenId) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & (attr::CONTROL | attr::UNKNOWN) != 0)
    }

    /// Control token (e.g. `<|im_start|>`, `<bos>`).
    pub fn is_control(&self, id: TokenId) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::CONTROL != 0)
    }

    /// User-defined token (matched in text even without `parse_special`; always decoded).
    pub fn is_user_defined(&self, id: TokenId) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::USER_DEFINED != 0)
    }

    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    /// The `tokenizer.ggml.pre` name (`"default"` when absent).
    pub fn pre(&self) -> &str {
        &self.pre
    }

    pub fn bos(&self) -> Option<TokenId> {
        self.bos
    }

    pub fn eos(&self) -> Option<TokenId> {
        self.eos
    }

    pub fn eot(&self) -> Option<TokenId> {
        self.eot
    }

    pub fn eom(&self) -> Option<TokenId> {
        self.eom
    }

    pub fn unk(&self) -> Option<TokenId> {
        self.unk
    }

    pub fn pad(&self) -> Option<TokenId> {
        self.pad
    }

    /// Whether `encode(.., add_special = true, ..)` adds BOS / EOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether SPM encoding prefixes each text fragment after a special token with a space.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// End-of-generation token: eos, eot, eom, and the tokens llama.cpp treats as EOG
    /// (`<|im_end|>`, `<|endoftext|>`, `<end_of_turn>`, `<|eot_id|>`, `<|end|>`, FIM pad/repo/sep…).
    pub fn is_eog(&self, id: TokenId) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The fill-in-the-middle tokens (prefix, suffix, middle, pad, repo, file separator).
    pub fn fim(&self) -> FimTokens {
        self.fim
    }

    /// All end-of-generation tokens, sorted.
    pub fn eog_tokens(&self) -> &[TokenId] {
        &self.eog
    }

    /// The token's text as stored in the vocabulary (e.g. "▁Hello", "Ġworld", "<0x0A>").
    pub fn token_text(&self, id: TokenId) -> Option<&str> {
        self.texts.get(id as usize).map(|s| &**s)
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.token_to_id.get(text).copied()
    }

    pub fn token_score(&self, id: TokenId) -> Option<f32> {
        self.scores.get(id as usize).copied()
    }

    /// `tokenizer.chat_template`, if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

#[cfg(test)]
mod tests;
