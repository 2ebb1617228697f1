//! What the fuzz targets share: the real vocabularies and templates they run on, and the
//! properties checked on every input. The vocabularies come from the catalog models
//! (`$NUCLEUS_MODELS`, default `~/.cache/nucleus/models`; `nucleus pull` fetches them) and
//! llama.cpp's vocabulary files in `../shared/tokenizer-vectors`.

use std::path::PathBuf;
use std::sync::OnceLock;

use nucleus::chat::ChatTemplate;
use nucleus::gguf::GgufFile;
use nucleus::tokenizer::{Escapes, StreamDecoder, TokenId, Tokenizer, VocabKind};

/// gemma-3's chat template (its `tokenizer_config.json`): gemma-3-270m's file has none.
pub const GEMMA3_TEMPLATE: &str =
    include_str!("../../crates/nucleus/tests/data/gemma3_template.jinja");

fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("NUCLEUS_MODELS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/nucleus/models")
}

fn load(path: PathBuf) -> Tokenizer {
    let file = GgufFile::open(&path).unwrap_or_else(|e| {
        panic!(
            "fuzz setup: cannot open {} ({e}); pull the models first (`nucleus pull NAME`)",
            path.display()
        )
    });
    Tokenizer::from_gguf(&file.metadata).expect("fuzz setup: the vocabulary loads")
}

/// qwen2.5-coder's byte-level BPE vocabulary (and its chat template).
pub fn qwen() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load(models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")))
}

/// gemma-3's SentencePiece vocabulary (no space prefix, byte fallback).
pub fn gemma() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load(models_dir().join("gemma-3-270m-q4_k_m.gguf")))
}

/// llama's SentencePiece vocabulary (space prefix, byte fallback), from llama.cpp's test files.
pub fn llama_spm() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        load(PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/tokenizer-vectors/ggml-vocab-llama-spm.gguf"
        )))
    })
}

/// The template of `tok` (its own, or gemma-3's when `gemma`).
pub fn template_for(tok: &Tokenizer, source: &str) -> ChatTemplate {
    let text = |id: Option<TokenId>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
    ChatTemplate::new(source, &text(tok.bos()), &text(tok.eos())).expect("the template compiles")
}

pub fn qwen_template() -> &'static ChatTemplate {
    static T: OnceLock<ChatTemplate> = OnceLock::new();
    T.get_or_init(|| template_for(qwen(), qwen().chat_template().expect("qwen has a template")))
}

pub fn gemma_template() -> &'static ChatTemplate {
    static T: OnceLock<ChatTemplate> = OnceLock::new();
    T.get_or_init(|| template_for(gemma(), GEMMA3_TEMPLATE))
}

/// Encode and decode `data` with `tok`; panics when a property does not hold.
///
/// `data[0]` holds the flags, the rest is the text (lossily UTF-8) and, read as little-endian
/// u32s, token ids for decoding (out of range ones included).
pub fn check_tokenizer(tok: &Tokenizer, data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let (add_special, parse_special) = (flags & 1 != 0, flags & 2 != 0);
    let n_vocab = tok.vocab_size();
    // The pre-tokenizer's regexes may give up on a pathological input (an error, not a panic).
    let Ok(ids) = tok.encode(&text, add_special, parse_special) else {
        return;
    };
    assert!(ids.iter().all(|&id| (id as usize) < n_vocab));
    let plain = tok
        .encode(&text, false, false)
        .expect("encoded once already");
    // Plain text round-trips (byte-level BPE and SPM with byte fallback lose nothing; SPM adds
    // its space prefix, and decodes its space marker "▁" as a space, typed or not, as
    // SentencePiece and llama.cpp do).
    let decoded = tok.decode(&plain, false);
    let unk = tok.unk().is_some_and(|u| plain.contains(&u));
    if !unk {
        let want = match tok.kind() {
            VocabKind::Spm => {
                let t = text.replace('▁', " ");
                if tok.add_space_prefix() && !text.is_empty() {
                    format!(" {t}")
                } else {
                    t
                }
            }
            VocabKind::Bpe => text.to_string(),
        };
        assert_eq!(decoded, want, "decode(encode(text)) != text");
    }
    // Text escaped for a chat template and tokenized as a prompt is the plain text's tokens.
    let mut escapes = Escapes::new();
    let escaped = tok.escape_plain(&text, &mut escapes);
    let via_escape = tok
        .encode_escaped(&escaped, false, &escapes)
        .expect("the plain text encoded");
    assert_eq!(
        via_escape, plain,
        "escaped text does not tokenize as plain text"
    );
    // Arbitrary ids: decoding never fails, and streaming gives the same text.
    let raw: Vec<TokenId> = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) % (n_vocab as u32 + 16))
        .chain(ids.iter().copied())
        .collect();
    for skip in [false, true] {
        let whole = tok.decode(&raw, skip);
        let mut dec = StreamDecoder::new(tok, skip);
        let mut streamed: String = raw.iter().map(|&id| dec.push(id)).collect();
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, whole, "streamed decoding differs");
    }
}

/// The grammar compiler for qwen's vocabulary (building llguidance's token trie once).
fn qwen_grammars() -> &'static nucleus::sampling::grammar::GrammarCompiler {
    static C: OnceLock<nucleus::sampling::grammar::GrammarCompiler> = OnceLock::new();
    C.get_or_init(|| {
        nucleus::sampling::grammar::GrammarCompiler::new(qwen())
            .expect("fuzz setup: the grammar compiler builds")
    })
}

/// The grammar stage on arbitrary input: byte 0 picks the kind (JSON Schema, Lark, regex, any
/// JSON object), the text up to the first NUL is the grammar, and the bytes after it pick up to
/// 16 tokens among those the mask allows. A grammar may be refused with an error; compiling,
/// masking and advancing must not panic, and a token the mask allowed must be accepted.
pub fn check_grammar(data: &[u8]) {
    use nucleus::sampling::grammar::GrammarSpec;
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let cut = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let text = String::from_utf8_lossy(&rest[..cut]).into_owned();
    let picks = rest.get(cut + 1..).unwrap_or(&[]);
    let spec = match kind % 4 {
        0 => match serde_json::from_str(&text) {
            Ok(v) => GrammarSpec::JsonSchema(v),
            Err(_) => return,
        },
        1 => GrammarSpec::Lark(text),
        2 => GrammarSpec::Regex(text),
        _ => GrammarSpec::JsonObject,
    };
    let Ok(mut g) = qwen_grammars().compile(&spec) else {
        return;
    };
    let mut logits = vec![0f32; qwen().vocab_size()];
    for pick in picks.chunks(2).take(16) {
        logits.fill(0.0);
        let Ok(n_allowed) = g.apply_mask(&mut logits) else {
            return;
        };
        let allowed: Vec<TokenId> = (0..logits.len())
            .filter(|&i| logits[i] == 0.0)
            .map(|i| i as TokenId)
            .collect();
        assert!(allowed.len() <= n_allowed, "the mask sets more logits than it allows");
        if allowed.is_empty() || g.is_complete() {
            return;
        }
        let pick = pick.iter().fold(0usize, |a, &b| a * 256 + b as usize);
        let t = allowed[pick % allowed.len()];
        assert!(g.allows(t), "token {t} unmasked but not allowed");
        if let Err(e) = g.accept(t) {
            panic!("token {t} was allowed by the mask but refused: {e}");
        }
    }
}
