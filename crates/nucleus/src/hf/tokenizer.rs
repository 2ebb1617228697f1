//! `tokenizer.json` and `tokenizer_config.json` as GGUF tokenizer metadata: the vocabulary
//! with llama.cpp's token types (for decoding, special tokens and ends of generation), the
//! special ids, the chat template, and the whole `tokenizer.json` as
//! `tokenizer.huggingface.json`, through which [`crate::tokenizer::Tokenizer`] encodes.

use std::path::Path;

use serde_json::Value;

use super::config::Config;
use super::HfError;
use crate::gguf::{MetaType, MetaValue, Metadata};
use crate::tokenizer::HF_JSON_KEY;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// A special token in `tokenizer_config.json`: a string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// Whether the Hugging Face tokenizer works on bytes mapped to characters (GPT-2's byte-level
/// BPE: Llama 3, Qwen2) rather than SentencePiece-style text with `▁` and `<0xXX>` tokens.
fn is_byte_level(v: &Value) -> bool {
    let mentions = |part: Option<&Value>| {
        part.is_some_and(|p| serde_json::to_string(p).is_ok_and(|s| s.contains("\"ByteLevel\"")))
    };
    mentions(v.get("decoder")) || mentions(v.get("pre_tokenizer"))
}

/// Added tokens convert_hf_to_gguf.py makes control tokens even when not marked special.
fn looks_special(text: &str) -> bool {
    matches!(text, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (text.starts_with("<|") && text.ends_with("|>"))
        || (text.starts_with("<｜") && text.ends_with("｜>"))
        || (text.starts_with("<unused") && text.ends_with('>'))
}

/// Adds the tokenizer metadata of the checkpoint in `dir` to `meta`. Returns why llama.cpp
/// could not read the vocabulary, when it could not (see [`super::vocab`]); nucleus reads it
/// through `tokenizer.huggingface.json` either way.
pub fn tokenizer_metadata(
    dir: &Path,
    cfg: &Config,
    meta: &mut Metadata,
) -> Result<Option<String>, HfError> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        return Err(HfError::Missing {
            path: path.display().to_string(),
            what: "tokenizer.json",
        });
    }
    let json = super::read_to_string(&path)?;
    let bad = |problem: String| HfError::BadFile {
        path: path.display().to_string(),
        problem,
    };
    let tok = tokenizers::Tokenizer::from_bytes(json.as_bytes())
        .map_err(|e| bad(format!("not a tokenizer the tokenizers crate reads: {e}")))?;
    let v: Value = serde_json::from_str(&json).map_err(|e| bad(format!("not JSON: {e}")))?;
    let byte_level = is_byte_level(&v);
    let vocab = tok.get_vocab(true);
    let (tokens, types) = token_list(&tok, &v, &vocab, cfg.n_vocab, byte_level).map_err(bad)?;
    let id_of = |text: &str| vocab.get(text).copied();

    // tokenizer_config.json: special tokens, BOS/EOS flags, chat template.
    let tc = tokenizer_config(dir)?;
    let bos = token_text(tc.get("bos_token"))
        .and_then(id_of)
        .or(cfg.bos_token_id);
    let eos = token_text(tc.get("eos_token"))
        .and_then(id_of)
        .or(cfg.eos_token_ids.first().copied());
    let add_bos = adds_token(&tok, &tc, "add_bos_token", bos, true)?;
    let add_eos = adds_token(&tok, &tc, "add_eos_token", eos, false)?;
    let template = chat_template(dir, &tc)?;

    let mut keys = Metadata::default();
    let mut put = |k: &str, v: MetaValue| {
        keys.insert(k.to_string(), v);
    };
    put(
        "tokenizer.ggml.model",
        MetaValue::String(if byte_level { "gpt2" } else { "llama" }.into()),
    );
    let texts: Vec<String> = tokens
        .iter()
        .map(|t| t.as_str().unwrap_or_default().to_string())
        .collect();
    put(
        "tokenizer.ggml.tokens",
        MetaValue::Array(MetaType::String, tokens),
    );
    put(
        "tokenizer.ggml.token_type",
        MetaValue::Array(MetaType::I32, types),
    );
    if let Some(id) = bos {
        put("tokenizer.ggml.bos_token_id", MetaValue::U32(id));
    }
    if let Some(id) = eos {
        put("tokenizer.ggml.eos_token_id", MetaValue::U32(id));
    }
    if let Some(id) = token_text(tc.get("pad_token")).and_then(id_of) {
        put("tokenizer.ggml.padding_token_id", MetaValue::U32(id));
    }
    put("tokenizer.ggml.add_bos_token", MetaValue::Bool(add_bos));
    put("tokenizer.ggml.add_eos_token", MetaValue::Bool(add_eos));
    if let Some(t) = template {
        put("tokenizer.chat_template", MetaValue::String(t));
    }
    let problem = match super::vocab::llama_cpp_keys(&v, &tok, &texts, byte_level, &keys) {
        Ok(more) => {
            for (k, value) in more.iter() {
                keys.insert(k.to_string(), value.clone());
            }
            None
        }
        Err(why) => Some(why),
    };
    for (k, value) in keys.iter() {
        meta.insert(k.to_string(), value.clone());
    }
    meta.insert(HF_JSON_KEY.to_string(), MetaValue::String(json));
    Ok(problem)
}

