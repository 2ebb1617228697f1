//! Beam search's tests: a synthetic model whose logits depend on the whole prefix, against an
//! exhaustive search of its tree.

use super::*;
use crate::sampling::{Sampler, SamplingParams};
use std::collections::HashMap;

/// A synthetic model: next-token logits are a fixed pseudo-random function of the whole
/// prefix (prompt + generated). Tracks live beams to catch leaks.
struct Synth {
    vocab: usize,
    seed: u64,
    beams: HashMap<BeamId, Vec<TokenId>>,
    next_id: BeamId,
    steps: usize,
    /// Scale of the logits (larger: peakier distributions).
    scale: f32,
    /// Extra logit added to EOS (token 0).
    eos_boost: f32,
    /// Forks that succeed before one fails (`None`: all do).
    forks_left: Option<usize>,
    /// The step that fails (1 the first; `None`: none).
    failing_step: Option<usize>,
}

impl Synth {
    fn new(vocab: usize, seed: u64) -> Self {
        Synth {
            vocab,
            seed,
            beams: HashMap::new(),
            next_id: 0,
            steps: 0,
            scale: 3.0,
            eos_boost: 0.0,
            forks_left: None,
            failing_step: None,
        }
    }

    fn logits_for(&self, prefix: &[TokenId]) -> Vec<f32> {
        let mut h = self.seed ^ 0xcbf2_9ce4_8422_2325;
        for &t in prefix {
            h = (h ^ t as u64 ^ 0x100).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut r = crate::sampling::Rng::new(h);
        let mut l: Vec<f32> = (0..self.vocab)
            .map(|_| (r.next_f64() as f32 - 0.5) * 2.0 * self.scale)
            .collect();
        l[0] += self.eos_boost;
        l
    }

    /// Evaluate the prompt into a new root beam (done once).
    fn root(&mut self, prompt: &[TokenId]) -> (BeamId, Vec<f32>) {
        let id = self.next_id;
        self.next_id += 1;
        self.beams.insert(id, prompt.to_vec());
        (id, self.logits_for(prompt))
    }
}

impl BeamModel for Synth {
    type Error = String;
    fn fork(&mut self, parent: BeamId) -> Result<BeamId, String> {
        match &mut self.forks_left {
            Some(0) => return Err("out of forks".into()),
            Some(n) => *n -= 1,
            None => {}
        }
        let p = self
            .beams
            .get(&parent)
            .ok_or("fork of unknown beam")?
            .clone();
        let id = self.next_id;
        self.next_id += 1;
        self.beams.insert(id, p);
        Ok(id)
    }
    fn drop_beam(&mut self, id: BeamId) {
        assert!(self.beams.remove(&id).is_some(), "double drop of {id}");
    }
    fn step(&mut self, beams: &[(BeamId, TokenId)]) -> Result<Vec<Vec<f32>>, String> {
        self.steps += 1;
        if self.failing_step == Some(self.steps) {
            return Err("step failed".into());
        }
        let mut out = Vec::new();
        for &(id, t) in beams {
            let p = self.beams.get_mut(&id).ok_or("step of unknown beam")?;
            p.push(t);
            let p = p.clone();
            out.push(self.logits_for(&p));
        }
        Ok(out)
    }
}

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let lse = log_sum_exp(l);
    l.iter().map(|&x| x as f64 - lse).collect()
}

