//! Tests of the whole chain through [`Sampler`] (stage formulas are tested in `stages.rs`, the
//! statistics in `stat_tests.rs`).

use super::*;

fn ln_probs(p: &[f32]) -> Vec<f32> {
    p.iter().map(|x| x.ln()).collect()
}

fn sampler(p: SamplingParams) -> Sampler {
    Sampler::new(p).unwrap()
}

#[test]
fn defaults_are_the_documented_ones() {
    let p = SamplingParams::default();
    assert_eq!(p.temperature, 0.8);
    assert_eq!(p.top_k, 40);
    assert_eq!(p.top_p, 0.95);
    assert_eq!(p.min_p, 0.05);
    assert_eq!(p.typical_p, 1.0);
    assert_eq!(p.repeat_penalty, 1.0);
    assert_eq!(p.repeat_last_n, 64);
    assert_eq!((p.presence_penalty, p.frequency_penalty), (0.0, 0.0));
    assert_eq!(p.no_repeat_ngram, 0);
    assert!(p.logit_bias.is_empty());
    assert_eq!((p.seed, p.logprobs), (None, None));
    p.validate().unwrap();
    SamplingParams::greedy().validate().unwrap();
}

#[test]
fn validate_rejects_out_of_range() {
    let d = SamplingParams::default;
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                temperature: -0.1,
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::NAN,
                ..d()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::INFINITY,
                ..d()
            },
            "temperature",
        ),
        (SamplingParams { top_p: 0.0, ..d() }, "top_p"),
        (SamplingParams { top_p: 1.01, ..d() }, "top_p"),
        (
            SamplingParams {
                min_p: -0.01,
                ..d()
            },
            "min_p",
        ),
        (SamplingParams { min_p: 1.5, ..d() }, "min_p"),
        (
            SamplingParams {
                typical_p: 0.0,
                ..d()
            },
            "typical_p",
        ),
        (
            SamplingParams {
                repeat_penalty: 0.0,
                ..d()
            },
            "repeat_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: f32::NAN,
                ..d()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: f32::INFINITY,
                ..d()
            },
            "frequency_penalty",
        ),
        (
            SamplingParams {
                logit_bias: vec![(1, f32::NAN)],
                ..d()
            },
            "logit_bias",
        ),
        (
            SamplingParams {
                logit_bias: vec![(1, f32::INFINITY)],
                ..d()
            },
            "logit_bias",
        ),
    ];
    for (p, name) in cases {
        match p.validate() {
            Err(SamplingError::InvalidParam { name: n, .. }) => assert_eq!(n, name),
            other => panic!("{name}: {other:?}"),
        }
        assert!(Sampler::new(p).is_err());
    }
    // Edges that are allowed.
    let ok = SamplingParams {
        temperature: 0.0,
        top_p: 1.0,
        min_p: 1.0,
        typical_p: 1.0,
        logit_bias: vec![(0, f32::NEG_INFINITY)],
        ..d()
    };
    ok.validate().unwrap();
}

#[test]
fn bad_logits_are_errors() {
    for p in [SamplingParams::greedy(), SamplingParams::unrestricted(1)] {
        let mut s = sampler(p);
        assert_eq!(s.sample(&mut [], &[]), Err(SamplingError::EmptyVocab));
        assert_eq!(
            s.sample(&mut [0.0, f32::NAN, 1.0], &[]),
            Err(SamplingError::NanLogit(1))
        );
        assert_eq!(
            s.sample(&mut [0.0, 1.0, f32::INFINITY], &[]),
            Err(SamplingError::InfiniteLogit(2))
        );
        assert_eq!(
            s.sample(&mut [f32::NEG_INFINITY; 3], &[]),
            Err(SamplingError::NoCandidates)
        );
    }
    // Everything banned by the bias.
    let mut s = sampler(SamplingParams {
        logit_bias: vec![(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)],
        ..SamplingParams::unrestricted(1)
    });
    assert_eq!(
        s.sample(&mut [1.0, 2.0], &[]),
        Err(SamplingError::NoCandidates)
    );
    let mut s = sampler(SamplingParams {
        logit_bias: vec![(5, 1.0)],
        ..SamplingParams::default()
    });
    assert!(matches!(
        s.sample(&mut [1.0, 2.0], &[]),
        Err(SamplingError::TokenOutOfRange { token: 5, vocab: 2 })
    ));
}

