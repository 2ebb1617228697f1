//! The sampler chain from top-n-σ to the pick (temperature > 0): the truncations, XTC and
//! (dynamic) temperature in the request's order (llama.cpp's by default, see [`super::order`]),
//! or mirostat in their place.

use super::order::ChainStage;
use super::{community, count_finite, Sampler, SamplingError, Stage, TokenId};

impl Sampler {
    /// Temperature > 0: the stages after penalties and DRY in [`super::SamplingParams::order`]
    /// (llama.cpp's: top-n-σ, top-k, typical-p, top-p, min-p, XTC, temperature), then the
    /// pick. Stages left out of the order are skipped. The candidate list is filled at the
    /// first stage that needs it, from the top-k in one pass when that stage is top-k; top-n-σ
    /// before it works on the logits themselves.
    pub(super) fn pick_truncated(
        &mut self,
        logits: &mut [f32],
        stages: &mut Vec<(Stage, usize)>,
    ) -> Result<(TokenId, f32, f32), SamplingError> {
        let explain = self.explain;
        let (top_k, sigma_on) = (self.params.top_k, self.params.community.top_n_sigma_on());
        let sigma = self.params.community.top_n_sigma;
        if explain {
            stages.push((Stage::Penalties, count_finite(logits)));
        }
        let mut filled = false;
        for at in 0..self.params.order().len() {
            let stage = self.params.order()[at];
            if matches!(stage, ChainStage::Penalties | ChainStage::Dry) {
                continue; // applied to the logits already (see `sample`)
            }
            if !filled {
                match stage {
                    ChainStage::TopNSigma => {
                        if sigma_on {
                            let left = community::top_n_sigma(logits, sigma);
                            if explain {
                                stages.push((Stage::TopNSigma, left));
                            }
                        }
                        continue;
                    }
                    ChainStage::TopK => {
                        self.cands.fill_top_k(logits, top_k);
                        filled = true;
                        if explain {
                            stages.push((Stage::TopK, self.cands.len()));
                        }
                        continue;
                    }
                    _ => {
                        self.cands.fill_top_k(logits, 0);
                        filled = true;
                    }
                }
            }
            let shown = self.apply_stage(stage)?;
            if let (true, Some(st)) = (explain, shown) {
                stages.push((st, self.cands.len()));
            }
        }
        if !filled {
            self.cands.fill_top_k(logits, 0);
        }
        if self.cands.is_empty() {
            return Err(SamplingError::NoCandidates);
        }
        let i = self.cands.pick(self.rng.next_f64());
        Ok(self.picked(i))
    }

    /// One stage of the chain on the candidates (filled); the stage to show, if it ran.
    fn apply_stage(&mut self, stage: ChainStage) -> Result<Option<Stage>, SamplingError> {
        let (p, c) = (&self.params, &mut self.cands);
        let cp = &p.community;
        Ok(match stage {
            ChainStage::Penalties | ChainStage::Dry => None,
            ChainStage::TopNSigma => cp.top_n_sigma_on().then(|| {
                c.top_n_sigma(cp.top_n_sigma);
                Stage::TopNSigma
            }),
            ChainStage::TopK => {
                c.top_k(p.top_k);
                Some(Stage::TopK)
            }
            ChainStage::TypicalP => {
                c.typical_p(p.typical_p, &mut self.probs);
                Some(Stage::TypicalP)
            }
            ChainStage::TopP => {
                c.top_p(p.top_p);
                Some(Stage::TopP)
            }
            ChainStage::MinP => {
                c.min_p(p.min_p);
                Some(Stage::MinP)
            }
            // XTC sees the distribution as it is at its place in the order.
            ChainStage::Xtc => (cp.xtc_on() && c.len() >= 2).then(|| {
                let coin = self.rng.next_f64();
                community::xtc(c, cp.xtc_probability, cp.xtc_threshold, 1.0, coin);
                Stage::Xtc
            }),
            // llama.cpp's `temp_ext`: dynamic when dynatemp_range > 0.
            ChainStage::Temperature if cp.dynatemp_on() => {
                let (t, r, e) = (p.temperature, cp.dynatemp_range, cp.dynatemp_exponent);
                community::dynatemp(c, t, r, e, &mut self.probs);
                Some(Stage::DynaTemp)
            }
            ChainStage::Temperature => {
                c.temperature(p.temperature);
                Some(Stage::Temperature)
            }
            ChainStage::Infill => {
                let vocab = self.infill.as_ref().ok_or(SamplingError::InvalidParam {
                    name: "samplers",
                    reason: "the infill sampler needs the vocabulary: build the sampler \
                             with Sampler::for_tokenizer"
                        .into(),
                })?;
                super::infill::infill(c, vocab, &mut self.probs);
                Some(Stage::Infill)
            }
        })
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
