//! The generation path on real models: seeded sampling, temperature 0 = greedy, beam search
//! through the paged KV cache, stop strings and finish reasons. Short generations, so that each
//! test takes a few seconds in release mode; they skip with a message when a model is absent.

use crate::common;

use nucleus::engine::{FinishReason, GenerateRequest, KvBeams, Session};
use nucleus::model::{Arithmetic, Model};
use nucleus::sampling::{beam_search, BeamParams, SamplingParams};
use nucleus::tokenizer::Tokenizer;
use serde_json::Value;

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const GEMMA: &str = "gemma-3-270m-q4_k_m";

fn load(name: &str) -> Option<(Model, Tokenizer)> {
    let path = common::golden_model_path(name);
    if !common::require(&path, "model") {
        return None;
    }
    let model = Model::load_with(&path, 2, Arithmetic::Exact).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.metadata).unwrap();
    Some((model, tok))
}

struct Golden {
    tokens: Vec<u32>,
    greedy: Vec<u32>,
    /// Top-2 margin of the reference at each greedy step.
    margins: Vec<f32>,
}

fn goldens(name: &str) -> Vec<Golden> {
    let path = common::shared_dir()
        .join("golden")
        .join(format!("{name}.jsonl"));
    if !common::require(&path, "golden file") {
        return Vec::new();
    }
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| {
            let case: Value = serde_json::from_str(line).unwrap();
            let n_prompt = case["prompt_logits"].as_array().unwrap().len();
            let steps: Vec<&Value> = case["prompt_logits"]
                .as_array()
                .unwrap()
                .iter()
                .chain(case["greedy_steps"].as_array().unwrap())
                .collect();
            let margins = steps[n_prompt - 1..]
                .iter()
                .map(|s| {
                    let top = s["top"].as_array().unwrap();
                    (top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap()) as f32
                })
                .collect();
            Golden {
                tokens: ids(&case["tokens"]),
                greedy: ids(&case["greedy_tokens"]),
                margins,
            }
        })
        .collect()
}

fn sampled(seed: u64, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            ..Default::default()
        },
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

#[test]
fn same_seed_same_output_different_seed_different_output() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = load(QWEN) else {
        return;
    };
    let prompt = tok
        .encode("Once upon a time, in a small town,", true, true)
        .unwrap();
    let run = |seed| {
        let mut s = Session::new(&model, 64);
        s.generate(&tok, &prompt, &sampled(seed, 20), |_| {})
            .unwrap()
    };
    let a = run(1);
    let b = run(1);
    let c = run(2);
    println!("seed 1: {:?}\nseed 2: {:?}", a.text, c.text);
    assert_eq!(a.tokens.len(), 20);
    assert_eq!(a.finish_reason, FinishReason::Length);
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.text, b.text);
    assert_ne!(a.tokens, c.tokens, "two seeds gave the same 20 tokens");
}

/// Temperature 0 through the whole `generate` path, with the default truncations still on,
/// gives llama.cpp's greedy tokens (up to the first near-tie of the reference).
#[test]
fn temperature_zero_is_golden_greedy() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = load(QWEN) else {
        return;
    };
    let golden = goldens(QWEN);
    let g = &golden[0];
    let n = 16.min(g.greedy.len());
    let req = GenerateRequest {
        sampling: SamplingParams {
            temperature: 0.0,
            seed: Some(3),
            logprobs: Some(2),
            ..Default::default()
        },
        max_tokens: n,
        ..Default::default()
    };
    let mut session = Session::new(&model, g.tokens.len() + n + 1);
    let mut streamed = String::new();
    let out = session
        .generate(&tok, &g.tokens, &req, |s| streamed.push_str(&s.text))
        .unwrap();
    assert_eq!(streamed, out.text);
    let lps = out.logprobs.as_ref().unwrap();
    assert_eq!(lps.len(), out.tokens.len());
    for (j, (&want, &margin)) in g.greedy[..n].iter().zip(&g.margins).enumerate() {
        match out.tokens.get(j) {
            Some(&t) if t == want => {
                // Greedy picks the most likely token of the raw distribution.
                assert_eq!(lps[j].top_logprobs[0].token, t);
                assert!(lps[j].logprob <= 0.0);
            }
            got => {
                assert!(
                    margin < 0.05,
                    "step {j}: ours {got:?}, llama.cpp {want} (margin {margin})"
                );
                break;
            }
        }
    }
}

