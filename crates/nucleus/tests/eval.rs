//! Perplexity and KL divergence on a real model (small windows, a slice of the corpus): the
//! figures are finite and sane, a text shorter than two windows is refused, and a run compared
//! with its own saved base has KL 0 and full top-1 agreement.
//!
//! Run in release: `cargo test --release -p nucleus --test eval`.

mod common;

use nucleus::eval::kl::{Base, BaseHeader, BaseWriter, KlStats};
use nucleus::eval::{evaluate, Mode};
use nucleus::kv_cache::KvType;
use nucleus::model::Model;
use nucleus::tokenizer::Tokenizer;

#[test]
fn perplexity_and_kl_against_a_saved_base() {
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
