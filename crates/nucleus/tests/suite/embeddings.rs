//! `Model::embed`: mean-pooled final hidden states, L2-normalized. On the tiny random model
//! (the arithmetic) and on qwen2.5 (that similar sentences come out closer than unrelated ones).

use crate::common;

use nucleus::model::{Model, EMBED_CHUNK};
use nucleus::tokenizer::Tokenizer;

fn load(name: &str) -> Option<(Model, Tokenizer)> {
    let path = common::golden_model_path(name);
    if !common::require(&path, "model") {
        return None;
    }
    let model = Model::load(&path, 2).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.metadata).unwrap();
    Some((model, tok))
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn embedding_is_the_normalized_mean_of_the_hidden_states() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = load("tiny-llama-random") else {
        return;
    };
    let ids = tok
        .encode("The quick brown fox jumps over", true, false)
        .unwrap();
    let n = ids.len();
    let e = model.hp.n_embd;

    // The hidden states of an ordinary forward that wants every row's logits.
    let st = common::prompt_forward(&model, &ids);
    assert_eq!(st.logits().len(), n * model.hp.n_vocab);
    let hidden = st.hidden()[..n * e].to_vec();
    let mut mean = vec![0f64; e];
    for row in hidden.chunks_exact(e) {
        for (m, &x) in mean.iter_mut().zip(row) {
            *m += f64::from(x) / n as f64;
        }
    }
    let norm = mean.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!(norm > 0.0);

    let v = model.embed(&ids, EMBED_CHUNK).unwrap();
    assert_eq!(v.len(), e);
    let len = dot(&v, &v).sqrt();
    assert!((len - 1.0).abs() < 1e-5, "not unit length: {len}");
    for (i, (&got, &m)) in v.iter().zip(&mean).enumerate() {
        let want = (m / norm) as f32;
        assert!((got - want).abs() < 1e-5, "dim {i}: {got} vs {want}");
    }
    // Chunking does not change it (each token keeps the arithmetic of its place).
    let chunked = model.embed(&ids, 2).unwrap();
    assert!(dot(&v, &chunked) > 0.99999, "{}", dot(&v, &chunked));
    // Another text gives another vector.
    let other = tok
        .encode("Lorem ipsum dolor sit amet", true, false)
        .unwrap();
    assert!(dot(&v, &model.embed(&other, EMBED_CHUNK).unwrap()) < 0.9999);
    assert!(model.embed(&[], EMBED_CHUNK).is_err());
}

#[test]
fn similar_sentences_are_closer_on_qwen() {
    let _one = crate::common::one_at_a_time();
    let Some((model, tok)) = load("qwen2.5-coder-0.5b-instruct-q4_k_m") else {
        return;
    };
    let emb = |s: &str| {
        let ids = tok.encode(s, true, false).unwrap();
        model.embed(&ids, EMBED_CHUNK).unwrap()
    };
    let a = emb("The cat sat on the mat.");
    let b = emb("A cat was sitting on the mat.");
    let c = emb("Quarterly tax revenue rose by four percent.");
    let (ab, ac) = (dot(&a, &b), dot(&a, &c));
    assert!(ab > ac, "cos(a, b) = {ab} should exceed cos(a, c) = {ac}");
}
