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
mod hf;
mod names;
mod spm;
mod stream;

use std::collections::HashMap;

use crate::gguf::{MetaValue, Metadata};

pub use escape::Escapes;
pub use hf::HF_JSON_KEY;
pub use stream::StreamDecoder;

pub use names::FimTokens;
use names::{EOG_TEXTS, EOT_TEXTS};

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

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

fn meta_bool(meta: &Metadata, key: &str) -> Option<bool> {
    meta.get(key).and_then(|v| match v {
        MetaValue::Bool(b) => Some(*b),
        other => other.as_i64().map(|i| i != 0),
    })
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata.
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let model = meta
            .get_str(KEY_MODEL)
            .ok_or(TokenizerError::MissingKey(KEY_MODEL))?;
        let kind = match model {
            "llama" => VocabKind::Spm,
            "gpt2" => VocabKind::Bpe,
            other => return Err(TokenizerError::UnknownModel(other.to_string())),
        };
        let pre = meta.get_str(KEY_PRE).unwrap_or("default").to_string();

        // Vocabulary.
        let token_values = meta
            .get_array(KEY_TOKENS)
            .ok_or(TokenizerError::MissingKey(KEY_TOKENS))?;
        let n = token_values.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            return Err(TokenizerError::Invalid(format!("{n} tokens")));
        }
        let mut texts: Vec<Box<str>> = Vec::with_capacity(n);
        for (i, v) in token_values.iter().enumerate() {
            let s = v.as_str().ok_or_else(|| {
                TokenizerError::Invalid(format!("{KEY_TOKENS}[{i}] is not a string"))
            })?;
            if s.is_empty() {
                texts.push(format!("[EMPTY_{i}]").into_boxed_str());
            } else {
                texts.push(s.into());
            }
        }
        let mut token_to_id: HashMap<Box<str>, TokenId> = HashMap::with_capacity(n);
        for (i, t) in texts.iter().enumerate() {
            if let Some(prev) = token_to_id.insert(t.clone(), i as TokenId) {
                return Err(TokenizerError::Invalid(format!(
                    "duplicate token {t:?} has ids {prev} and {i}"
                )));
            }
        }
        let scores = match meta.get_array(KEY_SCORES) {
            Some(arr) => {
                if arr.len() < n {
                    return Err(TokenizerError::Invalid(format!(
                        "{} scores for {n} tokens",
                        arr.len()
                    )));
                }
                arr[..n]
                    .iter()
                    .map(|v| v.as_f64().map(|x| x as f32))
                    .collect::<Option<Vec<f32>>>()
                    .ok_or_else(|| TokenizerError::Invalid(format!("{KEY_SCORES} not numeric")))?
            }
            None => vec![0.0; n],
        };
        let mut attrs = match meta.get_array(KEY_TYPES) {
            Some(arr) => {
                if arr.len() < n {
                    return Err(TokenizerError::Invalid(format!(
                        "{} token types for {n} tokens",
                        arr.len()
                    )));
                }
                let mut attrs = Vec::with_capacity(n);
                for v in &arr[..n] {
                    let t = v.as_i64().ok_or_else(|| {
                        TokenizerError::Invalid(format!("{KEY_TYPES} not integers"))
                    })?;
                    attrs.push(match t {
                        1 => attr::NORMAL,
                        2 => attr::UNKNOWN,
                        3 => attr::CONTROL,
                        4 => attr::USER_DEFINED,
                        5 => attr::UNUSED,
                        6 => attr::BYTE,
                        _ => 0,
                    });
                }
                attrs
            }
            None => vec![attr::NORMAL; n],
        };

        // Per-type defaults, then the metadata's flags (as llama.cpp's `llama_vocab::load`).
        let mut add_space_prefix = false;
        let mut add_bos;
        let mut add_eos = false;
        let mut bos: Option<TokenId>;
        let mut eos: Option<TokenId>;
        let mut unk: Option<TokenId>;
        let mut bpe_model = None;
        let hf = meta
            .get_str(HF_JSON_KEY)
            .map(hf::HfEncoder::new)
            .transpose()?;
        match kind {
            // The special ids and flags are all in the metadata; no merges or pre-tokenizer
            // name are needed.
            VocabKind::Bpe if hf.is_some() => {
                add_bos = false;
                bos = None;
                eos = None;
                unk = None;
            }
            VocabKind::Spm => {
                add_space_prefix = true;
                add_bos = true;
                bos = Some(1);
                eos = Some(2);
                unk = Some(0);
            }
            VocabKind::Bpe => {
                let cfg = bpe::PreConfig::for_pre(&pre)?;
                add_bos = cfg.add_bos;
                bos = if cfg.no_bos { None } else { Some(11) };
                eos = Some(11);
                unk = None;
                let merges = meta
                    .get_array(KEY_MERGES)
                    .ok_or(TokenizerError::MissingKey(KEY_MERGES))?;
                bpe_model = Some(bpe::Bpe::new(cfg, merges, &token_to_id)?);
            }
        }
        if let Some(v) = meta_bool(meta, "tokenizer.ggml.add_space_prefix") {
            add_space_prefix = v;
        }
        let in_range = |id: Option<TokenId>| id.filter(|&i| (i as usize) < n);
        bos = in_range(bos);
        eos = in_range(eos);
        unk = in_range(unk);
        let read_id = |key: &str, default: Option<TokenId>| -> Option<TokenId> {
            match meta.get_u64(key) {
                Some(v) if (v as usize) < n => Some(v as TokenId),
                _ => default,
            }
        };
        bos = read_id("tokenizer.ggml.bos_token_id", bos);
        eos = read_id("tokenizer.ggml.eos_token_id", eos);
        unk = read_id("tokenizer.ggml.unknown_token_id", unk);
        let mut eot = read_id("tokenizer.ggml.eot_token_id", None);
        let mut eom = read_id("tokenizer.ggml.eom_token_id", None);
        let pad = read_id("tokenizer.ggml.padding_token_id", None);
        if let Some(v) = meta_bool(meta, "tokenizer.ggml.add_bos_token") {
            add_bos = v;
        }
        if let Some(v) = meta_bool(meta, "tokenizer.ggml.add_eos_token") {
            add_eos = v;
        }
        if add_bos && bos.is_none() {
            return Err(TokenizerError::Invalid(
                "add_bos_token is true, but there is no bos token".into(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::Invalid(
                "add_eos_token is true, but there is no eos token".into(),
            ));
        }

        // Auto-detected special tokens (by text, as llama.cpp): they become control tokens.
        let find_first = |names: &[&str]| -> Option<TokenId> {
            names
                .iter()
                .filter_map(|s| token_to_id.get(*s).copied())
                .min()
        };
        let make_control = |id: TokenId, attrs: &mut Vec<u32>| {
            attrs[id as usize] |= attr::CONTROL;
        };
        if eot.is_none() {
            eot = find_first(EOT_TEXTS);
            if let Some(id) = eot {
                make_control(id, &mut attrs);
            }
        }
        if eom.is_none() {
            eom = find_first(&["<|eom_id|>"]);
            if let Some(id) = eom {
                make_control(id, &mut attrs);
            }
        }
        let mut eog: Vec<TokenId> = Vec::new();
        let fim = FimTokens::load(meta, n, find_first, |id| make_control(id, &mut attrs));
        eog.extend(fim.eog());
        // Control tokens named "unused…" are unused.
        for (i, t) in texts.iter().enumerate() {
            if attrs[i] & attr::CONTROL != 0 && t.contains("unused") {
                attrs[i] |= attr::UNUSED;
            }
        }
        for name in EOG_TEXTS {
            if let Some(&id) = token_to_id.get(*name) {
                make_control(id, &mut attrs);
                eog.push(id);
            }
        }
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = token_to_id.get(name) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend(eos);
        eog.extend(eot);
        eog.extend(eom);
        eog.sort_unstable();
        eog.dedup();
        // o200k_harmony / solar-open: "<|end|>" is not an end of generation there.
        let has = |s: &str| token_to_id.get(s).is_some_and(|id| eog.contains(id));
        if ((has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")))
            && has("<|end|>")
        {
            let end = token_to_id["<|end|>"];
            eog.retain(|&id| id != end);
            attrs[end as usize] = attr::USER_DEFINED;
        }

        // Special-token cache: control, user-defined and unknown tokens, longest first.
        let mut special_tokens: Vec<TokenId> = (0..n as TokenId)
            .filter(|&id| {
                attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special_tokens.sort_by(|&a, &b| texts[b as usize].len().cmp(&texts[a as usize].len()));

        // Byte tokens.
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = match kind {
                VocabKind::Spm => token_to_id
                    .get(format!("<0x{b:02X}>").as_str())
                    .or_else(|| {
                        std::str::from_utf8(&[b as u8])
                            .ok()
                            .and_then(|s| token_to_id.get(s))
                    })
                    .copied(),
                VocabKind::Bpe => {
                    let mut buf = [0u8; 4];
                    let s = bpe::byte_to_char(b as u8).encode_utf8(&mut buf);
                    token_to_id.get(&*s).copied()
                }
            };
        }

        let mut tok = Tokenizer {
            kind,
            pre,
            texts,
            scores,
            attrs,
            token_to_id,
            pieces: Vec::new(),
            piece_offsets: Vec::new(),
            special_tokens,
            byte_tokens,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            add_bos,
            add_eos,
            add_space_prefix,
            eog,
            fim,
            bpe: bpe_model,
            hf,
            chat_template: meta.get_str("tokenizer.chat_template").map(str::to_string),
        };
        tok.build_pieces();
        tok.apply_name_attrs(meta);
        Ok(tok)
    }

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