/// Every hypothesis of the tree, scored.
fn exhaustive(m: &Synth, prompt: &[TokenId], p: &BeamParams) -> Vec<Hypothesis> {
    fn rec(
        m: &Synth,
        prefix: &mut Vec<TokenId>,
        gen: usize,
        sum: f64,
        p: &BeamParams,
        out: &mut Vec<Hypothesis>,
    ) {
        let lp = log_softmax(&m.logits_for(prefix));
        for (t, &l) in lp.iter().enumerate() {
            let t = t as TokenId;
            let s = sum + l;
            let len = gen + 1;
            let tokens = prefix[prefix.len() - gen..].iter().copied().chain([t]);
            let eos = p.eos.contains(&t);
            if eos || len == p.max_new_tokens {
                out.push(Hypothesis {
                    tokens: tokens.collect(),
                    sum_logprob: s as f32,
                    score: score(s, len, p.length_penalty) as f32,
                    finish: if eos {
                        FinishReason::Stop
                    } else {
                        FinishReason::Length
                    },
                });
            } else {
                prefix.push(t);
                rec(m, prefix, gen + 1, s, p, out);
                prefix.pop();
            }
        }
    }
    let mut out = Vec::new();
    rec(m, &mut prompt.to_vec(), 0, 0.0, p, &mut out);
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    out
}

#[test]
fn width_one_is_greedy() {
    for seed in 0..20 {
        let prompt = [7, 3];
        let mut m = Synth::new(8, seed);
        m.eos_boost = 1.0;
        let (root, l0) = m.root(&prompt);
        let p = BeamParams {
            width: 1,
            length_penalty: 0.0,
            max_new_tokens: 12,
            eos: vec![0],
            n_best: 1,
        };
        let best = beam_search(&mut m, root, &l0, &p).unwrap();
        assert!(m.beams.is_empty(), "leaked beams");

        // Greedy with the sampler over the same model.
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        let mut ctx = prompt.to_vec();
        let mut gen = Vec::new();
        loop {
            let mut l = m.logits_for(&ctx);
            let t = s.sample(&mut l, &ctx).unwrap().token;
            gen.push(t);
            ctx.push(t);
            if t == 0 || gen.len() == p.max_new_tokens {
                break;
            }
        }
        assert_eq!(best[0].tokens, gen, "seed {seed}");
        let want: f64 = (0..gen.len())
            .map(|i| log_softmax(&m.logits_for(&ctx[..prompt.len() + i]))[gen[i] as usize])
            .sum();
        assert!((best[0].sum_logprob as f64 - want).abs() < 1e-4);
    }
}

#[test]
fn beam_as_wide_as_the_tree_is_exhaustive() {
    for (seed, alpha) in [(1, 0.0), (2, 1.0), (3, 2.0), (4, -0.5), (5, 0.6)] {
        let mut m = Synth::new(4, seed);
        let prompt = [1, 2, 3];
        let p = BeamParams {
            width: 200, // > the 108 proposals of the widest level and the 121 leaves
            length_penalty: alpha,
            max_new_tokens: 4,
            eos: vec![0],
            n_best: 10,
        };
        let want = exhaustive(&m, &prompt, &p);
        assert_eq!(want.len(), 1 + 3 + 9 + 27 + 81);
        let (root, l0) = m.root(&prompt);
        let got = beam_search(&mut m, root, &l0, &p).unwrap();
        assert!(m.beams.is_empty());
        assert_eq!(got.len(), 10);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.tokens, w.tokens, "seed {seed} alpha {alpha}");
            assert_eq!(g.finish, w.finish);
            assert!((g.score - w.score).abs() < 1e-5);
        }
        // Prompt evaluated once; one batched step per level below the last.
        assert_eq!(m.steps, 3);
    }
}

#[test]
fn narrow_beam_finds_the_exhaustive_best_on_peaky_model() {
    // Not guaranteed in general; on a peaky model a width-3 beam finds the exact optimum,
    // and the early-stop bound must not cut it.
    for seed in 0..10 {
        let mut m = Synth::new(5, 100 + seed);
        m.scale = 6.0;
        let prompt = [4];
        let p = BeamParams {
            width: 3,
            length_penalty: 1.0,
            max_new_tokens: 5,
            eos: vec![0],
            n_best: 1,
        };
        let want = exhaustive(&m, &prompt, &p);
        let (root, l0) = m.root(&prompt);
        let got = beam_search(&mut m, root, &l0, &p).unwrap();
        assert!(m.beams.is_empty());
        assert!(got[0].score <= want[0].score + 1e-6);
        // every returned hypothesis is a real one with the right score
        let h = want.iter().find(|h| h.tokens == got[0].tokens).unwrap();
        assert!((h.score - got[0].score).abs() < 1e-5);
    }
}