fn greedy_n(model: &Model, tok: &Tokenizer, prompt: &[u32], n: usize) -> (Vec<u32>, f32) {
    let mut req = GenerateRequest::greedy(n);
    req.ignore_eos = true;
    req.sampling.logprobs = Some(0);
    let mut s = Session::new(model, prompt.len() + n + 1);
    let g = s.generate(tok, prompt, &req, |_| {}).unwrap();
    assert_eq!(g.tokens.len(), n);
    (g.tokens, g.sum_logprob.unwrap())
}

fn beams_n(model: &Model, tok: &Tokenizer, prompt: &[u32], width: usize, n: usize) -> f32 {
    let req = GenerateRequest {
        beams: width,
        length_penalty: 0.0,
        ignore_eos: true,
        ..GenerateRequest::greedy(n)
    };
    let n_ctx = prompt.len() + n + 1;
    let mut s =
        Session::with_kv_tokens(model, n_ctx, Session::kv_tokens_for_beams(n_ctx, width, n));
    let mut streamed = String::new();
    let g = s
        .generate(tok, prompt, &req, |st| streamed.push_str(&st.text))
        .unwrap();
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(g.tokens.len(), n);
    assert_eq!(streamed, g.text);
    assert_eq!(s.tokens().len(), prompt.len() + n - 1);
    g.sum_logprob.unwrap()
}

#[test]
fn one_beam_is_greedy() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = load(GEMMA) else {
        return;
    };
    let prompt = tok.encode("The capital of France is", true, true).unwrap();
    let (greedy, g_sum) = greedy_n(&model, &tok, &prompt, 16);
    // Width 1 straight through KvBeams (`generate` samples when beams = 1).
    let n_ctx = prompt.len() + 17;
    let mut s = Session::with_kv_tokens(&model, n_ctx, Session::kv_tokens_for_beams(n_ctx, 1, 16));
    let logits = s.feed(&prompt, 512, false).unwrap();
    let root = s.kv.fork_seq(s.seq).unwrap();
    let mut beams = KvBeams::new(s.model, &mut s.kv, &mut s.state);
    let params = BeamParams {
        width: 1,
        length_penalty: 0.0,
        max_new_tokens: 16,
        eos: Vec::new(),
        n_best: 1,
    };
    let best = beam_search(&mut beams, root as u32, &logits, &params).unwrap();
    assert_eq!(best[0].tokens, greedy);
    let b_sum = best[0].sum_logprob;
    assert!((b_sum - g_sum).abs() < 1e-3, "{b_sum} vs {g_sum}");
}

/// `beam_choices` returns `n` hypotheses best first; the first is what `generate` gives with the
/// same beams, and a stop string cuts a hypothesis's text without steering the search.
#[test]
fn beam_choices_are_the_n_best_hypotheses() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = load(GEMMA) else {
        return;
    };
    let prompt = tok.encode("The capital of France is", true, true).unwrap();
    let (width, n) = (4, 8);
    let req = GenerateRequest {
        beams: width,
        length_penalty: 0.0,
        ignore_eos: true,
        ..GenerateRequest::greedy(n)
    };
    let n_ctx = prompt.len() + n + 1;
    let session =
        || Session::with_kv_tokens(&model, n_ctx, Session::kv_tokens_for_beams(n_ctx, width, n));
    let best = session().generate(&tok, &prompt, &req, |_| {}).unwrap();
    let choices = session().beam_choices(&tok, &prompt, &req, 3).unwrap();
    assert_eq!(choices.len(), 3);
    assert_eq!(choices[0].tokens, best.tokens);
    assert_eq!(choices[0].text, best.text);
    assert_eq!(Some(choices[0].sum_logprob), best.sum_logprob);
    for w in choices.windows(2) {
        assert!(w[0].score >= w[1].score, "best first");
        assert_ne!(w[0].tokens, w[1].tokens);
    }
    for c in &choices {
        assert_eq!(c.tokens.len(), n);
        assert_eq!(c.finish_reason, FinishReason::Length);
        assert_eq!(c.text, tok.decode(&c.tokens, true));
    }
    // A stop string found in the best hypothesis's text cuts it there.
    let stop: String = choices[0].text.chars().skip(3).take(2).collect();
    let cut = GenerateRequest {
        stop: vec![stop.clone()],
        ..req.clone()
    };
    let stopped = session().beam_choices(&tok, &prompt, &cut, 1).unwrap();
    assert_eq!(stopped[0].finish_reason, FinishReason::Stop);
    let at = choices[0].text.find(&stop).unwrap();
    assert_eq!(stopped[0].text, choices[0].text[..at]);
    // Bad requests are errors, not panics.
    assert!(session().beam_choices(&tok, &prompt, &req, 5).is_err());
    assert!(session().beam_choices(&tok, &prompt, &req, 0).is_err());
    assert!(session().beam_choices(&tok, &[], &req, 1).is_err());
}

