//! Speculative decoding on the real models: greedy and seeded sampling give exactly the tokens
//! of plain decoding with both proposers (prompt lookup, a draft model), stop strings are not
//! overshot, rejected drafts leave no blocks behind, a draft model with another vocabulary is
//! refused, and a streamed context slides as it would without speculation.
//!
//! Run in release: `cargo test --release -p nucleus --test suite speculation::`.

use crate::common;

use nucleus::engine::speculate::draft::DraftProposer;
use nucleus::engine::speculate::ngram::NgramProposer;
use nucleus::engine::speculate::Speculator;
use nucleus::engine::{ContextPolicy, GenerateRequest, Generation, Session};
use nucleus::kv_cache::KvType;
use nucleus::model::Model;
use nucleus::sampling::SamplingParams;
use nucleus::tokenizer::Tokenizer;

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const GEMMA: &str = "gemma-3-270m-q4_k_m";

fn real(name: &str) -> Option<(Model, Tokenizer)> {
    let path = common::models_dir().join(format!("{name}.gguf"));
    if !common::require(&path, name) {
        return None;
    }
    let model = Model::load(&path, 0).expect("load model");
    let tok = Tokenizer::from_gguf(&model.file.metadata).expect("tokenizer");
    Some((model, tok))
}

/// A chat-formatted code edit: the answer repeats most of the prompt.
const EDIT: &str = "<|im_start|>user\nAdd type hints to this function and return the whole function:\n\n\
def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n        \
if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n            \
out.append(b[j])\n            j += 1\n    out.extend(a[i:])\n    out.extend(b[j:])\n    return out\n\
<|im_end|>\n<|im_start|>assistant\n";

const STORY: &str = "Once upon a time, in a village by the sea, there lived an old fisherman who";

/// Generates `req` from `text` without and with speculation: the two outputs, and the
/// session after the speculative one.
fn both<'m>(
    model: &'m Model,
    tok: &Tokenizer,
    text: &str,
    req: &GenerateRequest,
    spec: &mut Speculator,
) -> (Generation, Generation, Session<'m>) {
    let prompt = tok.encode(text, true, true).unwrap();
    let mut plain = Session::new(model, 1024);
    let a = plain.generate(tok, &prompt, req, |_| {}).unwrap();
    let mut s = Session::new(model, 1024);
    let b = s
        .generate_with(tok, &prompt, req, Some(spec), |_| {})
        .unwrap();
    (a, b, s)
}

fn greedy(n: usize) -> GenerateRequest {
    let mut req = GenerateRequest::greedy(n);
    req.ignore_eos = true;
    req
}

fn same_output_with_ngram(name: &str) {
    let Some((model, tok)) = real(name) else {
        return;
    };
    let mut spec = Speculator::new(Box::new(NgramProposer::default()), 16);
    for text in [EDIT, STORY] {
        let (a, b, s) = both(&model, &tok, text, &greedy(96), &mut spec);
        assert_eq!(a.tokens, b.tokens, "{name}, greedy: {text:?}");
        let stats = b.speculation.expect("speculation stats");
        eprintln!("{name}: {stats:?} on {:.30}", text);
        // Every block the rejected drafts took is back: the cache holds the sequence.
        assert_eq!(s.kv.used_blocks(), s.len().div_ceil(16), "{name}");
        assert_eq!(s.len(), b.prompt_tokens.len() + b.tokens.len() - 1);
    }
    // Seeded sampling with penalties: the same tokens, seed for seed.
    let mut req = greedy(64);
    req.sampling = SamplingParams {
        temperature: 0.8,
        repeat_penalty: 1.1,
        seed: Some(3),
        ..Default::default()
    };
    for seed in 0..3 {
        req.sampling.seed = Some(seed);
        let (a, b, _) = both(&model, &tok, EDIT, &req, &mut spec);
        assert_eq!(a.tokens, b.tokens, "{name}, sampling, seed {seed}");
    }
}

