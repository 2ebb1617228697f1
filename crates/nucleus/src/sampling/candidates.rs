//! The truncation stages of the sampler chain: [`Candidates`], a shrinking list of (token,
//! logit) pairs that starts as the finite logits (or just the top-k of them) and is cut by
//! top-p, min-p and typical-p, each step with its formula in its comment; then the pick.
//!
//! Ties between equal logits are always broken by the lower token id, so every stage is a
//! deterministic function of its input.

use std::cmp::Ordering;

use super::math::{self, exp_approx};
use super::TokenId;

/// One candidate token and its (possibly scaled) logit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: TokenId,
    pub logit: f32,
}

/// Descending logit, then ascending id: a total order (logits are never NaN here).
fn desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// The working set of the truncation stages.
///
/// Invariant: the first `sorted` entries are in descending order (logit, then lower id) and
/// rank above every later entry. Keeping a sorted prefix rather than sorting everything lets
/// top-p over a 256k vocab (with top-k off) sort only the few hundred tokens that carry the
/// mass.
#[derive(Debug, Default)]
pub struct Candidates {
    pub v: Vec<Candidate>,
    sorted: usize,
    /// Scratch for typical-p: (distance from entropy, prob, candidate).
    typical: Vec<(f64, f64, Candidate)>,
}

impl Candidates {
    pub fn len(&self) -> usize {
        self.v.len()
    }

    pub fn is_empty(&self) -> bool {
        self.v.is_empty()
    }

    /// Fill from a logits vector, keeping only the top `k` finite logits (`k == 0` or `k >=`
    /// vocab: all finite logits). Returns the number of finite logits (the size before top-k).
    ///
    /// Top-k uses a bounded buffer: push a logit only if it beats the current k-th best, and
    /// when the buffer reaches 2k, cut it back to k with a partial selection. One pass, O(vocab)
    /// cheap comparisons, no full sort.
    pub fn fill_top_k(&mut self, logits: &[f32], k: usize) -> usize {
        self.v.clear();
        self.sorted = 0;
        let mut finite = 0usize;
        if k == 0 || k >= logits.len() {
            for (i, &l) in logits.iter().enumerate() {
                if l > f32::NEG_INFINITY {
                    self.v.push(Candidate {
                        id: i as TokenId,
                        logit: l,
                    });
                }
            }
            return self.v.len();
        }
        let cap = (2 * k).max(k + 64);
        // Ids arrive in increasing order, so a new logit equal to the threshold ranks below the
        // current k-th (higher id): strict `>` is exact.
        // Chunks of 64: a vectorized max and count per chunk, and the element loop only for
        // the rare chunk holding something above the threshold.
        let mut thr = f32::NEG_INFINITY;
        for (ci, chunk) in logits.chunks(64).enumerate() {
            finite += chunk.iter().filter(|&&l| l > f32::NEG_INFINITY).count();
            if math::max(chunk) <= thr {
                continue;
            }
            for (j, &l) in chunk.iter().enumerate() {
                if l > thr {
                    self.v.push(Candidate {
                        id: (ci * 64 + j) as TokenId,
                        logit: l,
                    });
                    if self.v.len() == cap {
                        self.v.select_nth_unstable_by(k - 1, desc);
                        self.v.truncate(k);
                        thr = self.v[k - 1].logit;
                    }
                }
            }
        }
        self.top_k(k);
        finite
    }

    /// Sort the whole list in descending order.
    pub fn sort_all(&mut self) {
        self.sort_prefix(self.v.len());
    }

    /// Forget the sorted prefix (after a stage reordered or dropped entries arbitrarily).
    pub(super) fn mark_unsorted(&mut self) {
        self.sorted = 0;
    }

    /// Make the first `m` entries sorted (see the invariant).
    pub(super) fn sort_prefix(&mut self, m: usize) {
        let m = m.min(self.v.len());
        if m <= self.sorted {
            return;
        }
        let rest = &mut self.v[self.sorted..];
        let want = m - self.sorted;
        if want < rest.len() {
            rest.select_nth_unstable_by(want - 1, desc);
        }
        rest[..want].sort_unstable_by(desc);
        self.sorted = m;
    }