/// B = 4 finds a sequence at least as likely as greedy's (same length) on most prompts. Short
/// (8 tokens): each beam step computes B rows of the large output projection.
#[test]
fn four_beams_tie_or_beat_greedy() {
    let _one = crate::common::one_at_a_time();
    const N: usize = 8;
    let (mut wins, mut total) = (0, 0);
    for name in [QWEN, GEMMA] {
        let Some((model, tok)) = load(name) else {
            continue;
        };
        for g in goldens(name) {
            let (_, greedy) = greedy_n(&model, &tok, &g.tokens, N);
            let beam = beams_n(&model, &tok, &g.tokens, 4, N);
            let ok = beam >= greedy - 1e-3;
            println!(
                "{name}: greedy {greedy:.3}, 4 beams {beam:.3} {}",
                if ok { "ok" } else { "WORSE" }
            );
            wins += ok as usize;
            total += 1;
        }
    }
    println!("4 beams tie or beat greedy on {wins} of {total} prompts");
    assert!(total == 0 || 2 * wins > total, "{wins} of {total}");
}

/// Forked beams share the prompt's KV blocks: the peak block count of a search is about the
/// prompt's blocks plus a few per beam, far below B copies of the prompt.
#[test]
fn beams_share_prompt_blocks() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = load(GEMMA) else {
        return;
    };
    let text = "The history of the printing press begins in the fifteenth century. ".repeat(8);
    let prompt = tok.encode(&text, true, true).unwrap();
    let (width, max_new) = (4, 8);
    let n_ctx = prompt.len() + max_new + 1;
    let mut s = Session::with_kv_tokens(
        &model,
        n_ctx,
        Session::kv_tokens_for_beams(n_ctx, width, max_new),
    );
    let logits = s.feed(&prompt, 512, false).unwrap();
    let prompt_blocks = s.kv.used_blocks();
    let root = s.kv.fork_seq(s.seq).unwrap();
    let mut beams = KvBeams::new(s.model, &mut s.kv, &mut s.state);
    let params = BeamParams {
        width,
        length_penalty: 0.0,
        max_new_tokens: max_new,
        eos: Vec::new(),
        n_best: 1,
    };
    let best = beam_search(&mut beams, root as u32, &logits, &params).unwrap();
    let peak = beams.peak_used_blocks();
    let steps = beams.steps();
    println!(
        "prompt {} tokens = {prompt_blocks} blocks; peak with {width} beams: {peak} blocks",
        prompt.len()
    );
    assert_eq!(best[0].tokens.len(), max_new);
    assert_eq!(steps, max_new - 1, "one batched forward per step");
    // Each beam owns at most a copied partial block and the blocks of its new tokens.
    let per_beam = max_new.div_ceil(16) + 1;
    assert!(peak <= prompt_blocks + width * per_beam, "{peak} blocks");
    assert!(2 * peak < width * prompt_blocks, "{peak} blocks");
    // Every beam was released: only the session's own sequence remains.
    assert_eq!(s.kv.used_blocks(), prompt_blocks);
}

