//! The GGUF a Hugging Face checkpoint is written as carries the vocabulary the way llama.cpp
//! reads it (`crate::hf::vocab`): the committed tiny checkpoints of `tests/data/hf` (and
//! their tokenizer.json with other pre-tokenizers swapped in) are written to GGUF files, read
//! back, and checked key by key; then nucleus's tokenizer built from the file's
//! `tokenizer.ggml.*` keys alone (llama.cpp's algorithm, not tokenizer.json) must give the ids
//! the `tokenizers` crate gives. `scripts/hf_gguf_llama_cpp.sh` runs llama.cpp itself on such
//! files.

use std::path::{Path, PathBuf};

use nucleus::gguf::{GgufFile, Metadata};
use nucleus::hf::Checkpoint;
use nucleus::quant::quantize::{quantize_source, Mix};
use nucleus::tokenizer::{Tokenizer, HF_JSON_KEY};
use serde_json::{json, Value};

fn data() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/hf"))
}

/// Texts other than the conversion's own check texts.
const TEXTS: &[&str] = &[
    "The quick brown fox jumps over the lazy dog.",
    "def main():\n    return 42\n",
    "  spaces,\ttabs and numbers 12345 67 ",
    "héllo wörld ✓ 日本語 🤖",
    "It's 'quoted', isn't it? DON'T!",
    "a\n\n\nb\r\nc",
    "",
];

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("nucleus-vocab-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A checkpoint directory: `weights`' config and tensors, `tokenizer`'s tokenizer files, and
/// tokenizer.json edited by `edit`.
fn checkpoint(
    scratch: &Scratch,
    weights: &str,
    tokenizer: &str,
    edit: impl Fn(&mut Value),
) -> PathBuf {
    let dir = scratch.0.join("ckpt");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(data().join(weights).join(f), dir.join(f)).unwrap();
    }
    for f in ["tokenizer_config.json", "chat_template.jinja"] {
        let from = data().join(tokenizer).join(f);
        if from.is_file() {
            std::fs::copy(from, dir.join(f)).unwrap();
        }
    }
    let mut tj: Value = serde_json::from_str(
        &std::fs::read_to_string(data().join(tokenizer).join("tokenizer.json")).unwrap(),
    )
    .unwrap();
    edit(&mut tj);
    std::fs::write(dir.join("tokenizer.json"), tj.to_string()).unwrap();
    dir
}

/// The checkpoint written as an F16 GGUF file, read back.
fn written(scratch: &Scratch, dir: &Path) -> GgufFile {
    let ckpt = Checkpoint::open(dir).unwrap();
    ckpt.check_llama_cpp_vocab().unwrap();
    let out = scratch.0.join("out.gguf");
    quantize_source(&ckpt, &out, &Mix::parse("F16").unwrap(), 1, &mut |_| {}).unwrap();
    GgufFile::open(&out).unwrap()
}

/// The file's metadata without tokenizer.json: what llama.cpp reads.
fn without_hf_json(meta: &Metadata) -> Metadata {
    let mut plain = Metadata::default();
    for (k, v) in meta.iter().filter(|(k, _)| *k != HF_JSON_KEY) {
        plain.insert(k.to_string(), v.clone());
    }
    plain
}

/// nucleus's tokenizer from the file's `tokenizer.ggml.*` keys gives the `tokenizers` crate's
/// ids on [`TEXTS`], with and without BOS; as does the tokenizer that also has tokenizer.json.
fn tokenizes_as_hugging_face(file: &GgufFile, dir: &Path) {
    let hf = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let native = Tokenizer::from_gguf(&without_hf_json(&file.metadata)).unwrap();
    let through_json = Tokenizer::from_gguf(&file.metadata).unwrap();
    for text in TEXTS {
        let want = hf.encode(*text, false).unwrap().get_ids().to_vec();
        assert_eq!(native.encode(text, false, false).unwrap(), want, "{text:?}");
        assert_eq!(
            through_json.encode(text, false, false).unwrap(),
            want,
            "{text:?}"
        );
        let with_special = hf.encode(*text, true).unwrap().get_ids().to_vec();
        if !text.is_empty() {
            assert_eq!(
                native.encode(text, true, false).unwrap(),
                with_special,
                "{text:?} with BOS"
            );
        }
    }
}

