//! Tokenizer exactness against llama.cpp: its tokenizer test vectors
//! (`shared/tokenizer-vectors`) and the golden prompts (`shared/golden/*.jsonl`).
//!
//! Files that are absent make the test print "skipped: … absent" and pass.

use std::path::{Path, PathBuf};
use std::time::Instant;

use nucleus::gguf::GgufFile;
use nucleus::tokenizer::{StreamDecoder, TokenId, Tokenizer, VocabKind};

fn shared() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared"))
}

fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("NUCLEUS_MODELS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/nucleus/models")
}

fn load(path: &Path) -> Option<Tokenizer> {
    if !path.exists() {
        println!("skipped: {} absent", path.display());
        return None;
    }
    let t0 = Instant::now();
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let t1 = Instant::now();
    let tok =
        Tokenizer::from_gguf(&file.metadata).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let t2 = Instant::now();
    println!(
        "{}: {} tokens; gguf open {:.1} ms, Tokenizer::from_gguf {:.1} ms",
        path.file_name().unwrap().to_string_lossy(),
        tok.vocab_size(),
        (t1 - t0).as_secs_f64() * 1e3,
        (t2 - t1).as_secs_f64() * 1e3
    );
    Some(tok)
}

/// What decoding `text`'s tokens gives back (pieces concatenated): the text itself, with one
/// leading space for SPM vocabularies that add a space prefix. `None` where that is not the
/// case: an SPM text containing a user-defined token (a space prefix follows it, and phi-3 strips
/// whitespace after it).
fn expected_round_trip(tok: &Tokenizer, user_defined: &[&str], text: &str) -> Option<String> {
    if tok.kind() == VocabKind::Spm && user_defined.iter().any(|u| text.contains(u)) {
        return None;
    }
    if tok.kind() == VocabKind::Spm && tok.add_space_prefix() && !text.is_empty() {
        Some(format!(" {text}"))
    } else {
        Some(text.to_string())
    }
}

/// One vocabulary's `.inp`/`.out` cases; returns (passed, total).
fn run_vectors(name: &str, tok: &Tokenizer, inp: &str, out: &str) -> (usize, usize) {
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(
        texts.pop(),
        Some(""),
        "{name}: .inp must end with the separator"
    );
    let expected: Vec<&str> = out.lines().collect();
    assert_eq!(
        texts.len(),
        expected.len(),
        "{name}: .inp/.out case counts differ"
    );
    let mut passed = 0;
    let mut round_trip_checked = 0;
    let user_defined: Vec<&str> = (0..tok.vocab_size() as TokenId)
        .filter(|&id| tok.is_user_defined(id))
        .filter_map(|id| tok.token_text(id))
        .collect();
    for (text, exp) in texts.iter().zip(&expected) {
        let want: Vec<TokenId> = exp
            .split_whitespace()
            .map(|s| s.parse().expect("token id"))
            .collect();
        let got = tok.encode(text, false, false).expect("encode");
        if got == want {
            passed += 1;
        } else {
            println!("  {name}: MISMATCH for {text:?}\n    want {want:?}\n    got  {got:?}");
        }
        if let Some(rt) = expected_round_trip(tok, &user_defined, text) {
            let decoded = tok.decode(&got, false);
            assert_eq!(decoded, rt, "{name}: round trip of {text:?}");
            let mut stream = StreamDecoder::new(tok, false);
            let mut streamed: String = got.iter().map(|&id| stream.push(id)).collect();
            streamed.push_str(&stream.finish());
            assert_eq!(streamed, decoded, "{name}: streaming decode of {text:?}");
            round_trip_checked += 1;
        }
    }
    println!(
        "{name}: {passed}/{} cases pass ({round_trip_checked} round trips checked)",
        texts.len()
    );
    (passed, texts.len())
}

#[test]
fn llama_cpp_tokenizer_vectors() {
    let dir = shared().join("tokenizer-vectors");
    if !dir.exists() {
        println!("skipped: {} absent", dir.display());
        return;
    }
    let vocabs = [
        "deepseek-coder",
        "deepseek-llm",
        "falcon",
        "gpt-2",
        "llama-spm",
        "mpt",
        "phi-3",
        "qwen2",
    ];
    let mut failed = Vec::new();
    for name in vocabs {
        let base = dir.join(format!("ggml-vocab-{name}.gguf"));
        let model = if name == "qwen2" {
            models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
        } else {
            base.clone()
        };
        let inp_path = base.with_extension("gguf.inp");
        let out_path = base.with_extension("gguf.out");
        if !inp_path.exists() || !out_path.exists() {
            println!("skipped: {} absent", inp_path.display());
            continue;
        }
        let Some(tok) = load(&model) else { continue };
        let inp = std::fs::read_to_string(&inp_path).unwrap();
        let out = std::fs::read_to_string(&out_path).unwrap();
        let (passed, total) = run_vectors(name, &tok, &inp, &out);
        if passed != total {
            failed.push(format!("{name}: {passed}/{total}"));
        }
    }
    assert!(
        failed.is_empty(),
        "vocabularies with failing cases: {failed:?}"
    );
}

