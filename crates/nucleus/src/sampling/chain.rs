//! The sampler chain from top-n-σ to the pick (temperature > 0): the truncations, XTC and
//! dynamic temperature in llama.cpp's order, or mirostat in their place.

use super::{community, count_finite, Sampler, SamplingError, Stage, TokenId};

impl Sampler {
    /// Temperature > 0, llama.cpp's chain: top-n-σ, top-k, (temperature), top-p, min-p,
    /// typical-p, XTC, dynamic temperature, the pick. Without dynamic temperature the
    /// temperature is applied right after top-k (see the module's note on the order).
    pub(super) fn pick_truncated(
        &mut self,
        logits: &mut [f32],
        stages: &mut Vec<(Stage, usize)>,
    ) -> Result<(TokenId, f32, f32), SamplingError> {
        let (p, cp) = (&self.params, &self.params.community);
        let explain = self.explain;
        if cp.top_n_sigma_on() {
            if explain {
                stages.push((Stage::Penalties, count_finite(logits)));
            }
            let left = community::top_n_sigma(logits, cp.top_n_sigma);
            if explain {
                stages.push((Stage::TopNSigma, left));
            }
        }
        let c = &mut self.cands;
        // Top-k first: it commutes with temperature and shrinks the work for the rest.
        let finite = c.fill_top_k(logits, p.top_k);
        if c.is_empty() {
            return Err(SamplingError::NoCandidates);
        }
        let t_early = if cp.dynatemp_on() { 1.0 } else { p.temperature };
        c.temperature(t_early);
        let after_k = c.len();
        c.top_p(p.top_p);
        let after_p = c.len();
        c.min_p(p.min_p);
        let after_min_p = c.len();
        c.typical_p(p.typical_p, &mut self.probs);
        if explain {
            if !cp.top_n_sigma_on() {
                stages.push((Stage::Penalties, finite));
            }
            if !cp.dynatemp_on() {
                stages.push((Stage::Temperature, finite));
            }
            stages.push((Stage::TopK, after_k));
            stages.push((Stage::TopP, after_p));
            stages.push((Stage::MinP, after_min_p));
            stages.push((Stage::TypicalP, c.len()));
        }
        if cp.xtc_on() && c.len() >= 2 {
            let coin = self.rng.next_f64();
            community::xtc(c, cp.xtc_probability, cp.xtc_threshold, t_early, coin);
            if explain {
                stages.push((Stage::Xtc, c.len()));
            }
        }
        if cp.dynatemp_on() {
            let (t, r, e) = (p.temperature, cp.dynatemp_range, cp.dynatemp_exponent);
            community::dynatemp(c, t, r, e, &mut self.probs);
            if explain {
                stages.push((Stage::DynaTemp, c.len()));
            }
        }
        let i = c.pick(self.rng.next_f64());
        Ok(self.picked(i))
    }

    /// Mirostat (llama.cpp: temperature, then mirostat in place of the truncations).
    pub(super) fn pick_mirostat(
        &mut self,
        logits: &mut [f32],
        stages: &mut Vec<(Stage, usize)>,
    ) -> Result<(TokenId, f32, f32), SamplingError> {
        let c = &mut self.cands;
        let finite = c.fill_top_k(logits, 0);
        if c.is_empty() {
            return Err(SamplingError::NoCandidates);
        }
        c.temperature(self.params.temperature);
        let m = self.mirostat.as_mut().expect("mirostat is on");
        let i = m.sample(c, logits.len(), self.rng.next_f64(), &mut self.probs);
        if self.explain {
            stages.push((Stage::Penalties, finite));
            stages.push((Stage::Temperature, finite));
            stages.push((Stage::Mirostat, c.len()));
        }
        Ok(self.picked(i))
    }

    /// The token at candidate `i`, with the entropy of the final distribution and its
    /// probability there when explain is on.
    fn picked(&mut self, i: usize) -> (TokenId, f32, f32) {
        let c = &self.cands;
        let token = c.v[i].id;
        let (mut h, mut q) = (0.0, 1.0);
        if self.explain {
            c.probs(&mut self.probs);
            h = -self
                .probs
                .iter()
                .filter(|&&x| x > 0.0)
                .map(|&x| x * x.ln())
                .sum::<f64>();
            q = self.probs[i];
        }
        (token, h as f32, q as f32)
    }

    /// Mirostat's current `mu` (its surprise budget), if it is on.
    pub fn mirostat_mu(&self) -> Option<f32> {
        self.mirostat.as_ref().map(|m| m.mu)
    }
}