    fn max_logit(&self) -> f32 {
        if self.sorted > 0 {
            return self.v[0].logit;
        }
        self.v.iter().fold(
            f32::NEG_INFINITY,
            |m, c| if c.logit > m { c.logit } else { m },
        )
    }

    /// Top-k: keep the k highest logits (`k == 0` or `k >=` size: keep all).
    pub fn top_k(&mut self, k: usize) {
        if k == 0 || k >= self.v.len() {
            return;
        }
        self.sort_prefix(k);
        self.v.truncate(k);
    }

    /// Temperature: `logit = (logit - max) / t` for `t > 0`. Subtracting the max first changes
    /// no probability but keeps tiny temperatures from overflowing to `inf - inf = NaN`.
    /// (Temperature 0 never reaches here: the sampler picks the argmax.)
    pub fn temperature(&mut self, t: f32) {
        let m = self.max_logit();
        for c in &mut self.v {
            // Divide (not multiply by 1/t): 1/t overflows for subnormal t and 0 * inf is NaN.
            c.logit = (c.logit - m) / t;
        }
        // A tiny temperature can underflow low logits to -inf (probability 0): drop them, but
        // only from the tail so the sorted prefix stays valid.
        if t < 1.0 {
            self.v.retain(|c| c.logit > f32::NEG_INFINITY);
            self.sorted = self.sorted.min(self.v.len());
        }
    }

    /// `Σ exp(logit - m)` over the candidates (8 independent lanes so it vectorizes).
    fn sum_exp(&self, m: f32) -> f64 {
        let mut acc = [0.0f32; 8];
        let chunks = self.v.chunks_exact(8);
        let rest: f64 = chunks
            .remainder()
            .iter()
            .map(|c| exp_approx(c.logit - m) as f64)
            .sum();
        let mut total = 0.0f64;
        for (n, c) in chunks.enumerate() {
            for j in 0..8 {
                acc[j] += exp_approx(c[j].logit - m);
            }
            if n % 512 == 511 {
                total += acc.iter().map(|&a| a as f64).sum::<f64>();
                acc = [0.0; 8];
            }
        }
        total + acc.iter().map(|&a| a as f64).sum::<f64>() + rest
    }

    /// Softmax of the current logits into `out` (f64, sums to 1). Returns `(max, sum)` where
    /// `sum = Σ exp(logit - max)`.
    pub fn probs(&self, out: &mut Vec<f64>) -> (f32, f64) {
        let m = self.max_logit();
        out.clear();
        out.extend(self.v.iter().map(|c| exp_approx(c.logit - m) as f64));
        let sum: f64 = out.iter().sum();
        for p in out.iter_mut() {
            *p /= sum;
        }
        (m, sum)
    }

    /// Top-p (nucleus): keep the smallest prefix, by descending probability, whose mass reaches
    /// `p`; always at least one token. `p >= 1` keeps everything.
    pub fn top_p(&mut self, p: f32) {
        if p >= 1.0 || self.v.len() <= 1 {
            return;
        }
        let m = self.max_logit();
        let total = self.sum_exp(m);
        let target = p as f64 * total;
        let mut cum = 0.0f64;
        let mut i = 0usize;
        let mut chunk = 64usize;
        loop {
            self.sort_prefix(i + chunk);
            while i < self.sorted {
                cum += exp_approx(self.v[i].logit - m) as f64;
                i += 1;
                if cum >= target {
                    self.v.truncate(i);
                    return;
                }
            }
            if self.sorted == self.v.len() {
                return; // rounding kept the sum just under p: keep all
            }
            chunk *= 4;
        }
    }

    /// Min-p: keep tokens with `prob >= min_p * max_prob`, i.e. `logit >= max + ln(min_p)`
    /// (the max itself always survives). `min_p == 0` keeps everything.
    pub fn min_p(&mut self, min_p: f32) {
        if min_p <= 0.0 || self.v.len() <= 1 {
            return;
        }
        let thr = self.max_logit() + min_p.ln();
        self.keep_at_least(thr);
    }