fn str_key<'a>(meta: &'a Metadata, key: &str) -> &'a str {
    meta.get_str(key).unwrap_or_else(|| panic!("no {key}"))
}

fn tokenizer_json(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap()).unwrap()
}

/// The keys llama.cpp needs for a byte-level BPE vocabulary, as convert_hf_to_gguf.py writes them.
fn check_gpt2_keys(file: &GgufFile, dir: &Path, pre: &str) {
    let meta = &file.metadata;
    let tj = tokenizer_json(dir);
    assert_eq!(str_key(meta, "tokenizer.ggml.model"), "gpt2");
    assert_eq!(str_key(meta, "tokenizer.ggml.pre"), pre);
    let merges = meta.get_str_array("tokenizer.ggml.merges").unwrap();
    let want: Vec<String> = tj["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            pair => format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            ),
        })
        .collect();
    assert_eq!(merges, want);
    let n_vocab = meta
        .get_u64("llama.vocab_size")
        .or(meta.get_u64("qwen2.vocab_size"))
        .unwrap() as usize;
    let tokens = meta.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), n_vocab);
    assert_eq!(
        meta.get_i64_array("tokenizer.ggml.token_type")
            .unwrap()
            .len(),
        n_vocab
    );
    assert!(meta.get("tokenizer.ggml.scores").is_none());
    assert!(meta
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("<|im_start|>"));
}

#[test]
fn llama_checkpoint_writes_gpt2_vocab_with_merges_and_bos() {
    let s = Scratch::new("llama");
    let dir = checkpoint(&s, "llama-f32", "llama-f32", |_| {});
    let file = written(&s, &dir);
    check_gpt2_keys(&file, &dir, "gpt-2");
    let meta = &file.metadata;
    let tokens = meta.get_str_array("tokenizer.ggml.tokens").unwrap();
    let bos = meta.get_u64("tokenizer.ggml.bos_token_id").unwrap() as usize;
    assert_eq!(tokens[bos], "<|begin_of_text|>");
    assert_eq!(meta.get_bool("tokenizer.ggml.add_bos_token"), Some(true));
    assert_eq!(meta.get_bool("tokenizer.ggml.add_eos_token"), Some(false));
    let types = meta.get_i64_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types[bos], 3, "BOS is a control token");
    assert_eq!(types[tokens.iter().position(|t| *t == "a").unwrap()], 1);
    tokenizes_as_hugging_face(&file, &dir);
}

#[test]
fn qwen2_checkpoint_writes_gpt2_vocab_without_bos() {
    let s = Scratch::new("qwen2");
    let dir = checkpoint(&s, "qwen2-f32", "qwen2-f32", |_| {});
    let file = written(&s, &dir);
    check_gpt2_keys(&file, &dir, "gpt-2");
    let meta = &file.metadata;
    let tokens = meta.get_str_array("tokenizer.ggml.tokens").unwrap();
    let eos = meta.get_u64("tokenizer.ggml.eos_token_id").unwrap() as usize;
    assert_eq!(tokens[eos], "<|im_end|>");
    assert_eq!(meta.get_bool("tokenizer.ggml.add_bos_token"), Some(false));
    tokenizes_as_hugging_face(&file, &dir);
}