/// The vocabulary's texts and token types, padded to the embedding's `n_vocab` rows as
/// convert_hf_to_gguf.py pads it; or why not.
fn token_list(
    tok: &tokenizers::Tokenizer,
    v: &Value,
    vocab: &std::collections::HashMap<String, u32>,
    n_vocab: usize,
    byte_level: bool,
) -> Result<(Vec<MetaValue>, Vec<MetaValue>), String> {
    let n_tokens = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
    if n_tokens > n_vocab {
        return Err(format!(
            "it has token ids up to {}, but config.json's vocab_size is {}",
            n_tokens - 1,
            n_vocab
        ));
    }
    let mut texts: Vec<Option<String>> = vec![None; n_vocab];
    for (text, &id) in vocab {
        texts[id as usize] = Some(text.clone());
    }
    let added = tok.get_added_tokens_decoder();
    let unk_text = v.pointer("/model/unk_token").and_then(Value::as_str);
    let mut tokens = Vec::with_capacity(n_vocab);
    let mut types = Vec::with_capacity(n_vocab);
    for (id, text) in texts.into_iter().enumerate() {
        let (text, ty) = match text {
            None => (format!("[PAD{id}]"), UNUSED),
            Some(t) => {
                // Byte-fallback tokens are bytes even when listed as added tokens.
                let byte = !byte_level
                    && t.len() == 6
                    && t.starts_with("<0x")
                    && t.ends_with('>')
                    && u8::from_str_radix(&t[3..5], 16).is_ok();
                let ty = match added.get(&(id as u32)) {
                    _ if byte => BYTE,
                    _ if !byte_level && unk_text == Some(t.as_str()) => UNKNOWN,
                    Some(a) if a.special || (byte_level && looks_special(&t)) => CONTROL,
                    Some(_) => USER_DEFINED,
                    None => NORMAL,
                };
                (t, ty)
            }
        };
        tokens.push(MetaValue::String(text));
        types.push(MetaValue::I32(ty));
    }
    Ok((tokens, types))
}

/// `tokenizer_config.json` in `dir`, or null where there is none.
fn tokenizer_config(dir: &Path) -> Result<Value, HfError> {
    let tc_path = dir.join("tokenizer_config.json");
    if !tc_path.is_file() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&super::read_to_string(&tc_path)?).map_err(|e| HfError::BadFile {
        path: tc_path.display().to_string(),
        problem: format!("not JSON: {e}"),
    })
}

/// Whether encoding adds token `id` (first: at the start, else at the end). tokenizer.json's
/// post-processor decides unless tokenizer_config.json's `flag` says otherwise (as
/// transformers' fast llama tokenizer rebuilds its post-processor from it).
fn adds_token(
    tok: &tokenizers::Tokenizer,
    tc: &Value,
    flag: &str,
    id: Option<u32>,
    first: bool,
) -> Result<bool, HfError> {
    if let Some(b) = tc.get(flag).and_then(Value::as_bool) {
        return Ok(b);
    }
    let Some(id) = id else { return Ok(false) };
    let with = tok
        .encode("a", true)
        .map_err(|e| HfError::Tokenizer(e.to_string()))?;
    let ids = with.get_ids();
    let plain = tok
        .encode("a", false)
        .map_err(|e| HfError::Tokenizer(e.to_string()))?;
    let extra = ids.len() > plain.get_ids().len();
    Ok(extra && if first { ids.first() } else { ids.last() } == Some(&id))
}

/// The chat template: tokenizer_config.json's (of a list of named ones, the default), else
/// `chat_template.jinja` beside it, as newer transformers save it.
fn chat_template(dir: &Path, tc: &Value) -> Result<Option<String>, HfError> {
    let template = match tc.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(items)) => items
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    };
    if template.is_some() {
        return Ok(template);
    }
    let p = dir.join("chat_template.jinja");
    if p.is_file() {
        Ok(Some(super::read_to_string(&p)?))
    } else {
        Ok(None)
    }
}
