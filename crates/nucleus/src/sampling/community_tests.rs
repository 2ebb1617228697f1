//! The community samplers against hand-computed distributions (the numbers in each comment
//! come from the published definition, llama.cpp's `llama-sampler.cpp`) and, through the
//! whole [`Sampler`], chi-square tests of sampled draws against a plain f64 reference.

use super::super::stat_tests::chi2_pvalue;
use super::super::{Sampler, SamplingParams, TokenId};
use super::*;

fn cands(logits: &[f32]) -> Candidates {
    let mut c = Candidates::default();
    c.fill_top_k(logits, 0);
    c
}

/// (id, probability) of the candidates, by id.
fn dist(c: &Candidates) -> Vec<(TokenId, f64)> {
    let mut p = Vec::new();
    c.probs(&mut p);
    let mut v: Vec<(TokenId, f64)> = c.v.iter().map(|x| x.id).zip(p).collect();
    v.sort_by_key(|x| x.0);
    v
}

fn ln(p: &[f64]) -> Vec<f32> {
    p.iter().map(|&x| x.ln() as f32).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-5
}

#[test]
fn top_n_sigma_by_hand() {
    // logits 4, 2, 0, -2 (and a masked one): mean 1, variance (9+1+1+9)/4 = 5, σ = 2.2361.
    // n = 1: threshold 4 − 2.2361 = 1.7639 keeps 4 and 2; n = 2: 4 − 4.4721 = −0.4721 keeps 0 too.
    let l = [4.0, 2.0, 0.0, -2.0, f32::NEG_INFINITY];
    let mut a = l;
    assert_eq!(top_n_sigma(&mut a, 1.0), 2);
    assert_eq!(&a[..2], &[4.0, 2.0]);
    assert!(a[2..].iter().all(|x| *x == f32::NEG_INFINITY));
    let mut b = l;
    assert_eq!(top_n_sigma(&mut b, 2.0), 3);
    assert_eq!(&b[..3], &[4.0, 2.0, 0.0]);
    // Off, and scale-invariant (commutes with temperature).
    let mut c = l;
    assert_eq!(top_n_sigma(&mut c, 0.0), 4);
    let mut d = l.map(|x| x / 0.3);
    assert_eq!(top_n_sigma(&mut d, 1.0), 2);
}

#[test]
fn xtc_by_hand() {
    // p = 0.4, 0.3, 0.2, 0.1, threshold 0.25: 0.4 and 0.3 reach it; all but the least likely
    // of them (0.3) go: 0.3, 0.2, 0.1 renormalised = 1/2, 1/3, 1/6.
    let l = ln(&[0.4, 0.3, 0.2, 0.1]);
    let mut c = cands(&l);
    xtc(&mut c, 1.0, 0.25, 1.0, 0.5);
    let d = dist(&c);
    assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(close(d[0].1, 0.5) && close(d[1].1, 1.0 / 3.0) && close(d[2].1, 1.0 / 6.0));
    // Threshold 0.35: only 0.4 reaches it, nothing goes. The coin above the probability:
    // nothing goes. Threshold above 0.5: off.
    for (prob, thr, coin) in [(1.0, 0.35, 0.5), (0.5, 0.25, 0.6), (1.0, 0.6, 0.0)] {
        let mut c = cands(&l);
        xtc(&mut c, prob, thr, 1.0, coin);
        assert_eq!(c.len(), 4);
    }
    // Logits already divided by T = 0.5 (scale 0.5 undoes it): the same cut.
    let l2: Vec<f32> = l.iter().map(|x| x / 0.5).collect();
    let mut c = cands(&l2);
    xtc(&mut c, 1.0, 0.25, 0.5, 0.0);
    assert_eq!(c.len(), 3);
}

#[test]
fn dynatemp_by_hand() {
    // p = 0.8, 0.2: H = 0.500402 nats, ln 2 = 0.693147, H / ln 2 = 0.721928. temp 1, range
    // 0.5: T = 0.5 + 1.0 · 0.721928 = 1.221928; p0 = 0.8^(1/T) / (0.8^(1/T) + 0.2^(1/T))
    // = 0.756671. Exponent 2: T = 0.5 + 0.521180 = 1.021180, p0 = 0.795360.
    let l = ln(&[0.8, 0.2]);
    let mut s = Vec::new();
    for (exp, t_want, p0) in [(1.0, 1.221928, 0.756671), (2.0, 1.021180, 0.795360)] {
        let mut c = cands(&l);
        let t = dynatemp(&mut c, 1.0, 0.5, exp, &mut s);
        assert!(close(t as f64, t_want), "{t}");
        assert!(close(dist(&c)[0].1, p0), "{:?}", dist(&c));
    }
    // temp 0.3, range 0.5: T_min = max(0, −0.2) = 0, T = 0.8 · 0.721928 = 0.577543.
    let mut c = cands(&l);
    assert!(close(
        dynatemp(&mut c, 0.3, 0.5, 1.0, &mut s) as f64,
        0.577543
    ));
    // A uniform distribution has normalised entropy 1: T = T_max.
    let mut c = cands(&[0.0; 4]);
    assert!(close(dynatemp(&mut c, 1.0, 0.5, 1.0, &mut s) as f64, 1.5));
}