    /// Top-n-σ on the candidates (llama.cpp's `top_n_sigma` where it runs after other
    /// stages): keep `logit ≥ max − n·σ`, σ the standard deviation of the candidates' logits.
    /// `n ≤ 0` keeps everything.
    pub fn top_n_sigma(&mut self, n: f32) {
        if n <= 0.0 || self.v.len() <= 1 {
            return;
        }
        let count = self.v.len() as f64;
        let mean = self.v.iter().map(|c| c.logit as f64).sum::<f64>() / count;
        let var = self
            .v
            .iter()
            .map(|c| (c.logit as f64 - mean).powi(2))
            .sum::<f64>()
            / count;
        let thr = (self.max_logit() as f64 - n as f64 * var.sqrt()) as f32;
        self.keep_at_least(thr);
    }

    /// Drops the candidates whose logit is below `thr`.
    fn keep_at_least(&mut self, thr: f32) {
        let before_sorted = self.sorted;
        let mut kept_sorted = 0;
        let mut i = 0;
        self.v.retain(|c| {
            let keep = c.logit >= thr;
            kept_sorted += (keep && i < before_sorted) as usize;
            i += 1;
            keep
        });
        // Dropping tokens below a threshold keeps the sorted prefix sorted and on top.
        self.sorted = kept_sorted;
    }

