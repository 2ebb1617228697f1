//! Vocabulary-wide numeric loops, written so the compiler vectorizes them.
//!
//! A vocabulary is 150k–262k logits, and these loops run on all of them for every token, so
//! they avoid what blocks auto-vectorization: early exits, libm calls (`exp`), and a single
//! floating-point accumulator (float addition is not reassociated for us). Each processes
//! fixed chunks with independent lanes.

const LANES: usize = 8;

/// `e^x` for `x <= 0` (the only case here: logits minus their max), relative error < 5e-7,
/// exactly 1 at 0 and exactly 0 below -87 (and for `-inf`). Branch-free so it vectorizes:
/// `e^x = 2^n · e^r` with `n = round(x·log2 e)`, `r = x - n·ln2` computed in two parts
/// (Cody–Waite, so `r` stays accurate for large `n`), `|r| ≤ ln2/2`, and a degree-6 Taylor
/// polynomial for `e^r` (truncation error (ln2/2)^7/7! ≈ 1.2e-7).
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4; // few mantissa bits: n·LN2_HI is exact
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Round to nearest by the 1.5·2^23 trick (valid for |t| < 2^22).
    const MAGIC: f32 = 12_582_912.0;
    let xc = x.max(-87.0);
    let k = xc * LOG2E + MAGIC;
    let n = k - MAGIC;
    // round(t) as an integer, read from k's low mantissa bits (no float->int cast, which Rust
    // makes saturating and which then does not vectorize well).
    let ni = k.to_bits().wrapping_sub(MAGIC.to_bits());
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(ni.wrapping_add(127) << 23);
    // Zero below -87 with a bit mask: an `if` here becomes a branch and stops vectorization.
    let keep = ((x >= -87.0) as u32).wrapping_neg();
    f32::from_bits((p * scale).to_bits() & keep)
}

/// The largest value (`-inf` for an empty slice or all `-inf`). Assumes no NaN.
pub fn max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        let c: &[f32; LANES] = c.try_into().unwrap();
        for j in 0..LANES {
            acc[j] = if c[j] > acc[j] { c[j] } else { acc[j] };
        }
    }
    let mut m = rest
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    for a in acc {
        m = if a > m { a } else { m };
    }
    m
}

/// `Σ e^(x - m)` over `xs`, in f64 (lanes of f32 flushed to f64 every 4096 values).
pub fn sum_exp(xs: &[f32], m: f32) -> f64 {
    let mut total = 0.0f64;
    for block in xs.chunks(4096) {
        let mut acc = [0.0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let rest = chunks.remainder();
        for c in chunks {
            let c: &[f32; LANES] = c.try_into().unwrap();
            for j in 0..LANES {
                acc[j] += exp_approx(c[j] - m);
            }
        }
        total += acc.iter().map(|&a| a as f64).sum::<f64>();
        total += rest.iter().map(|&x| exp_approx(x - m) as f64).sum::<f64>();
    }
    total
}

/// True if some value is NaN or `+inf` (the logits we refuse). No early exit within a chunk.
pub fn any_nan_or_inf(xs: &[f32]) -> bool {
    xs.chunks(1024).any(|block| {
        // `x < inf` is false exactly for NaN and +inf.
        !block.iter().fold(true, |ok, &x| ok & (x < f32::INFINITY))
    })
}

/// Index of the largest value, lowest index among ties; `None` if all are `-inf` (or empty).
pub fn argmax(xs: &[f32]) -> Option<usize> {
    let m = max(xs);
    if m == f32::NEG_INFINITY {
        return None;
    }
    xs.iter().position(|&x| x == m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_approx_accuracy() {
        assert_eq!(exp_approx(0.0), 1.0);
        assert_eq!(exp_approx(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_approx(-88.0), 0.0);
        assert_eq!(exp_approx(-1e30), 0.0);
        let mut worst = 0.0f64;
        let mut x = -86.9f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let got = exp_approx(x) as f64;
            worst = worst.max((got - want).abs() / want);
            x += 0.0137;
        }
        assert!(worst < 5e-7, "max relative error {worst}");
    }

    #[test]
    fn reductions_match_plain_loops() {
        let xs: Vec<f32> = (0..10_007)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect();
        let m = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(max(&xs), m);
        let want: f64 = xs.iter().map(|&x| ((x - m) as f64).exp()).sum();
        assert!((sum_exp(&xs, m) - want).abs() / want < 1e-6);
        assert_eq!(argmax(&xs), xs.iter().position(|&x| x == m));
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 9]), None);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), Some(1));
        let mut bad = xs.clone();
        assert!(!any_nan_or_inf(&bad));
        bad[9000] = f32::NAN;
        assert!(any_nan_or_inf(&bad));
        bad[9000] = f32::INFINITY;
        assert!(any_nan_or_inf(&bad));
        bad[9000] = f32::NEG_INFINITY;
        assert!(!any_nan_or_inf(&bad));
    }
}
