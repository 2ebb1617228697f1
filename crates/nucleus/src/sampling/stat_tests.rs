//! Statistical tests: the sampler's empirical frequencies against analytic targets.
//!
//! Each case draws N = 40,000 tokens with a fixed seed and runs Pearson's chi-square test of
//! the counts against the target distribution, computed here by a separate, plain reference
//! (full sort, f64). The p-value comes from the chi-square distribution with k - 1 degrees of
//! freedom (k = tokens with non-zero target), via the regularized upper incomplete gamma
//! function `Q(df/2, x/2)`. A token whose target is 0 must never be drawn.

use super::*;

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9; ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 - x) = π / sin(πx)
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, &c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularized upper incomplete gamma Q(a, x) = Γ(a, x) / Γ(a): the series for P when
/// x < a + 1, the continued fraction (modified Lentz) for Q otherwise.
fn gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    if x < a + 1.0 {
        let (mut sum, mut term, mut n) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            n += 1.0;
            term *= x / n;
            sum += term;
            if term.abs() < sum.abs() * 1e-16 {
                break;
            }
        }
        1.0 - sum * front
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        h * front
    }
}

/// P(X ≥ x) for X ~ chi-square with `df` degrees of freedom.
fn chi2_sf(x: f64, df: usize) -> f64 {
    gamma_q(df as f64 / 2.0, x / 2.0)
}

#[test]
fn chi2_sf_known_values() {
    // Critical values at 5% and 0.1% from standard tables.
    assert!((chi2_sf(3.841_458_820_694_124, 1) - 0.05).abs() < 1e-9);
    assert!((chi2_sf(18.307_038_053_275_146, 10) - 0.05).abs() < 1e-9);
    assert!((chi2_sf(10.827_566_170_662_733, 1) - 0.001).abs() < 1e-10);
    assert!((chi2_sf(124.342_113_404_684_1, 100) - 0.05).abs() < 1e-8);
    // df = 2: exactly exp(-x/2).
    for x in [0.1, 1.0, 2.0, 7.5, 30.0] {
        assert!((chi2_sf(x, 2) - (-x / 2.0f64).exp()).abs() < 1e-12);
    }
    assert_eq!(chi2_sf(0.0, 3), 1.0);
    assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-12);
    assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-12);
}

/// Reference target: plain f64 implementation of the chain (no penalties), full sort, in
/// llama.cpp's default order: top-k, typical-p, top-p, min-p on the untempered distribution,
/// then temperature on what is left.
fn reference(logits: &[f32], p: &SamplingParams) -> Vec<f64> {
    let n = logits.len();
    let mut l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
    let mut alive = vec![true; n];
    let softmax = |l: &[f64], alive: &[bool]| -> Vec<f64> {
        let m = (0..n)
            .filter(|&i| alive[i])
            .map(|i| l[i])
            .fold(f64::MIN, f64::max);
        let w: Vec<f64> = (0..n)
            .map(|i| if alive[i] { (l[i] - m).exp() } else { 0.0 })
            .collect();
        let z: f64 = w.iter().sum();
        w.iter().map(|x| x / z).collect()
    };
    // order: descending logit, ties by id
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
    if p.top_k > 0 {
        for &i in order.iter().skip(p.top_k) {
            alive[i] = false;
        }
    }
    if p.typical_p < 1.0 {
        let q = softmax(&l, &alive);
        let h: f64 = -q
            .iter()
            .filter(|&&x| x > 0.0)
            .map(|x| x * x.ln())
            .sum::<f64>();
        let mut ord: Vec<usize> = (0..n).filter(|&i| alive[i]).collect();
        ord.sort_by(|&a, &b| {
            let da = (-q[a].ln() - h).abs();
            let db = (-q[b].ln() - h).abs();
            da.total_cmp(&db)
                .then(l[b].total_cmp(&l[a]))
                .then(a.cmp(&b))
        });
        let mut cum = 0.0;
        let mut cut = false;
        for &i in &ord {
            if cut {
                alive[i] = false;
            }
            cum += q[i];
            if cum >= p.typical_p as f64 {
                cut = true;
            }
        }
    }
    if p.top_p < 1.0 {
        let q = softmax(&l, &alive);
        let mut cum = 0.0;
        let mut cut = false;
        for &i in &order {
            if !alive[i] {
                continue;
            }
            if cut {
                alive[i] = false;
            }
            cum += q[i];
            if cum >= p.top_p as f64 {
                cut = true;
            }
        }
    }
    if p.min_p > 0.0 {
        let q = softmax(&l, &alive);
        let qmax = q.iter().cloned().fold(0.0, f64::max);
        for i in 0..n {
            if q[i] < p.min_p as f64 * qmax {
                alive[i] = false;
            }
        }
    }
    for x in l.iter_mut() {
        *x = if x.is_finite() {
            *x / p.temperature as f64
        } else {
            f64::MIN
        };
    }
    softmax(&l, &alive)
}