#[test]
fn early_stopping_when_finished_beat_live() {
    // EOS dominates every step: two finished hypotheses after two steps beat all live ones.
    let mut m = Synth::new(6, 9);
    m.eos_boost = 20.0;
    let (root, l0) = m.root(&[1]);
    let p = BeamParams {
        width: 2,
        length_penalty: 0.0,
        max_new_tokens: 50,
        eos: vec![0],
        n_best: 2,
    };
    let got = beam_search(&mut m, root, &l0, &p).unwrap();
    assert!(m.beams.is_empty());
    assert!(m.steps <= 1, "ran {} steps", m.steps);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].tokens, vec![0]);
    assert_eq!(got[0].finish, FinishReason::Stop);
    assert_eq!(got[1].tokens.len(), 2);
    assert!(got[0].score >= got[1].score);
}

#[test]
fn length_limit_and_no_eos() {
    let mut m = Synth::new(5, 11);
    let (root, l0) = m.root(&[2]);
    let p = BeamParams {
        width: 3,
        length_penalty: 1.0,
        max_new_tokens: 6,
        eos: vec![],
        n_best: 3,
    };
    let got = beam_search(&mut m, root, &l0, &p).unwrap();
    assert!(m.beams.is_empty());
    assert_eq!(got.len(), 3);
    for h in &got {
        assert_eq!(h.tokens.len(), 6);
        assert_eq!(h.finish, FinishReason::Length);
    }
    assert!(got.windows(2).all(|w| w[0].score >= w[1].score));
    assert_eq!(m.steps, 5);
}

#[test]
fn bad_params_and_nan_logits() {
    let mut m = Synth::new(5, 1);
    let (root, l0) = m.root(&[1]);
    let p = BeamParams {
        width: 0,
        ..Default::default()
    };
    assert!(beam_search(&mut m, root, &l0, &p).is_err());
    assert!(m.beams.is_empty());
    let (root, mut l0) = m.root(&[1]);
    l0[2] = f32::NAN;
    let err = beam_search(&mut m, root, &l0, &BeamParams::default()).unwrap_err();
    assert!(matches!(
        err,
        BeamError::Sampling(SamplingError::NanLogit(2))
    ));
    assert!(m.beams.is_empty());
}

/// A fork or a step that fails ends the search with the model's error, every beam the
/// search held dropped (none twice: `drop_beam` asserts it).
#[test]
fn model_failures_drop_every_beam() {
    let p = BeamParams {
        width: 4,
        length_penalty: 0.0,
        max_new_tokens: 6,
        eos: vec![0],
        n_best: 2,
    };
    for forks in 0..8 {
        let mut m = Synth::new(6, 3);
        m.forks_left = Some(forks);
        let (root, l0) = m.root(&[2, 5]);
        match beam_search(&mut m, root, &l0, &p) {
            Err(BeamError::Model(e)) => assert_eq!(e, "out of forks"),
            Err(e) => panic!("{forks} forks: {e:?}"),
            Ok(_) => assert!(forks >= 3, "{forks} forks cannot widen the beam to 4"),
        }
        assert!(m.beams.is_empty(), "{forks} forks: leaked {:?}", m.beams);
    }
    for step in 1..4 {
        let mut m = Synth::new(6, 3);
        m.failing_step = Some(step);
        let (root, l0) = m.root(&[2, 5]);
        let err = beam_search(&mut m, root, &l0, &p).unwrap_err();
        assert!(matches!(err, BeamError::Model(ref e) if e == "step failed"));
        assert!(m.beams.is_empty(), "step {step}: leaked {:?}", m.beams);
    }
}
