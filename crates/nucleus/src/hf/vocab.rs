//! The vocabulary as llama.cpp reads it, written beside `tokenizer.huggingface.json` so that a
//! GGUF written from a checkpoint also tokenizes in llama.cpp:
//! - byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2): `tokenizer.ggml.merges` and the
//!   `tokenizer.ggml.pre` name of the pre-tokenizer (the model is `"gpt2"`);
//! - SentencePiece-style BPE (Llama 2's `▁` and `<0xXX>` byte fallback): `"llama"` with
//!   scores that rank each token by the first merge that makes it, so that llama.cpp's
//!   highest-score-first merging replays the merges in order; Unigram: its own scores;
//!   `add_space_prefix` from the normalizer or the `Metaspace` pre-tokenizer.
//!
//! convert_hf_to_gguf.py names the pre-tokenizer by hashing the ids of one check text and
//! looking the hash up in its table of released models, so it refuses every other vocabulary
//! (a tiny test one included). nucleus names it by what tokenizer.json says it does (the
//! pre-tokenizer's kind and regex), then checks the choice by behaviour: nucleus's own
//! tokenizer, which reproduces llama.cpp's and is built here from the written keys alone, must
//! give the ids the `tokenizers` crate gives on [`CHECK_TEXTS`]. A vocabulary it cannot name,
//! or that fails the check, comes back as the reason: nucleus still runs it (through
//! tokenizer.json), but refuses to write it to a GGUF file that llama.cpp would tokenize
//! differently.

use serde_json::Value;

use crate::gguf::{MetaType, MetaValue, Metadata};

/// Texts the written vocabulary must tokenize as the `tokenizers` crate does: runs of spaces
/// and newlines, digits of every length, contractions in both cases, punctuation runs,
/// accents, CJK, emoji (byte fallback), code.
pub const CHECK_TEXTS: &[&str] = &[
    "Hello world",
    " Hello  world.\n\nThe end",
    "\n \n\n \t\t x \n   y    ",
    "3 33 333 3333 33333 3.14 1,000,000 2024-05-01",
    "I've been told he's there; you'LL see, WE'RE sure, they'd've",
    "!!! ??? ... ------====== ''' \"\"\" ```",
    "naïve café résumé Ünïcödé",
    "我想在apple工作1314151天～ нещо на Български",
    "🚀 (emoji) 😶‍🌫️ ✅ 🦙🦙",
    "fn main() {\n    println!(\"{}\", x + 1);\n}\n",
];

/// The Hugging Face pre-tokenizer regexes of Llama 3 and Qwen2 (`Split` before a
/// `ByteLevel` that no longer splits); they differ only in how digits group.
const HF_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const HF_QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn kind(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

/// A `Sequence`'s parts (under `key`), or the one part itself.
fn parts<'a>(v: &'a Value, key: &str) -> Vec<&'a Value> {
    match (kind(v), v.get(key).and_then(Value::as_array)) {
        (Some("Sequence"), Some(items)) => items.iter().collect(),
        (None, _) => Vec::new(),
        _ => vec![v],
    }
}

