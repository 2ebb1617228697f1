//! [`Tokenizer::from_gguf`]: the tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata,
//! in the steps llama.cpp's `llama_vocab::load` takes: the model kind, the token list (texts,
//! scores, types), the per-kind defaults (and BPE merges), the metadata's special ids and flags,
//! the special tokens found by text (end of turn, FIM, end of generation), then the caches.

use std::collections::HashMap;

use super::names::{FimTokens, EOG_TEXTS, EOT_TEXTS};
use super::{attr, bpe, hf, TokenId, Tokenizer, TokenizerError, VocabKind, HF_JSON_KEY};
use crate::gguf::{MetaValue, Metadata};

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

/// The token list and what is stored per token.
struct Vocab {
    texts: Vec<Box<str>>,
    token_to_id: HashMap<Box<str>, TokenId>,
    scores: Vec<f32>,
    attrs: Vec<u32>,
}

/// The special token ids and the flags for what `encode` adds.
struct Specials {
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    unk: Option<TokenId>,
    eot: Option<TokenId>,
    eom: Option<TokenId>,
    pad: Option<TokenId>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata.
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let kind = read_kind(meta)?;
        let pre = meta.get_str(KEY_PRE).unwrap_or("default").to_string();
        let mut vocab = read_vocab(meta)?;
        let hf = meta
            .get_str(HF_JSON_KEY)
            .map(hf::HfEncoder::new)
            .transpose()?;
        let (mut sp, bpe_model) = kind_defaults(meta, kind, &pre, hf.is_some(), &vocab)?;
        read_special_ids(meta, vocab.texts.len(), &mut sp)?;
        let fim = detect_specials(meta, &mut vocab, &mut sp);
        let eog = end_of_generation(&mut vocab, &sp, &fim);
        let special_tokens = special_token_cache(&vocab);
        let byte_tokens = byte_token_table(kind, &vocab.token_to_id);
        let Vocab {
            texts,
            token_to_id,
            scores,
            attrs,
        } = vocab;
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
            bos: sp.bos,
            eos: sp.eos,
            eot: sp.eot,
            eom: sp.eom,
            unk: sp.unk,
            pad: sp.pad,
            add_bos: sp.add_bos,
            add_eos: sp.add_eos,
            add_space_prefix: sp.add_space_prefix,
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
}

/// `tokenizer.ggml.model`: the vocabulary algorithm.
fn read_kind(meta: &Metadata) -> Result<VocabKind, TokenizerError> {
    let model = meta
        .get_str(KEY_MODEL)
        .ok_or(TokenizerError::MissingKey(KEY_MODEL))?;
    match model {
        "llama" => Ok(VocabKind::Spm),
        "gpt2" => Ok(VocabKind::Bpe),
        other => Err(TokenizerError::UnknownModel(other.to_string())),
    }
}

/// The token texts (unique), scores and types.
fn read_vocab(meta: &Metadata) -> Result<Vocab, TokenizerError> {
    let texts = read_texts(meta)?;
    let n = texts.len();
    let mut token_to_id: HashMap<Box<str>, TokenId> = HashMap::with_capacity(n);
    for (i, t) in texts.iter().enumerate() {
        if let Some(prev) = token_to_id.insert(t.clone(), i as TokenId) {
            return Err(TokenizerError::Invalid(format!(
                "duplicate token {t:?} has ids {prev} and {i}"
            )));
        }
    }
    Ok(Vocab {
        texts,
        token_to_id,
        scores: read_scores(meta, n)?,
        attrs: read_token_types(meta, n)?,
    })
}

/// `tokenizer.ggml.tokens`; an empty text becomes `[EMPTY_<id>]` (as llama.cpp).
fn read_texts(meta: &Metadata) -> Result<Vec<Box<str>>, TokenizerError> {
    let token_values = meta
        .get_array(KEY_TOKENS)
        .ok_or(TokenizerError::MissingKey(KEY_TOKENS))?;
    let n = token_values.len();
    if n == 0 || n > u32::MAX as usize / 2 {
        return Err(TokenizerError::Invalid(format!("{n} tokens")));
    }
    let mut texts: Vec<Box<str>> = Vec::with_capacity(n);
    for (i, v) in token_values.iter().enumerate() {
        let s = v
            .as_str()
            .ok_or_else(|| TokenizerError::Invalid(format!("{KEY_TOKENS}[{i}] is not a string")))?;
        if s.is_empty() {
            texts.push(format!("[EMPTY_{i}]").into_boxed_str());
        } else {
            texts.push(s.into());
        }
    }
    Ok(texts)
}

