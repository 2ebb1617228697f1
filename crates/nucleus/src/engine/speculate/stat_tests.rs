//! The verification rule, statistically, on the tiny random llama model (fast enough for
//! thousands of runs): with a proposer that always proposes the same token `x`, the token after
//! it is distributed as the model's sampler chain says (χ²), `x` is accepted at the rate p(x),
//! and every run gives the same tokens with speculation as without, seed for seed.

use super::{DraftLength, Proposer, Speculator};
use crate::engine::{GenerateRequest, Session};
use crate::model::{Model, ModelError};
use crate::sampling::stat_tests::chi2_pvalue;
use crate::sampling::SamplingParams;
use crate::tokenizer::{TokenId, Tokenizer};

/// Always proposes the same token.
struct Always(TokenId);

impl Proposer for Always {
    fn propose(&mut self, _: &[TokenId], max: usize) -> Result<Vec<TokenId>, ModelError> {
        Ok(vec![self.0; max.min(1)])
    }
}

fn tiny() -> Option<(Model, Tokenizer)> {
    let path = std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/golden/tiny-llama-random.gguf"
    ));
    if !path.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{} is missing",
            path.display()
        );
        eprintln!("skipping: {} is absent", path.display());
        return None;
    }
    let model = Model::load(&path, 1).expect("load the tiny model");
    let tok = Tokenizer::from_gguf(&model.file.metadata).expect("tokenizer");
    Some((model, tok))
}

/// The sampler chain's distribution for `logits` with temperature `t` and top-k `k`, over
/// the whole vocabulary.
fn chain_probs(logits: &[f32], t: f32, k: usize) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let top = &idx[..k];
    let max = logits[top[0]] as f64;
    let w: Vec<f64> = top
        .iter()
        .map(|&i| ((logits[i] as f64 - max) / t as f64).exp())
        .collect();
    let sum: f64 = w.iter().sum();
    let mut p = vec![0.0; logits.len()];
    for (&i, &wi) in top.iter().zip(&w) {
        p[i] = wi / sum;
    }
    p
}

#[test]
fn chi2_verified_tokens_follow_the_chain() {
    let Some((model, tok)) = tiny() else {
        return;
    };
    let (temperature, top_k) = (0.8, 6);
    let prompt: Vec<TokenId> = vec![1, 450, 4996, 17354, 1701];
    let mut s = Session::new(&model, 64);
    s.set_prefix_caching(false);
    let first = s.feed(&prompt, 16, false).unwrap();
    let p1 = chain_probs(&first, temperature, top_k);
    let mode = crate::engine::argmax(&first);
    let second = s.feed(&[mode], 1, false).unwrap();
    let p2 = chain_probs(&second, temperature, top_k);
    // Propose the second most likely token after the mode: accepted now and then.
    let mut order: Vec<usize> = (0..p2.len()).collect();
    order.sort_by(|&a, &b| p2[b].total_cmp(&p2[a]));
    let x = order[1] as TokenId;

    let mut spec = Speculator::new(Box::new(Always(x)), 1);
    let mut counts = vec![0usize; p2.len()];
    let (mut runs_after_mode, mut accepted) = (0usize, 0usize);
    let mut seed = 0u64;
    while runs_after_mode < 1500 {
        let mut req = GenerateRequest::greedy(3);
        req.sampling = SamplingParams {
            temperature,
            top_k,
            ..SamplingParams::unrestricted(seed)
        };
        req.ignore_eos = true;
        // Propose at every step, whatever the controller would choose: this tests the rule.
        spec.length = DraftLength {
            step_secs: Some(1.0),
            alpha: 0.99,
            ..DraftLength::new(1)
        };
        s.reset();
        let with = s
            .generate_with(&tok, &prompt, &req, Some(&mut spec), |_| {})
            .unwrap();
        if seed < 300 {
            s.reset();
            let without = s.generate(&tok, &prompt, &req, |_| {}).unwrap();
            assert_eq!(with.tokens, without.tokens, "seed {seed}");
        }
        if with.tokens[0] == mode as TokenId {
            runs_after_mode += 1;
            counts[with.tokens[1] as usize] += 1;
            let stats = with.speculation.unwrap();
            assert_eq!(stats.proposed, 1);
            accepted += stats.accepted;
            assert_eq!(
                stats.accepted == 1,
                with.tokens[1] == x,
                "accepted iff sampled"
            );
        }
        seed += 1;
        assert!(
            seed < 40 * 1500,
            "the mode is too rare (p = {})",
            p1[mode as usize]
        );
    }
    let pv = chi2_pvalue(&counts, &p2);
    // Acceptance: a binomial with p = p2(x); |z| < 4.
    let n = runs_after_mode as f64;
    let z = (accepted as f64 - n * p2[x as usize])
        / (n * p2[x as usize] * (1.0 - p2[x as usize])).sqrt();
    eprintln!(
        "{runs_after_mode} runs after the mode ({seed} in all): chi2 p = {pv:.4}; accepted {accepted}, p(x) = {:.4}, z = {z:.2}",
        p2[x as usize]
    );
    assert!(pv > 0.001, "chi-square p-value {pv}");
    assert!(z.abs() < 4.0, "acceptance z = {z}");
}
