//! Mixture-of-experts models keep batch invariance: a token's logits are the same bits whether
//! it runs alone or in a batch with tokens that share its experts or not, and however its
//! prompt is chunked, in both arithmetics (the experts' products are grouped by expert, and
//! every row is computed alone). On the MoE fixtures of `tests/data/arch/`.

use std::path::Path;

use nucleus::engine::Session;
use nucleus::kv_cache::{KvCache, SeqId};
use nucleus::model::{Arithmetic, Batch, ForwardState, Model};
use nucleus::tokenizer::{TokenId, Tokenizer};

const FIXTURES: [&str; 5] = ["qwen3moe", "qwen3moe-q4km", "mixtral", "olmoe", "gpt-oss"];

fn load(stem: &str, arithmetic: Arithmetic) -> (Model, Tokenizer) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/arch/{stem}.gguf"));
    let model = Model::load_with(&path, 2, arithmetic).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.metadata).unwrap();
    (model, tok)
}

/// Runs `seqs[i]`'s tokens `parts[i]` (each continuing its sequence) as one batch; returns each
/// sequence's logits rows, every token wanting logits.
fn step(
    model: &Model,
    kv: &mut KvCache,
    st: &mut ForwardState,
    parts: &[(SeqId, &[TokenId])],
) -> Vec<Vec<f32>> {
    let mut batch = Batch::new();
    for &(seq, toks) in parts {
        let len = kv.seq_len(seq).unwrap();
        for (i, &t) in toks.iter().enumerate() {
            batch.push(t, len + i, seq, true);
        }
    }
    model.forward(&batch, kv, st).unwrap();
    let v = model.hp.n_vocab;
    let mut at = 0;
    parts
        .iter()
        .map(|&(_, toks)| {
            let rows = st.logits()[at * v..(at + toks.len()) * v].to_vec();
            at += toks.len();
            rows
        })
        .collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn check(stem: &str, arithmetic: Arithmetic) {
    let (model, tok) = load(stem, arithmetic);
    let enc = |s: &str| tok.encode(s, false, true).unwrap();
    let a = enc("The quick brown fox jumps over the lazy dog, and then it runs back home.");
    let other = enc("int main() { return 0; } // 12345 + 678 = 13023");
    let next: TokenId = 42;
    let (mut kv, mut st) = (model.new_kv_cache(512, 16), ForwardState::new());

    // A alone: its prompt as one batch, then one decode step.
    let sa = kv.new_seq();
    let alone = step(&model, &mut kv, &mut st, &[(sa, &a)]).remove(0);
    let alone_next = step(&model, &mut kv, &mut st, &[(sa, &[next])]).remove(0);

    // A beside a copy of itself (the same experts) and beside other text (other experts).
    for (what, b) in [("its copy", &a), ("other text", &other)] {
        let (sa, sb) = (kv.new_seq(), kv.new_seq());
        let rows = step(&model, &mut kv, &mut st, &[(sb, b), (sa, &a)]);
        assert!(same_bits(&rows[1], &alone), "{stem}: prompt beside {what}");
        let rows = step(&model, &mut kv, &mut st, &[(sa, &[next]), (sb, &[7, 8, 9])]);
        assert!(
            same_bits(&rows[0], &alone_next),
            "{stem}: decode beside {what}"
        );
    }

    // A's prompt in chunks of 3.
    let sa = kv.new_seq();
    let mut rows = vec![];
    for chunk in a.chunks(3) {
        rows.extend(step(&model, &mut kv, &mut st, &[(sa, chunk)]).remove(0));
    }
    assert!(same_bits(&rows, &alone), "{stem}: chunked prompt");

    // Through a session (prefix cache, chunked feeding): the last row matches.
    let mut s = Session::new(&model, 256);
    let last = s.feed(&a, 5, false).unwrap();
    let v = model.hp.n_vocab;
    assert!(
        same_bits(&last, &alone[(a.len() - 1) * v..]),
        "{stem}: session"
    );
}

#[test]
fn moe_is_batch_invariant_in_nucleus_arithmetic() {
    for stem in FIXTURES {
        check(stem, Arithmetic::Fast);
    }
}

#[test]
fn moe_is_batch_invariant_in_exact_arithmetic() {
    for stem in FIXTURES {
        check(stem, Arithmetic::Exact);
    }
}