#[test]
fn greedy_is_argmax_whatever_the_other_settings() {
    let mut s = sampler(SamplingParams {
        temperature: 0.0,
        top_k: 1,
        top_p: 0.1,
        seed: Some(3),
        ..Default::default()
    });
    for _ in 0..100 {
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.9, -1.0], &[]).unwrap().token, 1);
    }
    // Ties: lowest id.
    assert_eq!(s.sample(&mut [1.0, 5.0, 5.0], &[]).unwrap().token, 1);
    // All equal: token 0.
    assert_eq!(s.sample(&mut [0.0; 10], &[]).unwrap().token, 0);
}

#[test]
fn tiny_temperature_converges_to_greedy() {
    let mut s = sampler(SamplingParams {
        temperature: 1e-6,
        seed: Some(5),
        ..SamplingParams::unrestricted(5)
    });
    for _ in 0..2000 {
        assert_eq!(
            s.sample(&mut [1.0, 1.001, 0.999, -2.0], &[]).unwrap().token,
            1
        );
    }
    let mut s = sampler(SamplingParams {
        temperature: f32::MIN_POSITIVE / 4.0, // subnormal
        ..SamplingParams::unrestricted(5)
    });
    assert_eq!(s.sample(&mut [1.0, 2.0, 0.0], &[]).unwrap().token, 1);
}

#[test]
fn single_token_vocab() {
    for p in [SamplingParams::greedy(), SamplingParams::default()] {
        let mut s = sampler(SamplingParams {
            logprobs: Some(5),
            seed: Some(1),
            ..p
        });
        let r = s.sample(&mut [-3.0], &[0, 0, 0]).unwrap();
        assert_eq!(r.token, 0);
        assert_eq!(r.logprob, Some(0.0));
        assert_eq!(r.top_logprobs, vec![(0, 0.0)]);
    }
}

