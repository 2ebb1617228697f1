//! Unit tests on a small synthetic SentencePiece-style vocabulary.

use super::*;
use crate::gguf::{MetaType, MetaValue, Metadata};

fn strings(v: &[String]) -> MetaValue {
    MetaValue::Array(
        MetaType::String,
        v.iter().map(|s| MetaValue::String(s.clone())).collect(),
    )
}

/// `<unk> <s> </s>`, the 256 byte tokens, a few pieces, and some special tokens.
fn spm_meta(model: &str) -> Metadata {
    spm_meta_with(model, &[])
}

/// [`spm_meta`] with `extra` normal tokens at the end.
fn spm_meta_with(model: &str, extra: &[&str]) -> Metadata {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types: Vec<i64> = vec![2, 3, 3];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let normal = ["▁", "a", "b", "▁a", "ab", "▁ab", "h", "i", "hi", "▁hi", "é"];
    for t in normal {
        tokens.push(t.into());
        types.push(1);
    }
    let special = [
        ("<start_of_turn>", 3),
        ("<end_of_turn>", 3),
        ("<|im_start|>", 3),
        ("<tool>", 4),
    ];
    for (t, ty) in special {
        tokens.push(t.into());
        types.push(ty);
    }
    for t in extra {
        tokens.push(t.to_string());
        types.push(1);
    }
    // Longer pieces score higher, so they win.
    let scores: Vec<MetaValue> = tokens
        .iter()
        .map(|t| MetaValue::F32(t.chars().count() as f32))
        .collect();
    let mut m = Metadata::default();
    m.insert(
        "tokenizer.ggml.model".into(),
        MetaValue::String(model.into()),
    );
    m.insert("tokenizer.ggml.tokens".into(), strings(&tokens));
    m.insert(
        "tokenizer.ggml.scores".into(),
        MetaValue::Array(MetaType::F32, scores),
    );
    m.insert(
        "tokenizer.ggml.token_type".into(),
        MetaValue::Array(
            MetaType::I32,
            types
                .into_iter()
                .map(|t| MetaValue::I32(t as i32))
                .collect(),
        ),
    );
    m.insert("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(1));
    m.insert("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(2));
    m.insert(
        "tokenizer.chat_template".into(),
        MetaValue::String("{{ messages }}".into()),
    );
    m
}

fn spm() -> Tokenizer {
    Tokenizer::from_gguf(&spm_meta("llama")).unwrap()
}

fn id(t: &Tokenizer, s: &str) -> TokenId {
    t.token_id(s).unwrap_or_else(|| panic!("no token {s:?}"))
}

fn byte(t: &Tokenizer, b: u8) -> TokenId {
    id(t, &format!("<0x{b:02X}>"))
}

#[test]
fn spm_merges_by_score_with_space_prefix() {
    let t = spm();
    assert_eq!(t.encode("ab", false, false).unwrap(), vec![id(&t, "▁ab")]);
    assert_eq!(
        t.encode("ab hi", true, false).unwrap(),
        vec![1, id(&t, "▁ab"), id(&t, "▁hi")]
    );
    assert_eq!(t.encode("", true, false).unwrap(), vec![1]);
    assert_eq!(t.encode("", false, false).unwrap(), Vec::<TokenId>::new());
    assert_eq!(
        t.decode(&t.encode("ab hi", false, false).unwrap(), false),
        " ab hi"
    );
}

#[test]
fn spm_byte_fallback() {
    let t = spm();
    // "😀" is not in the vocabulary: its four bytes.
    let ids = t.encode("😀", false, false).unwrap();
    assert_eq!(
        ids,
        vec![
            id(&t, "▁"),
            byte(&t, 0xF0),
            byte(&t, 0x9F),
            byte(&t, 0x98),
            byte(&t, 0x80)
        ]
    );
    assert_eq!(t.decode(&ids, true), " 😀");
    assert_eq!(t.token_bytes(byte(&t, 0xF0)), &[0xF0]);
    assert_eq!(t.token_bytes(id(&t, "▁ab")), b" ab");
}

#[test]
fn special_tokens_parsed_only_when_asked() {
    let t = spm();
    let sot = id(&t, "<start_of_turn>");
    let with = t.encode("<start_of_turn>ab", false, true).unwrap();
    assert_eq!(with, vec![sot, id(&t, "▁ab")]);
    let without = t.encode("<start_of_turn>ab", false, false).unwrap();
    assert!(!without.contains(&sot));
    assert_eq!(t.decode(&without, false), " <start_of_turn>ab");
    // User-defined tokens are always matched, as llama.cpp does.
    let tool = id(&t, "<tool>");
    assert_eq!(
        t.encode("ab<tool>hi", false, false).unwrap(),
        vec![id(&t, "▁ab"), tool, id(&t, "▁hi")]
    );
    // Decoding: control tokens are shown unless skipped; user-defined ones always.
    assert_eq!(
        t.decode(&[sot, id(&t, "a"), tool], false),
        "<start_of_turn>a<tool>"
    );
    assert_eq!(t.decode(&[sot, id(&t, "a"), tool], true), "a<tool>");
}

#[test]
fn special_ids_and_eog() {
    let t = spm();
    assert_eq!(t.bos(), Some(1));
    assert_eq!(t.eos(), Some(2));
    assert_eq!(t.vocab_size(), 3 + 256 + 11 + 4);
    assert!(t.is_eog(2));
    assert!(t.is_eog(id(&t, "<end_of_turn>")));
    assert!(!t.is_eog(id(&t, "<start_of_turn>")));
    assert!(!t.is_eog(1));
    assert_eq!(t.token_text(id(&t, "▁a")), Some("▁a"));
    assert_eq!(t.chat_template(), Some("{{ messages }}"));
    assert_eq!(t.kind(), VocabKind::Spm);
}

#[test]
fn fim_tokens_from_keys_else_by_text_as_llama_cpp() {
    let fim = [
        "<PRE>",
        "<SUF>",
        "<MID>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ];
    // No keys: found by text, made control tokens; pad, repo and file separator end generation.
    let t = Tokenizer::from_gguf(&spm_meta_with("llama", &fim)).unwrap();
    let f = t.fim();
    let ids: Vec<TokenId> = fim.iter().map(|s| id(&t, s)).collect();
    assert_eq!(
        [f.pre, f.suf, f.mid, f.pad, f.rep, f.sep],
        ids.iter().map(|&i| Some(i)).collect::<Vec<_>>()[..]
    );
    assert_eq!(
        t.encode("a<PRE>", false, true).unwrap().last(),
        Some(&ids[0])
    );
    for (i, &tid) in ids.iter().enumerate() {
        assert_eq!(t.is_eog(tid), i >= 3, "{}", fim[i]);
    }
    // Keys win over texts (the deprecated `prefix_token_id` too); an id outside the vocabulary
    // is ignored; a FIM pad given by key ends generation, the `<|fim_pad|>` text then does not.
    let mut m = spm_meta_with("llama", &fim);
    let (a, b) = (id(&t, "a"), id(&t, "b"));
    m.insert("tokenizer.ggml.prefix_token_id".into(), MetaValue::U32(a));
    m.insert("tokenizer.ggml.fim_pad_token_id".into(), MetaValue::U32(b));
    m.insert(
        "tokenizer.ggml.fim_mid_token_id".into(),
        MetaValue::U32(1 << 20),
    );
    let t = Tokenizer::from_gguf(&m).unwrap();
    let f = t.fim();
    assert_eq!((f.pre, f.pad, f.mid), (Some(a), Some(b), Some(ids[2])));
    assert!(t.is_eog(b));
    assert!(!t.is_eog(ids[3]));
    // None at all.
    assert_eq!(spm().fim(), FimTokens::default());
}

#[test]
fn unknown_model_and_pre_are_clear_errors() {
    let e = Tokenizer::from_gguf(&spm_meta("t5")).unwrap_err();
    assert!(
        matches!(e, TokenizerError::UnknownModel(ref m) if m == "t5"),
        "{e}"
    );
    let mut m = spm_meta("gpt2");
    m.insert(
        "tokenizer.ggml.pre".into(),
        MetaValue::String("no-such-pre".into()),
    );
    m.insert("tokenizer.ggml.merges".into(), strings(&[]));
    let e = Tokenizer::from_gguf(&m).unwrap_err();
    assert!(
        matches!(e, TokenizerError::UnknownPre(ref p) if p == "no-such-pre"),
        "{e}"
    );
    assert!(e.to_string().contains("no-such-pre"));
    let e = Tokenizer::from_gguf(&Metadata::default()).unwrap_err();
    assert!(matches!(e, TokenizerError::MissingKey(_)), "{e}");
}

#[test]
fn stream_holds_split_multibyte_characters() {
    let t = spm();
    let mut s = StreamDecoder::new(&t, true);
    // "é" as two byte tokens.
    assert_eq!(s.push(byte(&t, 0xC3)), "");
    assert_eq!(s.pending_bytes(), &[0xC3]);
    assert_eq!(s.push(byte(&t, 0xA9)), "é");
    // An emoji across four byte tokens, after a normal token.
    assert_eq!(s.push(id(&t, "▁hi")), " hi");
    assert_eq!(s.push(byte(&t, 0xF0)), "");
    assert_eq!(s.push(byte(&t, 0x9F)), "");
    assert_eq!(s.push(byte(&t, 0x98)), "");
    assert_eq!(s.push(byte(&t, 0x80)), "😀");
    assert_eq!(s.finish(), "");
}

#[test]
fn stream_replaces_invalid_sequences_only_when_final() {
    let t = spm();
    let mut s = StreamDecoder::new(&t, true);
    // 0xFF can never start a character.
    assert_eq!(s.push(byte(&t, 0xFF)), "\u{FFFD}");
    // A lead byte followed by ASCII: the lead byte is invalid once the ASCII arrives.
    assert_eq!(s.push(byte(&t, 0xE2)), "");
    assert_eq!(s.push(id(&t, "a")), "\u{FFFD}a");
    // An incomplete character at the end is flushed as U+FFFD.
    assert_eq!(s.push(byte(&t, 0xF0)), "");
    assert_eq!(s.push(byte(&t, 0x9F)), "");
    assert_eq!(s.finish(), "\u{FFFD}");
    assert_eq!(s.finish(), "");
}

#[test]
fn stream_equals_decode() {
    let t = spm();
    let ids = [
        id(&t, "<start_of_turn>"),
        byte(&t, 0xF0),
        byte(&t, 0x9F),
        id(&t, "▁a"),
        byte(&t, 0xC3),
        byte(&t, 0xA9),
        byte(&t, 0xE2),
        byte(&t, 0x82),
    ];
    for skip in [false, true] {
        let mut s = StreamDecoder::new(&t, skip);
        let mut streamed: String = ids.iter().map(|&i| s.push(i)).collect();
        streamed.push_str(&s.finish());
        assert_eq!(streamed, t.decode(&ids, skip));
    }
}

#[test]
fn tokenizer_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
}