/// Llama 3's, Qwen2's and SmolLM's pre-tokenizers (their tokenizer.json forms) swapped into
/// the tiny vocabulary: each is named as llama.cpp names it, and tokenizes as the `tokenizers`
/// crate does under it.
#[test]
fn known_pre_tokenizers_are_named_as_llama_cpp_names_them() {
    let llama3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let qwen2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let split = |regex: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]})
    };
    let cases: Vec<(&str, Value, Option<Value>, bool)> = vec![
        ("llama-bpe", split(llama3), None, true),
        ("smaug-bpe", split(llama3), None, false),
        ("qwen2", split(qwen2), Some(json!({"type": "NFC"})), false),
        (
            "smollm",
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
            ]}),
            None,
            false,
        ),
    ];
    for (pre, pre_tokenizer, normalizer, ignore_merges) in cases {
        let s = Scratch::new(pre);
        let dir = checkpoint(&s, "qwen2-f32", "qwen2-f32", |tj| {
            tj["pre_tokenizer"] = pre_tokenizer.clone();
            tj["normalizer"] = normalizer.clone().unwrap_or(Value::Null);
            tj["model"]["ignore_merges"] = json!(ignore_merges);
        });
        let file = written(&s, &dir);
        check_gpt2_keys(&file, &dir, pre);
        tokenizes_as_hugging_face(&file, &dir);
    }
}

/// Merges in the older "a b" form are written as they are (the fixtures hold the
/// list-of-pairs form of tokenizers 0.20 and later).
#[test]
fn merges_as_strings_are_written_as_they_are() {
    let s = Scratch::new("strings");
    let dir = checkpoint(&s, "qwen2-f32", "qwen2-f32", |tj| {
        let strings: Vec<Value> = tj["model"]["merges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                json!(format!(
                    "{} {}",
                    m[0].as_str().unwrap(),
                    m[1].as_str().unwrap()
                ))
            })
            .collect();
        tj["model"]["merges"] = Value::Array(strings);
    });
    assert!(tokenizer_json(&dir)["model"]["merges"][0].is_string());
    let file = written(&s, &dir);
    check_gpt2_keys(&file, &dir, "gpt-2");
    tokenizes_as_hugging_face(&file, &dir);
}

/// Llama 2's kind of tokenizer.json (SentencePiece-style BPE with byte fallback): the
/// "llama" model with scores from the merge ranks, byte and unknown token types, and the
/// space prefix its normalizer prepends.
#[test]
fn sentencepiece_style_checkpoint_writes_llama_vocab_with_scores() {
    let s = Scratch::new("spm");
    let dir = checkpoint(&s, "llama-bf16", "spm-tokenizer", |_| {});
    let file = written(&s, &dir);
    let meta = &file.metadata;
    assert_eq!(str_key(meta, "tokenizer.ggml.model"), "llama");
    assert_eq!(str_key(meta, "tokenizer.ggml.pre"), "default");
    assert_eq!(meta.get_bool("tokenizer.ggml.add_space_prefix"), Some(true));
    let tokens = meta.get_str_array("tokenizer.ggml.tokens").unwrap();
    let types = meta.get_i64_array("tokenizer.ggml.token_type").unwrap();
    let scores = meta.get_f32_array("tokenizer.ggml.scores").unwrap();
    assert_eq!(scores.len(), tokens.len());
    let id = |t: &str| tokens.iter().position(|x| *x == t).unwrap();
    assert_eq!(types[id("<0x0A>")], 6);
    assert_eq!(types[id("<unk>")], 2);
    assert_eq!(
        meta.get_u64("tokenizer.ggml.unknown_token_id"),
        Some(id("<unk>") as u64)
    );
    assert_eq!(types[id("<s>")], 3);
    assert_eq!(
        meta.get_u64("tokenizer.ggml.bos_token_id"),
        Some(id("<s>") as u64)
    );
    // The first merge's token scores highest; a later merge's lower.
    let tj = tokenizer_json(&dir);
    let merge = |i: usize| {
        let pair = &tj["model"]["merges"][i];
        format!("{}{}", pair[0].as_str().unwrap(), pair[1].as_str().unwrap())
    };
    assert_eq!(scores[id(&merge(0))], 0.0);
    assert!(scores[id(&merge(1))] < scores[id(&merge(0))]);
    assert!(meta.get("tokenizer.ggml.merges").is_none());
    tokenizes_as_hugging_face(&file, &dir);
}