/// `tokenizer.ggml.scores` (all 0 when absent).
fn read_scores(meta: &Metadata, n: usize) -> Result<Vec<f32>, TokenizerError> {
    let Some(arr) = meta.get_array(KEY_SCORES) else {
        return Ok(vec![0.0; n]);
    };
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
        .ok_or_else(|| TokenizerError::Invalid(format!("{KEY_SCORES} not numeric")))
}

/// `tokenizer.ggml.token_type` as attribute flags (all normal when absent).
fn read_token_types(meta: &Metadata, n: usize) -> Result<Vec<u32>, TokenizerError> {
    let Some(arr) = meta.get_array(KEY_TYPES) else {
        return Ok(vec![attr::NORMAL; n]);
    };
    if arr.len() < n {
        return Err(TokenizerError::Invalid(format!(
            "{} token types for {n} tokens",
            arr.len()
        )));
    }
    let mut attrs = Vec::with_capacity(n);
    for v in &arr[..n] {
        let t = v
            .as_i64()
            .ok_or_else(|| TokenizerError::Invalid(format!("{KEY_TYPES} not integers")))?;
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
    Ok(attrs)
}

/// The per-kind defaults (as llama.cpp's `llama_vocab::load`), and for a byte-level BPE
/// vocabulary without Hugging Face's `tokenizer.json`, its pre-tokenizer and merges.
fn kind_defaults(
    meta: &Metadata,
    kind: VocabKind,
    pre: &str,
    has_hf: bool,
    vocab: &Vocab,
) -> Result<(Specials, Option<bpe::Bpe>), TokenizerError> {
    let mut sp = Specials {
        bos: None,
        eos: None,
        unk: None,
        eot: None,
        eom: None,
        pad: None,
        add_bos: false,
        add_eos: false,
        add_space_prefix: false,
    };
    let mut bpe_model = None;
    match kind {
        // The special ids and flags are all in the metadata; no merges or pre-tokenizer
        // name are needed.
        VocabKind::Bpe if has_hf => {}
        VocabKind::Spm => {
            sp.add_space_prefix = true;
            sp.add_bos = true;
            sp.bos = Some(1);
            sp.eos = Some(2);
            sp.unk = Some(0);
        }
        VocabKind::Bpe => {
            let cfg = bpe::PreConfig::for_pre(pre)?;
            sp.add_bos = cfg.add_bos;
            sp.bos = if cfg.no_bos { None } else { Some(11) };
            sp.eos = Some(11);
            let merges = meta
                .get_array(KEY_MERGES)
                .ok_or(TokenizerError::MissingKey(KEY_MERGES))?;
            bpe_model = Some(bpe::Bpe::new(cfg, merges, &vocab.token_to_id)?);
        }
    }
    Ok((sp, bpe_model))
}

/// The metadata's special ids (an id outside the `n`-token vocabulary is ignored) and flags,
/// over the defaults; adding BOS / EOS needs the token.
fn read_special_ids(meta: &Metadata, n: usize, sp: &mut Specials) -> Result<(), TokenizerError> {
    if let Some(v) = meta_bool(meta, "tokenizer.ggml.add_space_prefix") {
        sp.add_space_prefix = v;
    }
    let in_range = |id: Option<TokenId>| id.filter(|&i| (i as usize) < n);
    let read_id = |key: &str, default: Option<TokenId>| -> Option<TokenId> {
        match meta.get_u64(key) {
            Some(v) if (v as usize) < n => Some(v as TokenId),
            _ => default,
        }
    };
    sp.bos = read_id("tokenizer.ggml.bos_token_id", in_range(sp.bos));
    sp.eos = read_id("tokenizer.ggml.eos_token_id", in_range(sp.eos));
    sp.unk = read_id("tokenizer.ggml.unknown_token_id", in_range(sp.unk));
    sp.eot = read_id("tokenizer.ggml.eot_token_id", None);
    sp.eom = read_id("tokenizer.ggml.eom_token_id", None);
    sp.pad = read_id("tokenizer.ggml.padding_token_id", None);
    if let Some(v) = meta_bool(meta, "tokenizer.ggml.add_bos_token") {
        sp.add_bos = v;
    }
    if let Some(v) = meta_bool(meta, "tokenizer.ggml.add_eos_token") {
        sp.add_eos = v;
    }
    if sp.add_bos && sp.bos.is_none() {
        return Err(TokenizerError::Invalid(
            "add_bos_token is true, but there is no bos token".into(),
        ));
    }
    if sp.add_eos && sp.eos.is_none() {
        return Err(TokenizerError::Invalid(
            "add_eos_token is true, but there is no eos token".into(),
        ));
    }
    Ok(())
}

/// The lowest id among the tokens whose text is one of `names`.
fn find_first(token_to_id: &HashMap<Box<str>, TokenId>, names: &[&str]) -> Option<TokenId> {
    names
        .iter()
        .filter_map(|s| token_to_id.get(*s).copied())
        .min()
}

/// End of turn, end of message and the FIM tokens the metadata does not name, found by text
/// (as llama.cpp): they become control tokens. Then control tokens named "unused…" are unused.
fn detect_specials(meta: &Metadata, vocab: &mut Vocab, sp: &mut Specials) -> FimTokens {
    let n = vocab.texts.len();
    let token_to_id = &vocab.token_to_id;
    let attrs = &mut vocab.attrs;
    if sp.eot.is_none() {
        sp.eot = find_first(token_to_id, EOT_TEXTS);
        if let Some(id) = sp.eot {
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    if sp.eom.is_none() {
        sp.eom = find_first(token_to_id, &["<|eom_id|>"]);
        if let Some(id) = sp.eom {
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    let fim = FimTokens::load(
        meta,
        n,
        |names| find_first(token_to_id, names),
        |id| attrs[id as usize] |= attr::CONTROL,
    );
    for (i, t) in vocab.texts.iter().enumerate() {
        if attrs[i] & attr::CONTROL != 0 && t.contains("unused") {
            attrs[i] |= attr::UNUSED;
        }
    }
    fim
}

/// The end-of-generation tokens, sorted: the FIM ones, those llama.cpp knows by text (made
/// control tokens), eos, eot and eom. Also the harmony tokens llama.cpp makes user-defined.
fn end_of_generation(vocab: &mut Vocab, sp: &Specials, fim: &FimTokens) -> Vec<TokenId> {
    let token_to_id = &vocab.token_to_id;
    let attrs = &mut vocab.attrs;
    let mut eog: Vec<TokenId> = fim.eog().collect();
    for name in EOG_TEXTS {
        if let Some(&id) = token_to_id.get(*name) {
            attrs[id as usize] |= attr::CONTROL;
            eog.push(id);
        }
    }
    for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = token_to_id.get(name) {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    eog.extend(sp.eos);
    eog.extend(sp.eot);
    eog.extend(sp.eom);
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
    eog
}

/// Control, user-defined and unknown tokens, longest text first (partitioning order).
fn special_token_cache(vocab: &Vocab) -> Vec<TokenId> {
    let (texts, attrs) = (&vocab.texts, &vocab.attrs);
    let mut special_tokens: Vec<TokenId> = (0..texts.len() as TokenId)
        .filter(|&id| {
            attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
        })
        .collect();
    special_tokens.sort_by(|&a, &b| texts[b as usize].len().cmp(&texts[a as usize].len()));
    special_tokens
}

/// The token for each byte: `<0xXX>` (else the byte's own one-character token) for SPM, the
/// byte-level character for BPE.
fn byte_token_table(
    kind: VocabKind,
    token_to_id: &HashMap<Box<str>, TokenId>,
) -> [Option<TokenId>; 256] {
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
    byte_tokens
}