    /// Locally typical sampling (Meister et al. 2022): with entropy `H = -Σ p ln p`, rank tokens
    /// by `|-ln p - H|` (how far their surprise is from the expected surprise), and keep the
    /// smallest set in that order whose mass reaches `p`. `p >= 1` keeps everything.
    pub fn typical_p(&mut self, p: f32, scratch: &mut Vec<f64>) {
        if p >= 1.0 || self.v.len() <= 1 {
            return;
        }
        self.probs(scratch);
        let h: f64 = -scratch
            .iter()
            .filter(|&&q| q > 0.0)
            .map(|&q| q * q.ln())
            .sum::<f64>();
        let mut order = std::mem::take(&mut self.typical);
        order.clear();
        order.extend(
            self.v
                .iter()
                .zip(scratch.iter())
                .map(|(&c, &q)| ((-q.ln() - h).abs(), q, c)),
        );
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(desc(&a.2, &b.2)));
        let mut cum = 0.0;
        let mut keep = order.len();
        for (i, &(_, q, _)) in order.iter().enumerate() {
            cum += q;
            if cum >= p as f64 {
                keep = i + 1;
                break;
            }
        }
        self.v.clear();
        self.v.extend(order[..keep].iter().map(|x| x.2));
        self.v.sort_unstable_by(desc);
        self.sorted = self.v.len();
        self.typical = order;
    }

    /// Pick one candidate with probability proportional to `exp(logit)`, given `u` uniform in
    /// [0, 1). Scans in list order (descending when a stage sorted it, so it usually stops
    /// early). Returns the index into `v`.
    pub fn pick(&mut self, u: f64) -> usize {
        debug_assert!(!self.v.is_empty());
        let m = self.max_logit();
        let total = self.sum_exp(m);
        let target = u * total;
        let mut cum = 0.0;
        let mut last_nonzero = 0;
        for (i, c) in self.v.iter().enumerate() {
            let w = exp_approx(c.logit - m) as f64;
            if w > 0.0 {
                last_nonzero = i;
            }
            cum += w;
            if cum > target {
                return i;
            }
        }
        last_nonzero // u * total rounded up to the full sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Candidates {
        let mut c = Candidates::default();
        c.fill_top_k(logits, 0);
        c
    }

    fn ids(c: &Candidates) -> Vec<TokenId> {
        let mut v: Vec<TokenId> = c.v.iter().map(|c| c.id).collect();
        v.sort_unstable();
        v
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn fill_top_k_matches_full_sort() {
        // A pseudo-random vocab of 10k with ties and -inf, against a full sort.
        let mut r = super::super::rng::Rng::new(3);
        let logits: Vec<f32> = (0..10_000)
            .map(|_| {
                let u = r.next_f64();
                if u < 0.05 {
                    f32::NEG_INFINITY
                } else {
                    (u * 50.0).floor() as f32 // many ties
                }
            })
            .collect();
        for k in [1, 5, 40, 100, 9_000, 10_000, 20_000] {
            let mut c = Candidates::default();
            let finite = c.fill_top_k(&logits, k);
            let mut all: Vec<Candidate> = logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| Candidate {
                    id: i as TokenId,
                    logit: l,
                })
                .collect();
            assert_eq!(finite, all.len());
            all.sort_by(desc);
            all.truncate(k);
            c.sort_prefix(c.len());
            assert_eq!(c.v, all, "k = {k}");
        }
    }

    #[test]
    fn top_k_edge_cases() {
        let mut c = cands(&[1.0, 4.0, 2.0, 3.0]);
        c.top_k(2);
        assert_eq!(ids(&c), vec![1, 3]);
        let mut c = cands(&[1.0, 4.0]);
        c.top_k(10); // k larger than the vocab: keep all
        assert_eq!(c.len(), 2);
        let mut c = cands(&[0.0; 5]); // all equal: lowest ids
        c.top_k(2);
        assert_eq!(ids(&c), vec![0, 1]);
        let mut c = cands(&[f32::NEG_INFINITY, 1.0, f32::NEG_INFINITY]);
        assert_eq!(c.len(), 1); // -inf logits are never candidates
        c.top_k(1);
        assert_eq!(ids(&c), vec![1]);
    }

    #[test]
    fn temperature_scales_probabilities() {
        let logits = [1.0f32, 2.0, 3.0];
        let mut c = cands(&logits);
        c.temperature(0.5);
        let mut p = vec![];
        c.probs(&mut p);
        let z: f64 = logits.iter().map(|&l| (l as f64 / 0.5).exp()).sum();
        for (i, &l) in logits.iter().enumerate() {
            assert!(close(p[i], (l as f64 / 0.5).exp() / z));
        }
        // Temperature -> 0: all the mass on the argmax, no NaN.
        let mut c = cands(&[1e30, 1.0, 0.999_999]);
        c.temperature(1e-30);
        c.probs(&mut p);
        assert_eq!(c.len(), 1);
        assert_eq!(c.v[0].id, 0);
        assert_eq!(p, vec![1.0]);
        // Equal logits stay uniform at any temperature.
        let mut c = cands(&[2.0; 4]);
        c.temperature(1e-6);
        c.probs(&mut p);
        assert!(p.iter().all(|&q| close(q, 0.25)));
    }

    #[test]
    fn top_p_smallest_set_reaching_p() {
        // probs 0.5, 0.25, 0.125, 0.125 (logits = ln p)
        let logits: Vec<f32> = [0.5f32, 0.25, 0.125, 0.125]
            .iter()
            .map(|p| p.ln())
            .collect();
        let mut c = cands(&logits);
        c.top_p(0.5); // exactly reaches 0.5 with one token
        assert_eq!(ids(&c), vec![0]);
        let mut c = cands(&logits);
        c.top_p(0.6);
        assert_eq!(ids(&c), vec![0, 1]);
        let mut c = cands(&logits);
        c.top_p(0.8);
        assert_eq!(ids(&c), vec![0, 1, 2]); // tie at 0.125: lower id first
        let mut c = cands(&logits);
        c.top_p(1.0);
        assert_eq!(c.len(), 4);
        let mut c = cands(&logits);
        c.top_p(1e-9); // always at least one token
        assert_eq!(ids(&c), vec![0]);
        let mut c = cands(&[7.0]); // single token
        c.top_p(0.1);
        assert_eq!(ids(&c), vec![7 - 7]);
        let mut c = cands(&[0.0; 4]); // all equal: 0.5 needs two of them
        c.top_p(0.5);
        assert_eq!(ids(&c), vec![0, 1]);
    }

    #[test]
    fn top_p_over_large_unsorted_vocab() {
        // 5000 tokens: one with most of the mass, a long flat tail; forces prefix growth.
        let mut logits = vec![0.0f32; 5000];
        logits[1234] = 10.0;
        let mut c = cands(&logits);
        // p(1234) = e^10 / (e^10 + 4999) ≈ 0.815; p = 0.9 needs the head plus
        // ceil((0.9 - p_head) * Z) tail tokens (tail weight 1 each).
        let z = 10f64.exp() + 4999.0;
        let need_tail = ((0.9 * z - 10f64.exp()).ceil()) as usize;
        c.top_p(0.9);
        assert_eq!(c.len(), 1 + need_tail);
        assert!(c.v.iter().any(|x| x.id == 1234));
        // tail tokens kept are the lowest ids (ties)
        let mut tail: Vec<TokenId> = c.v.iter().map(|x| x.id).filter(|&i| i != 1234).collect();
        tail.sort_unstable();
        let want: Vec<TokenId> = (0..).filter(|&i| i != 1234).take(need_tail).collect();
        assert_eq!(tail, want);
    }

    #[test]
    fn min_p_threshold_relative_to_max() {
        // probs 0.5, 0.25, 0.125, 0.125; min_p 0.25 -> threshold 0.125 (inclusive)
        let logits: Vec<f32> = [0.5f32, 0.25, 0.125, 0.125]
            .iter()
            .map(|p| p.ln())
            .collect();
        let mut c = cands(&logits);
        c.min_p(0.25);
        assert_eq!(c.len(), 4);
        let mut c = cands(&logits);
        c.min_p(0.3);
        assert_eq!(ids(&c), vec![0, 1]);
        let mut c = cands(&logits);
        c.min_p(1.0);
        assert_eq!(ids(&c), vec![0]);
        let mut c = cands(&logits);
        c.min_p(0.0);
        assert_eq!(c.len(), 4);
        let mut c = cands(&[1.0; 3]);
        c.min_p(1.0); // all equal: all are the max
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn min_p_keeps_sorted_prefix_valid() {
        let mut c = cands(&[5.0, 1.0, 4.0, 3.0, 2.0]);
        c.sort_prefix(3); // 5, 4, 3 sorted
        c.min_p((3.5f32 - 5.0).exp());
        assert_eq!(ids(&c), vec![0, 2]);
        assert_eq!(c.sorted, 2);
    }

    #[test]
    fn typical_p_by_distance_from_entropy() {
        let probs = [0.4f64, 0.3, 0.2, 0.1];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let h: f64 = -probs.iter().map(|p| p * p.ln()).sum::<f64>();
        let mut order: Vec<usize> = (0..4).collect();
        order.sort_by(|&a, &b| {
            let da = (-probs[a].ln() - h).abs();
            let db = (-probs[b].ln() - h).abs();
            da.total_cmp(&db)
        });
        // H ≈ 1.2799; surprises 0.916, 1.204, 1.609, 2.303: distances 0.364, 0.076, 0.329,
        // 1.023 -> order 1, 2, 0, 3
        assert_eq!(order, vec![1, 2, 0, 3]);
        let mut s = vec![];
        let mut c = cands(&logits);
        c.typical_p(0.45, &mut s); // 0.3 < 0.45, 0.3 + 0.2 >= 0.45
        assert_eq!(ids(&c), vec![1, 2]);
        let mut c = cands(&logits);
        c.typical_p(0.85, &mut s); // 0.5 < 0.85 <= 0.9
        assert_eq!(ids(&c), vec![0, 1, 2]);
        let mut c = cands(&logits);
        c.typical_p(0.25, &mut s);
        assert_eq!(ids(&c), vec![1]); // the most typical token, not the most likely
        let mut c = cands(&logits);
        c.typical_p(0.95, &mut s);
        assert_eq!(ids(&c), vec![0, 1, 2, 3]);
        let mut c = cands(&logits);
        c.typical_p(1.0, &mut s);
        assert_eq!(c.len(), 4);
        // all equal: every token equally typical, ties by id.
        let mut c = cands(&[0.0; 4]);
        c.typical_p(0.5, &mut s);
        assert_eq!(ids(&c), vec![0, 1]);
    }

    #[test]
    fn pick_follows_cumulative_mass() {
        let logits: Vec<f32> = [0.5f32, 0.25, 0.25].iter().map(|p| p.ln()).collect();
        let mut c = cands(&logits);
        let i = c.pick(0.0);
        assert_eq!(c.v[i].id, 0);
        let i = c.pick(0.49);
        assert_eq!(c.v[i].id, 0);
        let i = c.pick(0.51);
        assert_eq!(c.v[i].id, 1);
        let i = c.pick(0.76);
        assert_eq!(c.v[i].id, 2);
        let i = c.pick(0.999_999_999);
        assert_eq!(c.v[i].id, 2);
    }
}