/// llama.cpp's name for a byte-level BPE pre-tokenizer (`tokenizer.ggml.pre`).
fn byte_level_pre(json: &Value) -> Result<&'static str, String> {
    let normalizer = json.get("normalizer").unwrap_or(&Value::Null);
    match kind(normalizer) {
        // llama.cpp does not normalize; NFC leaves text already in NFC alone (Qwen2's).
        None | Some("NFC") => {}
        Some(other) => {
            return Err(format!(
                "a {other} normalizer, which llama.cpp does not apply"
            ))
        }
    }
    let pre = json.get("pre_tokenizer").unwrap_or(&Value::Null);
    let steps = parts(pre, "pretokenizers");
    let describe = || serde_json::to_string(pre).unwrap_or_default();
    let ignore_merges = json
        .pointer("/model/ignore_merges")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let byte_level_splits = |s: &Value| {
        kind(s) == Some("ByteLevel") && s.get("use_regex").and_then(Value::as_bool) != Some(false)
    };
    let name = match steps.as_slice() {
        // GPT-2's own regex inside ByteLevel.
        [b] if byte_level_splits(b) => Some("gpt-2"),
        // Digits one by one, then GPT-2's regex (SmolLM, StarCoder).
        [d, b]
            if kind(d) == Some("Digits")
                && d.get("individual_digits").and_then(Value::as_bool) == Some(true)
                && byte_level_splits(b) =>
        {
            Some("smollm")
        }
        [split, b] if kind(split) == Some("Split") && kind(b) == Some("ByteLevel") => {
            let regex = split.pointer("/pattern/Regex").and_then(Value::as_str);
            let isolated = split.get("behavior").and_then(Value::as_str) == Some("Isolated");
            match regex {
                _ if !isolated || byte_level_splits(b) => None,
                // llama.cpp's llama-bpe takes a whole word that is a token as it is.
                Some(HF_LLAMA3) if ignore_merges => Some("llama-bpe"),
                Some(HF_LLAMA3) => Some("smaug-bpe"),
                Some(HF_QWEN2) if !ignore_merges => Some("qwen2"),
                _ => None,
            }
        }
        _ => None,
    };
    name.ok_or_else(|| {
        format!(
            "its pre-tokenizer {} is not one nucleus can name for llama.cpp (GPT-2's, SmolLM's, \
             Llama 3's or Qwen2's)",
            describe()
        )
    })
}

/// `tokenizer.json`'s merges as GGUF writes them: "left right", a space inside a part
/// written as `Ġ` (gguf-py's rule for the list-of-pairs form).
fn merges(json: &Value) -> Result<Vec<String>, String> {
    let list = json
        .pointer("/model/merges")
        .and_then(Value::as_array)
        .ok_or("its BPE model has no merges list")?;
    list.iter()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(pair) => match pair.as_slice() {
                [Value::String(a), Value::String(b)] => {
                    Ok(format!("{} {}", a.replace(' ', "Ġ"), b.replace(' ', "Ġ")))
                }
                _ => Err(format!("merge {m} is not a pair of strings")),
            },
            _ => Err(format!("merge {m} is neither \"a b\" nor [\"a\", \"b\"]")),
        })
        .collect()
}

/// SentencePiece scores for a BPE vocabulary: minus the rank of the first merge that makes
/// each token; tokens no merge makes rank below every merge.
fn bpe_scores(json: &Value, texts: &[String]) -> Result<Vec<f32>, String> {
    let merges = merges(json)?;
    let lowest = -(merges.len() as f32) - 1.0;
    let mut scores = vec![lowest; texts.len()];
    let ids: std::collections::HashMap<&str, usize> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    for (rank, m) in merges.iter().enumerate().rev() {
        let merged: String = m.split(' ').collect();
        if let Some(&id) = ids.get(merged.as_str()) {
            scores[id] = -(rank as f32);
        }
    }
    Ok(scores)
}

/// A Unigram model's own log-probabilities, by id.
fn unigram_scores(json: &Value, n: usize) -> Result<Vec<f32>, String> {
    let vocab = json
        .pointer("/model/vocab")
        .and_then(Value::as_array)
        .ok_or("its Unigram model has no vocab list")?;
    let mut scores = vec![-1e9f32; n];
    for (id, entry) in vocab.iter().enumerate().take(n) {
        scores[id] = entry
            .get(1)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("Unigram entry {id} has no score"))? as f32;
    }
    Ok(scores)
}

/// Whether SentencePiece-style text starts with `▁` (a `Prepend` normalizer, or a
/// `Metaspace` pre-tokenizer that prepends).
fn adds_space_prefix(json: &Value) -> bool {
    let normalizer = json.get("normalizer").unwrap_or(&Value::Null);
    let prepends = parts(normalizer, "normalizers")
        .iter()
        .any(|n| kind(n) == Some("Prepend"));
    let pre = json.get("pre_tokenizer").unwrap_or(&Value::Null);
    let metaspace = parts(pre, "pretokenizers").into_iter().any(|p| {
        kind(p) == Some("Metaspace")
            && match p.get("prepend_scheme").and_then(Value::as_str) {
                Some(scheme) => scheme != "never",
                None => p.get("add_prefix_space").and_then(Value::as_bool) != Some(false),
            }
    });
    prepends || metaspace
}

