//! Fill-in-the-middle prompts: the model's FIM tokens around a prefix, a suffix and other files
//! of the project, laid out as llama-server's `format_prompt_infill` lays them out (the
//! repo-level pattern of the Qwen2.5-Coder report, arXiv:2409.12186):
//!
//! ```text
//! [FIM_REP]myproject\n
//! [FIM_SEP]{filename}\n{text}        (one per extra file)
//! [FIM_SEP]filename\n
//! [BOS][FIM_PRE]{prefix}{prompt}[FIM_SUF]{suffix}[FIM_MID]
//! ```
//!
//! with llama-server's truncation: the prefix keeps its last `3/4 * n_batch` tokens, the suffix
//! its first `n_batch/4 - 2 - |prompt|`, and the extra context its last
//! `n_ctx - n_batch - 2 * n_predict` tokens (`[BOS]` only for a model that adds one). The
//! `prompt` goes right after the prefix, before `[FIM_SUF]`, as in llama-server's code.

use serde_json::Value;

use nucleus::tokenizer::{FimTokens, TokenId, Tokenizer};

use crate::ApiError;

/// llama-server's default `--batch-size`, which sizes the prefix and suffix kept.
pub const N_BATCH: usize = 2048;

/// llama-server's default `--n-predict` (-1: no limit), which sizes the extra context kept.
pub const N_PREDICT: i64 = -1;

/// One file of the project given as context (`input_extra`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtraFile {
    /// llama-server's default: `tmp`.
    pub filename: String,
    pub text: String,
}

/// The prefix, middle and suffix tokens of a model that can fill in the middle, or the 400
/// (naming `field`) for one that cannot, with llama-server's message.
pub fn required_tokens(tok: &Tokenizer, field: &str) -> Result<[TokenId; 3], ApiError> {
    let f = tok.fim();
    match (f.pre, f.suf, f.mid) {
        (Some(p), Some(s), Some(m)) => Ok([p, s, m]),
        _ => {
            let mut missing = String::new();
            for (id, name) in [(f.pre, "prefix"), (f.suf, "suffix"), (f.mid, "middle")] {
                if id.is_none() {
                    missing.push_str(&format!(" {name} token is missing."));
                }
            }
            Err(ApiError::param(
                field,
                format!(
                    "`{field}` needs a model that fills in the middle; infill is not supported by this model:{missing}"
                ),
            )
            .with_code("fim_not_supported"))
        }
    }
}

/// llama-server's `tokenize_mixed` without special tokens: a string, or a list of strings and
/// token ids (`field` names the request field in errors).
pub fn mixed_tokens(tok: &Tokenizer, v: &Value, field: &str) -> Result<Vec<TokenId>, ApiError> {
    let encode = |s: &str| {
        tok.encode(s, false, false)
            .map_err(|e| ApiError::param(field, format!("cannot tokenize `{field}`: {e}")))
    };
    let bad = || {
        ApiError::param(
            field,
            format!("`{field}` must be a string or a list of strings and token ids"),
        )
    };
    match v {
        Value::String(s) => encode(s),
        Value::Array(items) => {
            let mut out = Vec::new();
            for item in items {
                match item {
                    Value::String(s) => out.extend(encode(s)?),
                    Value::Number(n) => {
                        let id = n
                            .as_u64()
                            .filter(|&t| (t as usize) < tok.vocab_size())
                            .ok_or_else(|| {
                                ApiError::param(field, format!("token id {n} is out of range"))
                            })?;
                        out.push(id as TokenId);
                    }
                    _ => return Err(bad()),
                }
            }
            Ok(out)
        }
        _ => Err(bad()),
    }
}

/// `input_extra`: a list of `{"text": string, "filename": string}` (filename optional).
pub fn extra_files(v: Option<&Value>) -> Result<Vec<ExtraFile>, ApiError> {
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(ApiError::param(
                "input_extra",
                "`input_extra` must be an array of {\"filename\": string, \"text\": string}",
            ))
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let field = format!("input_extra[{i}]");
            let text = c.get("text").and_then(Value::as_str).ok_or_else(|| {
                ApiError::param(
                    &field,
                    format!("`{field}` must contain a \"text\" field with a string value"),
                )
            })?;
            let filename = match c.get("filename") {
                None => "tmp",
                Some(Value::String(s)) => s,
                Some(_) => {
                    return Err(ApiError::param(
                        &field,
                        format!("`{field}.filename` must be a string"),
                    ))
                }
            };
            Ok(ExtraFile {
                filename: filename.to_string(),
                text: text.to_string(),
            })
        })
        .collect()
}

/// The inputs of one fill-in-the-middle prompt, tokenized.
pub struct Infill<'a> {
    pub prefix: Vec<TokenId>,
    pub suffix: Vec<TokenId>,
    pub extra: &'a [ExtraFile],
    /// Text the middle starts with (llama-server's `prompt`).
    pub prompt: Vec<TokenId>,
}

/// The prompt tokens, as llama-server's `format_prompt_infill` builds them for a context
/// window of `n_ctx` tokens (see the module's documentation). `fim` must have the prefix,
/// suffix and middle tokens ([`required_tokens`]).
pub fn format_infill(
    tok: &Tokenizer,
    input: Infill<'_>,
    n_batch: usize,
    n_predict: i64,
    n_ctx: usize,
) -> Result<Vec<TokenId>, ApiError> {
    let [pre, suf, mid] = required_tokens(tok, "input_suffix")?;
    let FimTokens { rep, sep, .. } = tok.fim();
    // Plain text, no BOS (llama.cpp's `common_tokenize(vocab, text, false, false)`).
    let enc = |s: &str| {
        tok.encode(s, false, false)
            .map_err(|e| ApiError::param("input_extra", format!("cannot tokenize: {e}")))
    };
    let mut extra = Vec::new();
    if let Some(rep) = rep {
        extra.push(rep);
        extra.extend(enc("myproject\n")?);
    }
    for file in input.extra {
        match sep {
            Some(sep) => {
                extra.push(sep);
                extra.extend(enc(&format!("{}\n", file.filename))?);
            }
            // llama-server's separator for models without one.
            None => extra.extend(enc("\n\n--- snippet ---\n\n")?),
        }
        extra.extend(enc(&file.text)?);
    }
    if let Some(sep) = sep {
        extra.push(sep);
        extra.extend(enc("filename\n")?);
    }
    let Infill {
        mut prefix,
        mut suffix,
        prompt,
        ..
    } = input;
    // Ratio prefix:suffix = 3:1 of a batch.
    let n_prefix_take = prefix.len().min(3 * (n_batch / 4));
    let suffix_room = (n_batch / 4) as i64 - (2 + prompt.len() as i64);
    let n_suffix_take = suffix.len().min(suffix_room.max(0) as usize);
    let extra_room = n_ctx as i64 - n_batch as i64 - 2 * n_predict;
    let n_extra_take = (extra_room.max(0) as usize).min(extra.len());
    prefix.drain(..prefix.len() - n_prefix_take);
    suffix.truncate(n_suffix_take);

    let mut out = Vec::with_capacity(n_extra_take + prefix.len() + suffix.len() + 8);
    out.extend_from_slice(&extra[extra.len() - n_extra_take..]);
    if tok.add_bos() {
        out.extend(tok.bos());
    }
    out.push(pre);
    out.extend(prefix);
    out.extend(prompt);
    out.push(suf);
    out.extend(suffix);
    out.push(mid);
    Ok(out)
}