#[test]
fn mirostat_v2_by_hand() {
    // p = 1/2, 1/4, 1/8, 1/8: surprises 1, 2, 3, 3 bits. mu = 2 keeps the first two (2/3,
    // 1/3); u = 0.1 picks the first, surprise −log2(2/3) = 0.584963, so with tau 1.5 and
    // eta 0.1: mu = 2 − 0.1 · (0.584963 − 1.5) = 2.091504.
    let l = ln(&[0.5, 0.25, 0.125, 0.125]);
    let mut m = Mirostat::new(2, 1.5, 0.1);
    assert_eq!(m.mu, 3.0);
    m.mu = 2.0;
    let mut c = cands(&l);
    let mut s = Vec::new();
    let i = m.sample(&mut c, 4, 0.1, &mut s);
    assert_eq!(c.v[i].id, 0);
    assert_eq!(c.len(), 2);
    assert!(close(m.mu as f64, 2.091504), "{}", m.mu);
    // mu below every surprise: the top token alone.
    m.mu = 0.5;
    let mut c = cands(&l);
    m.sample(&mut c, 4, 0.9, &mut s);
    assert_eq!(c.len(), 1);
}

#[test]
fn mirostat_v1_by_hand() {
    // A Zipf distribution p_i ∝ (i+1)^−1.5 over N = 100 tokens: b_i = 1.5 t_i exactly, so
    // ŝ = 1.5, ε = 0.5. tau = 3 gives mu = 6: k = (0.5 · 2^6 / (1 − 100^−0.5))^(1/1.5)
    // = 35.556^(2/3) = 10.81, so the top 10 stay. Picking the first (p = 0.501169 among them):
    // mu = 6 − 0.1 · (−log2 0.501169 − 3) = 6.200337; the tenth (0.015848): 5.702048.
    let l: Vec<f32> = (0..100).map(|i| -1.5 * ((i + 1) as f32).ln()).collect();
    let mut s = Vec::new();
    for (u, id, mu) in [(0.0, 0, 6.200337), (0.999_999, 9, 5.702048)] {
        let mut m = Mirostat::new(1, 3.0, 0.1);
        let mut c = cands(&l);
        let i = m.sample(&mut c, 100, u, &mut s);
        assert_eq!(c.len(), 10);
        assert_eq!(c.v[i].id, id);
        assert!((m.mu as f64 - mu).abs() < 1e-4, "{}", m.mu);
    }
}

// ---- chi-square tests through the Sampler ----

const N: usize = 40_000;

fn logits8() -> Vec<f32> {
    vec![2.0, 1.5, 1.1, 0.6, 0.0, -0.4, -1.0, -1.7]
}

fn softmax(l: &[f64]) -> Vec<f64> {
    let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = l.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|x| x / z).collect()
}

fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams::unrestricted(7);
    p.community.dry_sequence_breakers.clear();
    f(&mut p);
    p
}

/// Counts of `n` draws; `fresh`: a new sampler (seed `seed + i`) per draw, for stateful ones.
fn draw(logits: &[f32], ctx: &[TokenId], p: &SamplingParams, fresh: bool) -> Vec<usize> {
    let mut counts = vec![0usize; logits.len()];
    let mut s = Sampler::new(p.clone()).unwrap();
    for i in 0..N {
        if fresh {
            let q = SamplingParams {
                seed: Some(1000 + i as u64),
                ..p.clone()
            };
            s = Sampler::new(q).unwrap();
        }
        let mut buf = logits.to_vec();
        counts[s.sample(&mut buf, ctx).unwrap().token as usize] += 1;
    }
    counts
}

fn fits(name: &str, counts: &[usize], target: &[f64]) {
    let pv = chi2_pvalue(counts, target);
    eprintln!("{name}: p = {pv:.4}");
    assert!(pv > 0.001, "{name}: chi-square p-value {pv}");
}

#[test]
fn chi2_top_n_sigma() {
    // logits8: mean 0.2625, σ = 1.1895; n = 1.5 keeps logits ≥ 2 − 1.7842 = 0.2158 (ids 0-3),
    // then temperature 0.7.
    let l = logits8();
    let p = params(|p| {
        p.community.top_n_sigma = 1.5;
        p.temperature = 0.7;
    });
    let mut t: Vec<f64> = l[..4].iter().map(|&x| x as f64 / 0.7).collect();
    t = softmax(&t);
    t.resize(8, 0.0);
    fits("top-n-sigma", &draw(&l, &[], &p, false), &t);
}

#[test]
fn chi2_xtc() {
    // p(logits8) = .391 .237 .159 .096 .053 .035 .019 .010; ids 0-2 reach threshold 0.15, so
    // ids 0 and 1 go (id 2, the least likely of them, stays) half the time (probability 0.5):
    // the target is the mixture of the two distributions.
    let l = logits8();
    let p = params(|p| {
        p.community.xtc_probability = 0.5;
        p.community.xtc_threshold = 0.15;
    });
    let full = softmax(&l.iter().map(|&x| x as f64).collect::<Vec<_>>());
    let mut cut: Vec<f64> = full.clone();
    cut[0] = 0.0;
    cut[1] = 0.0;
    let z: f64 = cut.iter().sum();
    let t: Vec<f64> = full
        .iter()
        .zip(&cut)
        .map(|(f, c)| 0.5 * f + 0.5 * c / z)
        .collect();
    fits("xtc", &draw(&l, &[], &p, false), &t);
}