/// llama.cpp's keys for the vocabulary of `json` (beyond the tokens, token types and special
/// ids already in `tokenizer_keys`), checked against `hf` on [`CHECK_TEXTS`]; or why it
/// cannot be written for llama.cpp.
pub(super) fn llama_cpp_keys(
    json: &Value,
    hf: &tokenizers::Tokenizer,
    texts: &[String],
    byte_level: bool,
    tokenizer_keys: &Metadata,
) -> Result<Metadata, String> {
    let model = json.pointer("/model/type").and_then(Value::as_str);
    let mut keys = Metadata::default();
    let mut put = |k: &str, v: MetaValue| {
        keys.insert(k.to_string(), v);
    };
    let string_array = |items: Vec<String>| {
        MetaValue::Array(
            MetaType::String,
            items.into_iter().map(MetaValue::String).collect(),
        )
    };
    let f32_array = |items: Vec<f32>| {
        MetaValue::Array(
            MetaType::F32,
            items.into_iter().map(MetaValue::F32).collect(),
        )
    };
    match model {
        Some("BPE") if byte_level => {
            put(
                "tokenizer.ggml.pre",
                MetaValue::String(byte_level_pre(json)?.into()),
            );
            put("tokenizer.ggml.merges", string_array(merges(json)?));
        }
        Some(m @ ("BPE" | "Unigram")) => {
            let scores = if m == "BPE" {
                bpe_scores(json, texts)?
            } else {
                unigram_scores(json, texts.len())?
            };
            put("tokenizer.ggml.pre", MetaValue::String("default".into()));
            put("tokenizer.ggml.scores", f32_array(scores));
            put(
                "tokenizer.ggml.add_space_prefix",
                MetaValue::Bool(adds_space_prefix(json)),
            );
            let unk = json.pointer("/model/unk_token").and_then(Value::as_str);
            if let Some(id) = unk.and_then(|t| hf.token_to_id(t)) {
                put("tokenizer.ggml.unknown_token_id", MetaValue::U32(id));
            }
        }
        Some(other) => {
            return Err(format!(
                "a {other} model, which nucleus does not write for llama.cpp"
            ))
        }
        None => return Err("its model has no type".into()),
    }
    check(hf, tokenizer_keys, &keys)?;
    Ok(keys)
}

/// nucleus's tokenizer from `tokenizer_keys` and `keys` alone (llama.cpp's algorithm) must
/// give the ids `hf` gives.
fn check(
    hf: &tokenizers::Tokenizer,
    tokenizer_keys: &Metadata,
    keys: &Metadata,
) -> Result<(), String> {
    let mut meta = tokenizer_keys.clone();
    for (k, v) in keys.iter() {
        meta.insert(k.to_string(), v.clone());
    }
    let ours = crate::tokenizer::Tokenizer::from_gguf(&meta)
        .map_err(|e| format!("llama.cpp's reading of it fails: {e}"))?;
    let mut hf = hf.clone();
    hf.with_truncation(None).map_err(|e| e.to_string())?;
    hf.with_padding(None);
    for text in CHECK_TEXTS {
        let want = hf.encode(*text, false).map_err(|e| e.to_string())?;
        let got = ours
            .encode(text, false, false)
            .map_err(|e| format!("llama.cpp's reading of it fails on {text:?}: {e}"))?;
        if got != want.get_ids() {
            return Err(format!(
                "as llama.cpp reads it ({} {}), {text:?} becomes {got:?}, not {:?} as \
                 tokenizer.json says",
                meta.get_str("tokenizer.ggml.model").unwrap_or("?"),
                meta.get_str("tokenizer.ggml.pre").unwrap_or("?"),
                want.get_ids()
            ));
        }
    }
    Ok(())
}
