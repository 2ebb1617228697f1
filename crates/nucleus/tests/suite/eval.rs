//! Perplexity and KL divergence on a real model (small windows, a slice of the corpus): the
//! figures are finite and sane, a text shorter than two windows is refused, and a run compared
//! with its own saved base has KL 0 and full top-1 agreement.
//!
//! Run in release: `cargo test --release -p nucleus --test suite eval::`.

use crate::common;

use nucleus::eval::kl::{Base, BaseHeader, BaseWriter, KlStats};
use nucleus::eval::{evaluate, Mode};
use nucleus::kv_cache::KvType;
use nucleus::model::{Arithmetic, Model};
use nucleus::tokenizer::Tokenizer;

#[test]
fn perplexity_and_kl_against_a_saved_base() {
    let _one = crate::common::one_at_a_time();
    let path = common::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    let corpus = common::shared_dir().join("corpus/gpl-3.txt");
    if !common::require(&path, "gemma-3-270m") || !common::require(&corpus, "the corpus") {
        return;
    }
    let model = Model::load(&path, 0).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.metadata).unwrap();
    let text = std::fs::read_to_string(corpus).unwrap();
    let tokens = tok.encode(&text, true, false).unwrap()[..640].to_vec();
    let n_ctx = 128;
    let bos = tok.bos().filter(|_| tok.add_bos());
    // Too short for two windows: refused before any work.
    assert!(evaluate(
        &model,
        &tokens[..200],
        n_ctx,
        Mode::Windows,
        KvType::F16,
        bos,
        |_| {},
        |_, _, _| {}
    )
    .is_err());

    let dir = std::env::temp_dir().join(format!("nucleus-eval-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base_path = dir.join("base.kld");
    let header = BaseHeader {
        n_vocab: model.hp.n_vocab,
        n_ctx,
        k: 32,
        mode: Mode::Windows,
        tokens: tokens.clone(),
    };
    let mut w = BaseWriter::create(&base_path, &header).unwrap();
    let stats = evaluate(
        &model,
        &tokens,
        n_ctx,
        Mode::Windows,
        KvType::F16,
        bos,
        |s| w.push(s).unwrap(),
        |_, _, _| {},
    )
    .unwrap();
    w.finish().unwrap();
    // 5 windows, positions 64..126 of each predict the next token.
    assert_eq!(stats.count, 5 * 63);
    let ppl = stats.ppl();
    assert!(ppl.is_finite() && ppl > 2.0 && ppl < 200.0, "PPL {ppl}");

    let base = Base::load(&base_path).unwrap();
    assert_eq!(base.header, header);
    let compare = |mode: Mode| {
        let mut kl = KlStats::default();
        let mut i = 0;
        evaluate(
            &model,
            &tokens,
            n_ctx,
            mode,
            KvType::F16,
            bos,
            |s| {
                let p = &base.positions[i];
                assert_eq!(p.target_index, s.target_index);
                kl.push(p, s);
                i += 1;
            },
            |_, _, _| {},
        )
        .unwrap();
        kl
    };
    let same = compare(Mode::Windows);
    assert_eq!(same.mean_kl(), 0.0, "the arithmetic is deterministic");
    assert_eq!(same.top1_agreement(), 1.0);
    // The base keeps each NLL as f32.
    assert!((same.new_nll.ppl() / same.base_nll.ppl() - 1.0).abs() < 1e-6);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The NLL perplexity scores is llama.cpp's log-softmax: on every golden prompt, −NLL of the
/// next token equals the golden logit of that token minus the golden log-sum-exp (where the
/// token is among the golden top 8), to the files' six decimals.
#[test]
fn nll_matches_llama_cpp_log_softmax_on_the_golden_prompts() {
    let _one = crate::common::one_at_a_time();
    use nucleus::engine::Session;
    use nucleus::eval::perplexity::nll_of;
    use nucleus::tokenizer::TokenId;
    for name in ["qwen2.5-coder-0.5b-instruct-q4_k_m", "gemma-3-270m-q4_k_m"] {
        let golden = common::shared_dir().join(format!("golden/{name}.jsonl"));
        let path = common::golden_model_path(name);
        if !common::require(&golden, "golden file") || !common::require(&path, name) {
            return;
        }
        let model = Model::load_with(&path, 0, Arithmetic::Exact).unwrap();
        let (mut compared, mut worst) = (0, 0f64);
        for line in std::fs::read_to_string(&golden).unwrap().lines() {
            let case: serde_json::Value = serde_json::from_str(line).unwrap();
            let tokens: Vec<TokenId> = case["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as TokenId)
                .collect();
            let mut s = Session::new(&model, tokens.len());
            let logits = s.feed(&tokens, tokens.len(), true).unwrap();
            let n_vocab = model.hp.n_vocab;
            for i in 0..tokens.len() - 1 {
                let step = &case["prompt_logits"][i];
                let lse = step["logsumexp"].as_f64().unwrap();
                let target = tokens[i + 1] as u64;
                let Some(g) = step["top"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p[0].as_u64() == Some(target))
                else {
                    continue;
                };
                let golden_nll = lse - g[1].as_f64().unwrap();
                let ours = nll_of(&logits[i * n_vocab..(i + 1) * n_vocab], tokens[i + 1]);
                worst = worst.max((ours - golden_nll).abs());
                compared += 1;
            }
        }
        eprintln!("{name}: {compared} next-token NLLs compared, worst difference {worst:.2e}");
        assert!(compared >= 10, "{name}: only {compared} positions compared");
        assert!(worst < 5e-6, "{name}: worst NLL difference {worst}");
    }
}