/// A stop string that straddles two tokens of the greedy continuation ends generation there,
/// and no part of it is ever streamed.
#[test]
fn stop_string_across_tokens_never_leaks() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = load(QWEN) else {
        return;
    };
    let prompt = tok.encode("def fibonacci(n):", false, true).unwrap();
    // The free continuation, piece by piece.
    let mut pieces = Vec::new();
    let mut s = Session::new(&model, 64);
    let mut req = GenerateRequest::greedy(24);
    req.ignore_eos = true;
    let free = s
        .generate(&tok, &prompt, &req, |st| pieces.push(st.text.clone()))
        .unwrap();
    // A boundary between two tokens whose pieces both have at least two characters.
    let i = (4..pieces.len() - 1)
        .find(|&i| pieces[i].chars().count() >= 2 && pieces[i + 1].chars().count() >= 2)
        .expect("a boundary between two multi-character pieces");
    let tail: String = {
        let c: Vec<char> = pieces[i].chars().collect();
        c[c.len() - 2..].iter().collect()
    };
    let head: String = pieces[i + 1].chars().take(2).collect();
    let stop = format!("{tail}{head}");
    let expected = &free.text[..free.text.find(&stop).unwrap()];
    println!("stop string {stop:?} across tokens {i} and {}", i + 1);

    req.stop = vec!["never matches".into(), stop.clone()];
    let mut s = Session::new(&model, 64);
    let mut streamed = String::new();
    let out = s
        .generate(&tok, &prompt, &req, |st| {
            streamed.push_str(&st.text);
            // Whatever has been streamed is final text: never a piece of the stop string.
            assert!(expected.starts_with(&streamed), "leaked: {streamed:?}");
        })
        .unwrap();
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(streamed, expected);
    assert_eq!(out.text, expected);
    assert!(out.tokens.len() <= i + 2);
    assert_eq!(out.tokens[..], free.tokens[..out.tokens.len()]);
}

#[test]
fn max_tokens_finishes_with_length() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = load(GEMMA) else {
        return;
    };
    let prompt = tok
        .encode("Write a long story about a dragon.", true, true)
        .unwrap();
    let mut s = Session::new(&model, 64);
    let mut n_events = 0;
    let out = s
        .generate(&tok, &prompt, &sampled(7, 5), |_| n_events += 1)
        .unwrap();
    assert_eq!(out.tokens.len(), 5);
    assert_eq!(n_events, 5);
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(out.text, tok.decode(&out.tokens, true));
    // The session holds the prompt and every generated token but the last.
    assert_eq!(s.tokens().len(), prompt.len() + 4);

    // The context window caps the length too.
    let mut s = Session::new(&model, prompt.len() + 2);
    let out = s.generate(&tok, &prompt, &sampled(7, 100), |_| {}).unwrap();
    assert_eq!(out.tokens.len(), 3);
    assert_eq!(out.finish_reason, FinishReason::Length);
}

/// The scheduler-facing API on its own: a `Sequence` fed synthetic logits (only the vocabulary
/// is loaded), one row at a time.
#[test]
fn sequence_drives_from_logits_alone() {
    let _one = crate::common::one_at_a_time();
    use nucleus::engine::Sequence;
    let path = common::golden_model_path(QWEN);
    if !common::require(&path, "model") {
        return;
    }
    let file = nucleus::gguf::GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file.metadata).unwrap();
    let n_vocab = tok.vocab_size();
    let one_hot = |t: u32| {
        let mut l = vec![0.0f32; n_vocab];
        l[t as usize] = 30.0;
        l
    };
    let ids = tok.encode("Hello world, STOP here", false, false).unwrap();
    let eos = tok.eog_tokens()[0];

    // Stop string split over tokens; logprobs and explain recorded per token.
    let mut req = GenerateRequest::greedy(50);
    req.stop = vec![" STOP".into()];
    req.explain = true;
    req.sampling.logprobs = Some(1);
    let mut seq = Sequence::new(&tok, &[1, 2], &req).unwrap();
    let mut streamed = String::new();
    let mut finish = None;
    for &t in &ids {
        let step = seq.step(&mut one_hot(t)).unwrap();
        assert_eq!(step.token, t);
        assert!(step.explain.is_some());
        assert!(step.logprob.as_ref().unwrap().logprob > -1e-3);
        streamed.push_str(&step.text);
        assert!(!streamed.contains('S'), "leaked {streamed:?}");
        if step.finish.is_some() {
            finish = step.finish;
            break;
        }
    }
    assert_eq!(finish, Some(FinishReason::Stop));
    assert_eq!(streamed, "Hello world,");
    assert_eq!(seq.text(), "Hello world,");
    assert_eq!(seq.matched_stop(), Some(" STOP"));
    assert_eq!(seq.prompt(), &[1, 2]);
    assert_eq!(seq.logprobs().len(), seq.tokens().len());

    // EOS ends the sequence, is not output, and releases held text; abort releases too.
    let mut req = GenerateRequest::greedy(50);
    req.stop = vec![" STOPPED".into()];
    let mut seq = Sequence::new(&tok, &[], &req).unwrap();
    let mut streamed = String::new();
    for &t in &ids {
        streamed.push_str(&seq.step(&mut one_hot(t)).unwrap().text);
    }
    assert_eq!(streamed, "Hello world, STOP here");
    let step = seq.step(&mut one_hot(eos)).unwrap();
    assert!(step.is_eos);
    assert_eq!(step.finish, Some(FinishReason::Stop));
    assert_eq!(seq.tokens(), &ids[..]);
    let mut seq = Sequence::new(&tok, &[], &req).unwrap();
    let stop_at = ids.len() - 1; // "Hello world, STOP" is held: could become " STOPPED"
    let mut streamed = String::new();
    for &t in &ids[..stop_at] {
        streamed.push_str(&seq.accept_token(t).text);
    }
    assert!(!streamed.ends_with("STOP"));
    streamed.push_str(&seq.abort(FinishReason::Length));
    assert_eq!(streamed, tok.decode(&ids[..stop_at], true));
    assert_eq!(seq.finish_reason(), Some(FinishReason::Length));
    assert_eq!(seq.step(&mut one_hot(5)).unwrap().text, "");
}