#[test]
fn chi2_dynatemp() {
    // Top-k 4 leaves logits 2, 1.5, 1.1, 0.6; temperature 1 ± 0.6, exponent 1.5: T from the
    // normalised entropy of those four, then softmax(logit / T).
    let l = logits8();
    let p = params(|p| {
        p.top_k = 4;
        p.community.dynatemp_range = 0.6;
        p.community.dynatemp_exponent = 1.5;
    });
    let q = softmax(&l[..4].iter().map(|&x| x as f64).collect::<Vec<_>>());
    let h: f64 = -q.iter().map(|x| x * x.ln()).sum::<f64>();
    let temp = 0.4 + 1.2 * (h / 4f64.ln()).powf(1.5);
    let mut t = softmax(&l[..4].iter().map(|&x| x as f64 / temp).collect::<Vec<_>>());
    t.resize(8, 0.0);
    fits("dynatemp", &draw(&l, &[], &p, false), &t);
}

#[test]
fn chi2_dry() {
    // Context 3 5 1 ... 3 5: token 1 would repeat `3 5 1` (n = 2): its logit loses
    // 0.8 · 1.75^0 = 0.8.
    let l = logits8();
    let p = params(|p| p.community.dry_multiplier = 0.8);
    let mut d: Vec<f64> = l.iter().map(|&x| x as f64).collect();
    d[1] -= 0.8;
    fits(
        "dry",
        &draw(&l, &[3, 5, 1, 7, 3, 5], &p, false),
        &softmax(&d),
    );
}

#[test]
fn chi2_mirostat_first_draw() {
    // mu = 2·tau = 3 bits keeps p ≥ 1/8: ids 0-2 (.391 .237 .159) for v2, then renormalised.
    let l = logits8();
    let p = params(|p| {
        p.community.mirostat = 2;
        p.community.mirostat_tau = 1.5;
    });
    let full = softmax(&l.iter().map(|&x| x as f64).collect::<Vec<_>>());
    let mut t: Vec<f64> = full
        .iter()
        .map(|&x| if x >= 0.125 { x } else { 0.0 })
        .collect();
    let z: f64 = t.iter().sum();
    t.iter_mut().for_each(|x| *x /= z);
    fits("mirostat v2", &draw(&l, &[], &p, true), &t);
}

#[test]
fn mirostat_mu_is_the_sequences_own() {
    // Two samplers with the same seed and settings give the same tokens and the same mu,
    // whatever another sampler draws in between (batch invariance).
    let l = logits8();
    let p = params(|p| {
        p.community.mirostat = 1;
        p.seed = Some(3);
    });
    let (mut a, mut b, mut other) = (
        Sampler::new(p.clone()).unwrap(),
        Sampler::new(p.clone()).unwrap(),
        Sampler::new(SamplingParams { seed: Some(4), ..p }).unwrap(),
    );
    for _ in 0..50 {
        let ta = a.sample(&mut l.clone(), &[]).unwrap().token;
        other.sample(&mut l.clone(), &[]).unwrap();
        let tb = b.sample(&mut l.clone(), &[]).unwrap().token;
        assert_eq!(ta, tb);
        assert_eq!(a.mirostat_mu(), b.mirostat_mu());
    }
    assert_ne!(a.mirostat_mu(), Some(10.0));
}

#[test]
fn validation_names_the_field() {
    let bad = |f: fn(&mut CommunityParams)| {
        let mut c = CommunityParams::default();
        f(&mut c);
        match c.validate() {
            Err(SamplingError::InvalidParam { name, .. }) => name,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(bad(|c| c.dry_multiplier = -1.0), "dry_multiplier");
    assert_eq!(bad(|c| c.dry_base = 0.5), "dry_base");
    assert_eq!(
        bad(|c| c.dry_sequence_breakers.push(String::new())),
        "dry_sequence_breakers"
    );
    assert_eq!(bad(|c| c.xtc_probability = 1.5), "xtc_probability");
    assert_eq!(bad(|c| c.xtc_threshold = -0.1), "xtc_threshold");
    assert_eq!(bad(|c| c.mirostat = 3), "mirostat");
    assert_eq!(bad(|c| c.mirostat_tau = f32::NAN), "mirostat_tau");
    assert_eq!(bad(|c| c.mirostat_eta = -0.1), "mirostat_eta");
    assert_eq!(bad(|c| c.top_n_sigma = f32::INFINITY), "top_n_sigma");
    assert_eq!(bad(|c| c.dynatemp_range = -1.0), "dynatemp_range");
    assert_eq!(bad(|c| c.dynatemp_exponent = -1.0), "dynatemp_exponent");
    assert!(CommunityParams::default().validate().is_ok());
}