/// A pre-tokenizer llama.cpp has no name for: the checkpoint still runs in nucleus (through
/// tokenizer.json), but is not written to a GGUF file.
#[test]
fn an_unknown_pre_tokenizer_runs_but_is_not_written() {
    let s = Scratch::new("unknown");
    let dir = checkpoint(&s, "qwen2-f32", "qwen2-f32", |tj| {
        tj["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"\s+|\w+|[^\s\w]+"}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]});
    });
    let ckpt = Checkpoint::open(&dir).unwrap();
    let why = ckpt.llama_cpp_vocab_problem.clone().unwrap();
    assert!(
        why.contains("pre-tokenizer") && why.contains(r"\\s+|\\w+"),
        "{why}"
    );
    let err = ckpt.check_llama_cpp_vocab().unwrap_err().to_string();
    assert!(err.contains("llama.cpp could not tokenize it"), "{err}");
    assert!(ckpt.metadata.get("tokenizer.ggml.pre").is_none());
    let model = nucleus::model::Model::load(&dir, 1).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.metadata).unwrap();
    let hf = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let text = "hello, world 123";
    assert_eq!(
        tok.encode(text, false, false).unwrap(),
        hf.encode(text, false).unwrap().get_ids()
    );
}

/// A normalizer llama.cpp does not apply is named as the reason.
#[test]
fn a_normalizer_llama_cpp_lacks_is_named() {
    let s = Scratch::new("lowercase");
    let dir = checkpoint(&s, "qwen2-f32", "qwen2-f32", |tj| {
        tj["normalizer"] = json!({"type": "Lowercase"});
    });
    let why = Checkpoint::open(&dir)
        .unwrap()
        .llama_cpp_vocab_problem
        .unwrap();
    assert!(why.contains("Lowercase normalizer"), "{why}");
}

/// The naming is checked by behaviour: a SentencePiece-style tokenizer.json that also
/// lowercases (a normalizer step the naming does not look at) fails the check on the check
/// texts' capitals, and is not written.
#[test]
fn a_vocabulary_llama_cpp_would_tokenize_differently_fails_the_check() {
    let s = Scratch::new("spm-lowercase");
    let dir = checkpoint(&s, "llama-bf16", "spm-tokenizer", |tj| {
        tj["normalizer"]["normalizers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Lowercase"}));
    });
    let ckpt = Checkpoint::open(&dir).unwrap();
    let why = ckpt.llama_cpp_vocab_problem.clone().unwrap();
    assert!(
        why.contains("as llama.cpp reads it (llama default)"),
        "{why}"
    );
    assert!(ckpt.check_llama_cpp_vocab().is_err());
}

/// A Unigram tokenizer.json (the SentencePiece-style fixture's pieces, longer pieces scored
/// above single characters, byte fallback kept) is given the "llama" model with its own
/// scores, which llama.cpp merges highest first; Unigram segments by Viterbi instead, and here
/// the two part on a run of spaces, so the check refuses the vocabulary.
#[test]
fn a_unigram_vocabulary_segmented_otherwise_by_llama_cpp_is_refused() {
    let s = Scratch::new("unigram");
    let dir = checkpoint(&s, "llama-bf16", "spm-tokenizer", |tj| {
        let vocab = tj["model"]["vocab"].as_object().unwrap();
        let mut pieces: Vec<(String, f64)> = vocab
            .iter()
            .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
            .collect();
        pieces.sort_by(|a, b| a.1.total_cmp(&b.1));
        let n = pieces.len() as f64;
        let scored: Vec<Value> = pieces
            .iter()
            .map(|(piece, id)| {
                let long = piece.chars().count() > 1 && !piece.starts_with('<');
                json!([piece, if long { -id / n } else { -10.0 - id / n }])
            })
            .collect();
        tj["model"] =
            json!({"type": "Unigram", "unk_id": 0, "vocab": scored, "byte_fallback": true});
    });
    let ckpt = Checkpoint::open(&dir).unwrap();
    let why = ckpt.llama_cpp_vocab_problem.clone().unwrap();
    assert!(
        why.contains("as llama.cpp reads it (llama default)"),
        "{why}"
    );
    assert!(
        why.contains(r#""\n \n\n \t\t x \n   y    " becomes"#),
        "{why}"
    );
    assert!(ckpt.check_llama_cpp_vocab().is_err());
}