/// llama.cpp's own test vectors for vocabularies `../shared` lacks, from the vendored source
/// (`scripts/build_llama_cpp.sh` unpacks it under `.bench/`; `LLAMA_CPP_SRC` overrides): the
/// full Llama 3 vocabulary (128,256 tokens, `llama-bpe`), which the tiny architecture fixtures
/// only cut. Not in CI (no vendored source there): run it by hand with `--ignored`.
#[test]
#[ignore = "needs llama.cpp's vendored source"]
fn vendored_llama_cpp_vectors() {
    let src = std::env::var_os("LLAMA_CPP_SRC").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../.bench/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp")
        },
        PathBuf::from,
    );
    let base = src.join("models/ggml-vocab-llama-bpe.gguf");
    let tok = load(&base).unwrap_or_else(|| panic!("{} is absent", base.display()));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    let (passed, total) = run_vectors("llama-bpe", &tok, &inp, &out);
    assert_eq!(passed, total);
}

#[derive(serde::Deserialize)]
struct Golden {
    prompt: String,
    add_special: bool,
    tokens: Vec<TokenId>,
    #[serde(default)]
    greedy_tokens: Option<Vec<TokenId>>,
    #[serde(default)]
    greedy_text: Option<String>,
}

#[test]
fn golden_prompts() {
    let dir = shared().join("golden");
    if !dir.exists() {
        println!("skipped: {} absent", dir.display());
        return;
    }
    let mut jsonls: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    jsonls.sort();
    let mut failures = Vec::new();
    for jsonl in jsonls {
        let stem = jsonl.file_stem().unwrap().to_string_lossy().to_string();
        let beside = dir.join(format!("{stem}.gguf"));
        let model = if beside.exists() {
            beside
        } else {
            models_dir().join(format!("{stem}.gguf"))
        };
        let Some(tok) = load(&model) else { continue };
        let (mut ok, mut n) = (0, 0);
        for line in std::fs::read_to_string(&jsonl).unwrap().lines() {
            if line.trim().is_empty() {
                continue;
            }
            let g: Golden = serde_json::from_str(line).expect("golden line");
            n += 1;
            let got = tok.encode(&g.prompt, g.add_special, true).expect("encode");
            let mut good = got == g.tokens;
            if !good {
                println!(
                    "  {stem}: MISMATCH for {:?}\n    want {:?}\n    got  {got:?}",
                    g.prompt, g.tokens
                );
            }
            if let (Some(ids), Some(text)) = (&g.greedy_tokens, &g.greedy_text) {
                let decoded = tok.decode(ids, true);
                if &decoded != text {
                    println!(
                        "  {stem}: greedy_text differs\n    want {text:?}\n    got  {decoded:?}"
                    );
                    good = false;
                }
                let mut stream = StreamDecoder::new(&tok, true);
                let mut streamed: String = ids.iter().map(|&id| stream.push(id)).collect();
                streamed.push_str(&stream.finish());
                assert_eq!(streamed, decoded, "{stem}: streaming decode");
            }
            if good {
                ok += 1;
            } else {
                failures.push(format!("{stem}: {:?}", g.prompt));
            }
        }
        println!("{stem}: {ok}/{n} golden prompts match");
    }
    assert!(failures.is_empty(), "golden mismatches: {failures:?}");
}

#[test]
fn model_vocab_facts() {
    let models = models_dir();
    if let Some(q) = load(&models.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")) {
        let im_start = q.token_id("<|im_start|>").unwrap();
        let im_end = q.token_id("<|im_end|>").unwrap();
        let eot = q.token_id("<|endoftext|>").unwrap();
        assert!(q.is_eog(im_end) && q.is_eog(eot) && !q.is_eog(im_start));
        assert!(!q.add_bos());
        assert!(q.chat_template().is_some());
        assert_eq!(
            q.encode("<|im_start|>user", false, true).unwrap()[0],
            im_start
        );
        assert!(!q
            .encode("<|im_start|>user", false, false)
            .unwrap()
            .contains(&im_start));
        assert_eq!(q.decode(&[im_start], false), "<|im_start|>");
        assert_eq!(q.decode(&[im_start], true), "");
    }
    if let Some(g) = load(&models.join("gemma-3-270m-q4_k_m.gguf")) {
        let eot = g.token_id("<end_of_turn>").unwrap();
        let sot = g.token_id("<start_of_turn>").unwrap();
        assert!(g.is_eog(eot) && g.is_eog(g.eos().unwrap()) && !g.is_eog(sot));
        assert_eq!(g.bos(), Some(2));
        assert!(!g.add_space_prefix());
        let ids = g.encode("<start_of_turn>user\nHi", true, true).unwrap();
        assert_eq!(&ids[..2], &[2, sot]);
        assert_eq!(g.decode(&ids, false), "<bos><start_of_turn>user\nHi");
        assert_eq!(g.decode(&ids, true), "user\nHi");
    }
}