#[test]
fn same_seed_same_tokens() {
    let logits: Vec<f32> = (0..1000)
        .map(|i| ((i * 7919) % 101) as f32 / 20.0)
        .collect();
    let run = |seed| {
        let mut s = sampler(SamplingParams {
            seed: Some(seed),
            top_k: 0,
            ..Default::default()
        });
        (0..200)
            .map(|_| s.sample(&mut logits.clone(), &[]).unwrap().token)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    // reseed restarts the stream
    let mut s = sampler(SamplingParams {
        seed: Some(9),
        ..Default::default()
    });
    let a: Vec<_> = (0..20)
        .map(|_| s.sample(&mut logits.clone(), &[]).unwrap().token)
        .collect();
    s.reseed(9);
    let b: Vec<_> = (0..20)
        .map(|_| s.sample(&mut logits.clone(), &[]).unwrap().token)
        .collect();
    assert_eq!(a, b);
}

#[test]
fn logprobs_are_from_the_raw_distribution() {
    let raw = ln_probs(&[0.1, 0.2, 0.3, 0.4]);
    let mut s = sampler(SamplingParams {
        temperature: 0.0,
        logit_bias: vec![(0, 10.0)], // makes token 0 the argmax
        repeat_penalty: 1.3,
        presence_penalty: 0.5,
        logprobs: Some(2),
        ..Default::default()
    });
    let r = s.sample(&mut raw.clone(), &[3, 3]).unwrap();
    assert_eq!(r.token, 0);
    assert!((r.logprob.unwrap() - 0.1f32.ln()).abs() < 1e-6);
    assert_eq!(r.top_logprobs.len(), 2);
    assert_eq!(r.top_logprobs[0].0, 3);
    assert!((r.top_logprobs[0].1 - 0.4f32.ln()).abs() < 1e-6);
    assert_eq!(r.top_logprobs[1].0, 2);
    assert!((r.top_logprobs[1].1 - 0.3f32.ln()).abs() < 1e-6);
    // Unnormalised logits give the same logprobs; no logprobs when not asked for.
    let mut shifted: Vec<f32> = raw.iter().map(|x| x + 7.0).collect();
    let r2 = s.sample(&mut shifted, &[3, 3]).unwrap();
    assert!((r2.logprob.unwrap() - 0.1f32.ln()).abs() < 1e-5);
    let mut s = sampler(SamplingParams::greedy());
    let r = s.sample(&mut raw.clone(), &[]).unwrap();
    assert_eq!((r.logprob, r.top_logprobs.len()), (None, 0));
}

#[test]
fn penalties_through_the_sampler() {
    // Repetition penalty flips the argmax away from a repeated positive token...
    let mut s = sampler(SamplingParams {
        repeat_penalty: 2.0,
        ..SamplingParams::greedy()
    });
    let mut l = vec![3.0, 2.0, -1.0];
    assert_eq!(s.sample(&mut l, &[0]).unwrap().token, 1);
    assert_eq!(l, vec![1.5, 2.0, -1.0]); // edited in place
                                         // ...and pushes a negative one further down.
    let mut l = vec![-1.0, -1.5];
    assert_eq!(s.sample(&mut l, &[0]).unwrap().token, 1);
    assert_eq!(l, vec![-2.0, -1.5]);
    // Outside the window: no penalty.
    let mut s = sampler(SamplingParams {
        repeat_penalty: 2.0,
        repeat_last_n: 1,
        ..SamplingParams::greedy()
    });
    assert_eq!(s.sample(&mut [3.0, 2.0, -1.0], &[0, 2]).unwrap().token, 0);
    // Frequency: each occurrence counts.
    let mut s = sampler(SamplingParams {
        frequency_penalty: 0.4,
        ..SamplingParams::greedy()
    });
    let mut l = vec![1.0, 0.0];
    s.sample(&mut l, &[0, 0, 0]).unwrap();
    assert!((l[0] - (1.0 - 1.2)).abs() < 1e-6);
}

#[test]
fn no_repeat_ngram_through_the_sampler() {
    let mut s = sampler(SamplingParams {
        no_repeat_ngram: 2,
        ..SamplingParams::greedy()
    });
    // "4 5 ... 4" -> 5 would repeat the bigram (4, 5): the next best is chosen.
    let mut l = vec![0.0, 0.0, 0.0, 0.0, 0.0, 9.0, 8.0];
    assert_eq!(s.sample(&mut l, &[4, 5, 6, 4]).unwrap().token, 6);
    // n-gram ban with sampling: 5 is never drawn.
    let mut s = sampler(SamplingParams {
        no_repeat_ngram: 2,
        ..SamplingParams::unrestricted(2)
    });
    for _ in 0..500 {
        let t = s
            .sample(&mut [0.0, 0.0, 0.0, 0.0, 0.0, 3.0], &[4, 5, 4])
            .unwrap();
        assert_ne!(t.token, 5);
    }
}

#[test]
fn explain_reports_sizes_entropy_and_probability() {
    // probs 0.5, 0.25, 0.125, 0.0625, 0.0625
    let raw = ln_probs(&[0.5, 0.25, 0.125, 0.0625, 0.0625]);
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_k: 4,
        top_p: 0.85,
        min_p: 0.3,
        seed: Some(1),
        ..Default::default()
    });
    s.set_explain(true);
    for _ in 0..50 {
        let r = s.sample(&mut raw.clone(), &[]).unwrap();
        let e = r.explain.unwrap();
        let sizes: Vec<(&str, usize)> = e.stages.iter().map(|(st, n)| (st.name(), *n)).collect();
        assert_eq!(
            sizes,
            vec![
                ("input", 5),
                ("penalties", 5),
                ("top_k", 4),
                ("typical_p", 4),
                ("top_p", 3), // renormalised over 4: 0.533, 0.8, 0.933
                ("min_p", 2), // 0.125 < 0.3 * 0.5
                ("temperature", 2),
            ]
        );
        let h = -(2.0f32 / 3.0 * (2.0f32 / 3.0).ln() + 1.0 / 3.0 * (1.0f32 / 3.0).ln());
        assert!((e.entropy - h).abs() < 1e-5);
        let want = if r.token == 0 { 2.0 / 3.0 } else { 1.0 / 3.0 };
        assert!(r.token <= 1);
        assert!((e.chosen_prob - want).abs() < 1e-6);
    }
    s.set_explain(false);
    assert!(s.sample(&mut raw.clone(), &[]).unwrap().explain.is_none());
    // Greedy explain.
    let mut g = sampler(SamplingParams {
        logit_bias: vec![(1, f32::NEG_INFINITY)],
        ..SamplingParams::greedy()
    });
    g.set_explain(true);
    let e = g.sample(&mut raw.clone(), &[]).unwrap().explain.unwrap();
    assert_eq!(
        e.stages,
        vec![(Stage::Input, 5), (Stage::Penalties, 4), (Stage::Greedy, 1)]
    );
    assert_eq!((e.entropy, e.chosen_prob), (0.0, 1.0));
}

#[test]
fn large_vocab_top_k_never_returns_a_cut_token() {
    let mut r = Rng::new(77);
    let logits: Vec<f32> = (0..150_000).map(|_| (r.next_f64() * 10.0) as f32).collect();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let top: std::collections::HashSet<TokenId> =
        order[..40].iter().map(|&i| i as TokenId).collect();
    let mut s = sampler(SamplingParams {
        temperature: 5.0, // flatten, so the tail would be drawn if it leaked
        top_k: 40,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(1),
        ..Default::default()
    });
    let mut seen = std::collections::HashSet::new();
    for _ in 0..3000 {
        let t = s.sample(&mut logits.clone(), &[]).unwrap().token;
        assert!(top.contains(&t));
        seen.insert(t);
    }
    assert_eq!(seen.len(), 40);
}