/// Draw `n` tokens through a sampler built from `p`; returns the count of each token.
fn draw(logits: &[f32], p: &SamplingParams, n: usize) -> Vec<usize> {
    let mut s = Sampler::new(p.clone()).unwrap();
    let mut counts = vec![0usize; logits.len()];
    let mut buf = logits.to_vec();
    for _ in 0..n {
        buf.copy_from_slice(logits);
        counts[s.sample(&mut buf, &[]).unwrap().token as usize] += 1;
    }
    counts
}

/// Pearson's chi-square p-value of `counts` against `target`; a token with target 0 must have
/// count 0 (a stage that must cut a token never returns it).
pub(crate) fn chi2_pvalue(counts: &[usize], target: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    let mut stat = 0.0;
    let mut k = 0;
    for (i, (&c, &q)) in counts.iter().zip(target).enumerate() {
        if q == 0.0 {
            assert_eq!(c, 0, "token {i} must have been cut");
            continue;
        }
        let e = q * n as f64;
        assert!(
            e >= 5.0,
            "expected count {e} too small for chi-square; fix the test"
        );
        stat += (c as f64 - e).powi(2) / e;
        k += 1;
    }
    if k <= 1 {
        return 1.0; // a single surviving token: the assert above already checked the rest
    }
    chi2_sf(stat, k - 1)
}

fn chi2_check(logits: &[f32], p: SamplingParams, n: usize) -> f64 {
    chi2_pvalue(&draw(logits, &p, n), &reference(logits, &p))
}

const N: usize = 40_000;

fn logits8() -> Vec<f32> {
    vec![2.0, 1.5, 1.1, 0.6, 0.0, -0.4, -1.0, -1.7]
}

fn base(seed: u64) -> SamplingParams {
    SamplingParams::unrestricted(seed)
}

fn assert_fits(name: &str, logits: &[f32], p: SamplingParams) {
    let pv = chi2_check(logits, p, N);
    eprintln!("{name}: p = {pv:.4}");
    assert!(pv > 0.001, "{name}: chi-square p-value {pv}");
}

#[test]
fn chi2_temperature() {
    for (i, t) in [1.0f32, 0.5, 0.8, 1.7].into_iter().enumerate() {
        let p = SamplingParams {
            temperature: t,
            ..base(100 + i as u64)
        };
        assert_fits(&format!("T={t}"), &logits8(), p);
    }
}

#[test]
fn chi2_top_k() {
    for (i, k) in [1usize, 3, 5, 8, 100].into_iter().enumerate() {
        let p = SamplingParams {
            top_k: k,
            ..base(200 + i as u64)
        };
        assert_fits(&format!("top_k={k}"), &logits8(), p);
    }
}

#[test]
fn chi2_top_p() {
    for (i, tp) in [0.3f32, 0.6, 0.8, 0.95, 1.0].into_iter().enumerate() {
        let p = SamplingParams {
            top_p: tp,
            ..base(300 + i as u64)
        };
        assert_fits(&format!("top_p={tp}"), &logits8(), p);
    }
}

#[test]
fn chi2_min_p() {
    for (i, mp) in [0.05f32, 0.2, 0.5, 0.9].into_iter().enumerate() {
        let p = SamplingParams {
            min_p: mp,
            ..base(400 + i as u64)
        };
        assert_fits(&format!("min_p={mp}"), &logits8(), p);
    }
}

#[test]
fn chi2_typical_p() {
    for (i, tp) in [0.5f32, 0.9].into_iter().enumerate() {
        let p = SamplingParams {
            typical_p: tp,
            ..base(500 + i as u64)
        };
        assert_fits(&format!("typical_p={tp}"), &logits8(), p);
    }
}

#[test]
fn chi2_combinations() {
    let combos = [
        (0.7f32, 5usize, 0.9f32, 0.1f32, 1.0f32),
        (1.3, 6, 0.8, 0.05, 1.0),
        (0.9, 0, 0.85, 0.15, 1.0),
        (1.0, 7, 1.0, 0.1, 0.9),
        (0.8, 40, 0.95, 0.05, 1.0), // the defaults
    ];
    for (i, (t, k, tp, mp, typ)) in combos.into_iter().enumerate() {
        let p = SamplingParams {
            temperature: t,
            top_k: k,
            top_p: tp,
            min_p: mp,
            typical_p: typ,
            ..base(600 + i as u64)
        };
        assert_fits(&format!("combo {i}"), &logits8(), p);
    }
}