#[test]
fn same_output_with_ngram_qwen() {
    let _one = crate::common::one_at_a_time();
    same_output_with_ngram(QWEN);
}

#[test]
fn same_output_with_ngram_gemma() {
    let _one = crate::common::one_at_a_time();
    same_output_with_ngram(GEMMA);
}

#[test]
fn code_edits_accept_most_proposals() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = real(QWEN) else {
        return;
    };
    let mut spec = Speculator::new(Box::new(NgramProposer::default()), 16);
    // The answer (about 100 tokens, to its end) repeats the function.
    let (_, b, _) = both(&model, &tok, EDIT, &GenerateRequest::greedy(200), &mut spec);
    let s = b.speculation.unwrap();
    // (How much is proposed depends on measured timings; what is proposed is mostly right.)
    assert!(s.accepted * 3 > s.proposed * 2, "{s:?}");
    assert!(
        s.accepted * 3 > b.tokens.len(),
        "{s:?} for {} tokens",
        b.tokens.len()
    );
}

#[test]
fn stop_strings_are_not_overshot() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = real(QWEN) else {
        return;
    };
    let mut spec = Speculator::new(Box::new(NgramProposer::default()), 16);
    let mut req = greedy(160);
    req.stop = vec!["j += 1".into()];
    let (a, b, s) = both(&model, &tok, EDIT, &req, &mut spec);
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.text, b.text);
    assert_eq!(a.finish_reason, b.finish_reason);
    assert!(
        !b.text.contains("j += 1") && b.tokens.len() < 160,
        "{:?}",
        b.text
    );
    assert!(b.speculation.unwrap().accepted > 0);
    assert_eq!(
        s.len(),
        b.prompt_tokens.len() + b.tokens.len() - 1,
        "nothing fed past the stop"
    );
}

#[test]
fn a_draft_model_gives_the_same_output() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = real(QWEN) else {
        return;
    };
    // The same file as its own draft: the pair shows the mechanics (and an acceptance near
    // 1), not a speed-up.
    let draft = Model::load(common::models_dir().join(format!("{QWEN}.gguf")), 0).unwrap();
    let dtok = Tokenizer::from_gguf(&draft.file.metadata).unwrap();
    let proposer = DraftProposer::new(&draft, &dtok, &tok, 1024, KvType::F16).unwrap();
    let mut spec = Speculator::new(Box::new(proposer), 8);
    for text in [EDIT, STORY] {
        let (a, b, _) = both(&model, &tok, text, &greedy(64), &mut spec);
        assert_eq!(a.tokens, b.tokens, "{text:?}");
        let s = b.speculation.unwrap();
        assert!(s.accepted * 10 >= s.proposed * 9, "{s:?}");
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let _one = crate::common::one_at_a_time();
    let (Some((qwen, qtok)), Some((gemma, gtok))) = (real(QWEN), real(GEMMA)) else {
        return;
    };
    let err = DraftProposer::new(&gemma, &gtok, &qtok, 256, KvType::F16)
        .err()
        .expect("refused");
    assert!(err.contains("vocabular"), "{err}");
    drop(qwen);
}

#[test]
fn a_streamed_context_slides_as_without_speculation() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = real(GEMMA) else {
        return;
    };
    let prompt = tok.encode(EDIT, true, true).unwrap();
    let mut outs = Vec::new();
    for speculate in [false, true] {
        let mut s = Session::new(&model, 256);
        s.set_context_policy(ContextPolicy::Stream).unwrap();
        let mut spec = Speculator::new(Box::new(NgramProposer::default()), 16);
        let g = s
            .generate_with(
                &tok,
                &prompt,
                &greedy(300),
                speculate.then_some(&mut spec),
                |_| {},
            )
            .unwrap();
        assert!(s.evicted_tokens() > 0);
        outs.push(g.tokens);
    }
    assert_eq!(outs[0], outs[1]);
}