/// A prompt of 64+ tokens (llama.cpp's tiled attention for every one of its tokens) gives the
/// same logits at every position however it is chunked.
#[test]
fn long_prompt_logits_do_not_depend_on_chunking() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = load(QWEN) else {
        return;
    };
    let text = "fn main() { let v: Vec<u32> = (0..100).map(|i| i * i).collect(); ".repeat(5);
    let prompt = tok.encode(&text, false, true).unwrap();
    assert!(prompt.len() >= 70, "{} tokens", prompt.len());
    let logits = |chunk: usize| {
        let mut s = Session::new(&model, prompt.len() + 8);
        s.feed(&prompt, chunk, true).unwrap()
    };
    let whole = logits(512);
    for chunk in [1, 7, 64, 65] {
        assert!(logits(chunk) == whole, "chunks of {chunk}");
    }
}

/// nucleus's own arithmetic computes a token alike wherever it sits: a prompt fed in one batch
/// (tiled attention over the f16 cache, 8 queries to a tile), fed in chunks of every size, and
/// fed one token at a time as generated tokens (one query) give the same logits at every
/// position, to the bit, on both sides of llama.cpp's 64-token switch to tiled attention.
#[test]
fn own_arithmetic_gives_prompt_and_generated_tokens_the_same_bits() {
    let _one = crate::common::one_at_a_time();
    for name in [QWEN, GEMMA] {
        let path = common::golden_model_path(name);
        if !common::require(&path, "model") {
            return;
        }
        let model = Model::load_with(&path, 2, Arithmetic::Fast).unwrap();
        let tok = Tokenizer::from_gguf(&model.file.metadata).unwrap();
        let text = "def area(r: float) -> float:\n    return 3.14159 * r * r\n".repeat(6);
        let prompt = tok.encode(&text, true, true).unwrap();
        assert!(prompt.len() >= 70, "{} tokens", prompt.len());
        for len in [40, prompt.len()] {
            let prompt = &prompt[..len];
            let fed = |chunk: usize| {
                let mut s = Session::new(&model, len + 8);
                s.feed(prompt, chunk, true).unwrap()
            };
            let whole = fed(512);
            for chunk in [1, 5, 64] {
                assert!(
                    fed(chunk) == whole,
                    "{name}, {len} tokens, chunks of {chunk}"
                );
            }
            let mut s = Session::new(&model, len + 8);
            let mut generated = s.feed(&prompt[..1], 1, true).unwrap();
            for &t in &prompt[1..] {
                generated.extend_from_slice(s.feed_generated(&[t]).unwrap());
            }
            assert!(
                generated == whole,
                "{name}, {len} tokens: one at a time differs from one batch"
            );
            // And several generated tokens at once, as a verification computes them.
            let mut s = Session::new(&model, len + 8);
            let mut verified = s.feed(&prompt[..1], 1, true).unwrap();
            for part in prompt[1..].chunks(9) {
                verified.extend_from_slice(s.feed_generated(part).unwrap());
            }
            assert!(
                verified == whole,
                "{name}, {len} tokens: verification rows differ"
            );
        }
    }
}