#[test]
fn chi2_edge_distributions() {
    // All equal logits: uniform; with top-p 0.5 exactly half of them (lowest ids).
    assert_fits("uniform", &[0.3; 6], base(700));
    let p = SamplingParams {
        top_p: 0.5,
        ..base(701)
    };
    assert_fits("uniform top_p", &[0.3; 6], p);
    // -inf logits are never drawn.
    let l = [f32::NEG_INFINITY, 0.0, 1.0, f32::NEG_INFINITY, 0.5];
    assert_fits("masked", &l, base(702));
    // Large logits (overflow if not shifted).
    let l = [1000.0, 999.0, 998.5, 995.0];
    assert_fits("large logits", &l, base(703));
}

#[test]
fn chi2_many_tokens_top_k_off() {
    // 60 tokens through the unsorted path (top-k off, top-p with prefix growth).
    let l: Vec<f32> = (0..60).map(|i| ((i * 37 % 60) as f32) / 25.0).collect();
    let p = SamplingParams {
        top_p: 0.9,
        ..base(800)
    };
    assert_fits("60 tokens top_p", &l, p);
    assert_fits("60 tokens", &l, base(801));
}

/// The RNG itself: 100 equiprobable tokens, chi-square with 99 degrees of freedom.
#[test]
fn chi2_uniform_over_many_tokens() {
    assert_fits("uniform 100", &[0.0; 100], base(900));
}

/// The test has power: draws at T = 1 fail against the T = 0.9 target, and top-p 0.8 draws
/// fail against the top-p 0.95 target.
#[test]
fn chi2_detects_a_wrong_target() {
    let l = logits8();
    let counts = draw(&l, &base(1000), N);
    let wrong = reference(
        &l,
        &SamplingParams {
            temperature: 0.9,
            ..base(0)
        },
    );
    assert!(chi2_pvalue(&counts, &wrong) < 1e-6);
    let right = reference(&l, &base(0));
    assert!(chi2_pvalue(&counts, &right) > 0.001);
    let p80 = SamplingParams {
        top_p: 0.8,
        ..base(1001)
    };
    let counts = draw(&l, &p80, N);
    let t95 = reference(
        &l,
        &SamplingParams {
            top_p: 0.95,
            ..base(0)
        },
    );
    // tokens cut at 0.8 but not at 0.95 have count 0 against a non-zero target
    assert!(chi2_pvalue(&counts, &t95) < 1e-6);
}

/// Issue 15: the first 32 random draws of every choice of requests `seed = 1 … 50`, `n = 16`,
/// through the samplers the server builds (`SamplingParams::for_choice`): no two (seed, index)
/// pairs share a draw, so no stream is another's, shifted or not. The old rule (choice `i`
/// seeded with `seed + i`) fails this: choice 1 of seed 1 was choice 0 of seed 2.
#[test]
fn choices_of_neighbouring_seeds_share_no_draws() {
    use std::collections::HashSet;
    let first_draws = |p: SamplingParams| -> Vec<u64> {
        let mut s = Sampler::new(p).unwrap();
        (0..32).map(|_| s.rng.next_u64()).collect()
    };
    let mut new_rule = HashSet::new();
    let mut old_rule = HashSet::new();
    for seed in 1..=50u64 {
        for i in 0..16 {
            new_rule.extend(first_draws(base(seed).for_choice(i)));
            old_rule.extend(first_draws(base(seed + i as u64)));
        }
    }
    assert_eq!(
        new_rule.len(),
        50 * 16 * 32,
        "two choices share a random draw"
    );
    assert_eq!(
        old_rule.len(),
        (50 + 15) * 32,
        "the old rule's overlap, for contrast"
    );
}

/// Issue 15: the first sampled token over 2,000 draws taken as 125 requests × 16 choices with
/// consecutive seeds follows the exact distribution (chi-square), as independent draws must;
/// the same draws under the old rule (`seed + i`) are mostly repeats and fail.
#[test]
fn chi2_choices_with_consecutive_seeds() {
    let logits = logits8();
    let target = reference(&logits, &base(0));
    let first_tokens = |params: &dyn Fn(u64, usize) -> SamplingParams| -> Vec<usize> {
        let mut counts = vec![0usize; logits.len()];
        for seed in 1..=125u64 {
            for i in 0..16 {
                let mut s = Sampler::new(params(seed, i)).unwrap();
                let mut buf = logits.clone();
                counts[s.sample(&mut buf, &[]).unwrap().token as usize] += 1;
            }
        }
        counts
    };
    let p_new = chi2_pvalue(&first_tokens(&|seed, i| base(seed).for_choice(i)), &target);
    let p_old = chi2_pvalue(&first_tokens(&|seed, i| base(seed + i as u64)), &target);
    eprintln!("choices with consecutive seeds: p = {p_new:.4} (old rule: p = {p_old:.2e})");
    assert!(p_new > 0.001, "chi-square p-value {p_new}");
    assert!(
        p_old < 1e-6,
        "the old rule's repeats should show: p = {p_old}"
    );
}