/// Speed check: `cargo test --release -p nucleus --lib sampling::tests::bench -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn bench_sample_262k() {
    let mut r = Rng::new(1);
    let logits: Vec<f32> = (0..262_144)
        .map(|_| (r.next_f64() * 20.0 - 10.0) as f32)
        .collect();
    let context: Vec<TokenId> = (0..4096).map(|i| (i * 31 % 262_144) as TokenId).collect();
    for (name, p) in [
        (
            "default (top-k 40)",
            SamplingParams {
                seed: Some(1),
                ..Default::default()
            },
        ),
        (
            "default + penalties + logprobs 5",
            SamplingParams {
                seed: Some(1),
                repeat_penalty: 1.1,
                presence_penalty: 0.3,
                logprobs: Some(5),
                ..Default::default()
            },
        ),
        ("greedy", SamplingParams::greedy()),
        (
            "top-k off, top-p 0.95",
            SamplingParams {
                seed: Some(1),
                top_k: 0,
                ..Default::default()
            },
        ),
    ] {
        let mut s = sampler(p);
        let mut buf = logits.clone();
        let n = 200;
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            buf.copy_from_slice(&logits);
            std::hint::black_box(s.sample(&mut buf, &context).unwrap());
        }
        let per = t0.elapsed() / n;
        println!("{name}: {per:?} per token (incl. a 1 MiB copy of the logits)");
    }
}

#[test]
#[ignore]
fn bench_parts() {
    let mut r = Rng::new(1);
    let logits: Vec<f32> = (0..262_144)
        .map(|_| (r.next_f64() * 20.0 - 10.0) as f32)
        .collect();
    let mut buf = logits.clone();
    let n = 200;
    let time = |name: &str, f: &mut dyn FnMut()| {
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            f();
        }
        println!("{name}: {:?}", t0.elapsed() / n);
    };
    time("copy", &mut || {
        buf.copy_from_slice(std::hint::black_box(&logits))
    });
    time("check", &mut || {
        check_logits(std::hint::black_box(&logits)).unwrap();
    });
    time("argmax", &mut || {
        std::hint::black_box(stages::argmax(std::hint::black_box(&logits)));
    });
    let mut c = Candidates::default();
    time("fill_top_k 40", &mut || {
        std::hint::black_box(c.fill_top_k(std::hint::black_box(&logits), 40));
    });
    time("fill all", &mut || {
        std::hint::black_box(c.fill_top_k(std::hint::black_box(&logits), 0));
    });
    time("lse", &mut || {
        std::hint::black_box(logprobs::log_sum_exp(std::hint::black_box(&logits)));
    });
}

#[test]
fn the_order_is_the_requests_and_left_out_stages_are_skipped() {
    use super::ChainStage::*;
    let raw = ln_probs(&[0.5, 0.25, 0.125, 0.0625, 0.0625]);
    let mut s = sampler(SamplingParams {
        temperature: 0.5,
        top_k: 4,
        top_p: 0.85,
        seed: Some(3),
        samplers: Some(vec![Temperature, TopP, TopK]),
        ..Default::default()
    });
    s.set_explain(true);
    let e = s.sample(&mut raw.clone(), &[]).unwrap().explain.unwrap();
    let names: Vec<(&str, usize)> = e.stages.iter().map(|(st, n)| (st.name(), *n)).collect();
    // T = 0.5 squares the probabilities: 0.25, 0.0625, ... over their sum 0.3333 + ...:
    // 0.744, 0.186 reach 0.85 with two tokens.
    assert_eq!(
        names,
        vec![
            ("input", 5),
            ("penalties", 5),
            ("temperature", 5),
            ("top_p", 2),
            ("top_k", 2)
        ]
    );
    // An empty order applies nothing: top_k = 1 does not make it greedy.
    let mut s = sampler(SamplingParams {
        temperature: 1.0,
        top_k: 1,
        seed: Some(4),
        samplers: Some(vec![]),
        ..Default::default()
    });
    let seen: std::collections::BTreeSet<u32> = (0..200)
        .map(|_| s.sample(&mut raw.clone(), &[]).unwrap().token)
        .collect();
    assert_eq!(seen.len(), 5);
    // Penalties after a truncation: refused, named.
    let bad = SamplingParams {
        samplers: Some(vec![TopK, Penalties]),
        ..Default::default()
    };
    let e = bad.validate().unwrap_err().to_string();
    assert!(e.contains("`samplers`") && e.contains("penalties"), "{e}");
}
