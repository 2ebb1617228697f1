//! llama.cpp's `infill` sampler (`src/llama-sampler.cpp`, `llama_sampler_infill_apply`), which
//! editor plugins put in their `samplers` list for fill-in-the-middle. On the candidates'
//! probabilities `p` (softmax of their current logits):
//!
//! 1. if `3 · P(end) · n > P(text)` (end-of-generation tokens `P(end)` against the rest, over
//!    `n` candidates), keep only the end-of-generation tokens;
//! 2. otherwise, for every pair where one token's text is a prefix of the other's, the less
//!    likely one (the first on equal probability) gives its probability to the other and is
//!    dropped;
//! 3. keep the end-of-generation tokens and those with `p ≥ 0.2`; if no other is left, the
//!    answer ends: the end-of-turn token (else end-of-sequence) alone;
//! 4. renormalise, and keep the end-of-generation tokens and those with `p ≥ 1/(m + 1)`, `m`
//!    the text tokens left.
//!
//! The draw that follows uses the survivors' logits, as llama.cpp's `dist` does (it recomputes
//! the softmax from them): the merged probabilities only decide what survives.

use super::candidates::{Candidate, Candidates};
use super::TokenId;
use crate::tokenizer::Tokenizer;

/// What the stage needs of the vocabulary: each token's text (empty for control tokens, as
/// llama.cpp's `token_to_piece(special = false)`), whether it ends generation, and the token
/// that ends the answer when nothing else is left.
#[derive(Clone, Debug, Default)]
pub struct InfillVocab {
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    eog: Vec<bool>,
    end: TokenId,
}

impl InfillVocab {
    pub fn for_tokenizer(tok: &Tokenizer) -> Option<InfillVocab> {
        let n = tok.vocab_size();
        let mut v = InfillVocab {
            bytes: Vec::new(),
            offsets: Vec::with_capacity(n + 1),
            eog: Vec::with_capacity(n),
            end: tok.eot().or(tok.eos())?,
        };
        v.offsets.push(0);
        for id in 0..n as TokenId {
            v.bytes.extend_from_slice(tok.piece(id, true));
            v.offsets.push(v.bytes.len() as u32);
            v.eog.push(tok.is_eog(id));
        }
        Some(v)
    }

    /// A vocabulary from texts and end flags (for tests).
    pub fn from_pieces(pieces: &[(&str, bool)], end: TokenId) -> InfillVocab {
        let mut v = InfillVocab {
            end,
            offsets: vec![0],
            ..Default::default()
        };
        for (text, eog) in pieces {
            v.bytes.extend_from_slice(text.as_bytes());
            v.offsets.push(v.bytes.len() as u32);
            v.eog.push(*eog);
        }
        v
    }

    fn piece(&self, id: TokenId) -> &[u8] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.bytes[a as usize..b as usize],
            _ => &[],
        }
    }

    fn is_eog(&self, id: TokenId) -> bool {
        self.eog.get(id as usize).copied().unwrap_or(false)
    }
}

/// The stage (see the module's documentation); `p` is scratch.
pub fn infill(c: &mut Candidates, v: &InfillVocab, p: &mut Vec<f64>) {
    if c.is_empty() {
        return;
    }
    // llama.cpp sorts by probability first; the merges below depend on that order.
    c.sort_all();
    c.probs(p);
    let n = c.len();
    let eog: Vec<bool> = c.v.iter().map(|x| v.is_eog(x.id)).collect();
    let p_eog: f64 = (0..n).filter(|&i| eog[i]).map(|i| p[i]).sum();
    let p_txt: f64 = (0..n).filter(|&i| !eog[i]).map(|i| p[i]).sum();
    let mut alive: Vec<bool> = if 3.0 * p_eog * n as f64 > p_txt {
        eog.clone()
    } else {
        merge_prefixes(c, v, p);
        let alive: Vec<bool> = (0..n).map(|i| p[i] > 0.0 || eog[i]).collect();
        let keep1: Vec<bool> = (0..n)
            .map(|i| alive[i] && (eog[i] || p[i] >= 0.2))
            .collect();
        let n_text = (0..n).filter(|&i| keep1[i] && !eog[i]).count();
        if n_text == 0 {
            c.v.clear();
            c.v.push(Candidate {
                id: v.end,
                logit: 1.0,
            });
            c.mark_unsorted();
            return;
        }
        let sum: f64 = (0..n).filter(|&i| keep1[i]).map(|i| p[i]).sum();
        let thold = 1.0 / (n_text as f64 + 1.0);
        (0..n)
            .map(|i| keep1[i] && (eog[i] || p[i] / sum >= thold))
            .collect()
    };
    // A dropped token's probability went to another: it has none left to draw.
    for (i, a) in alive.iter_mut().enumerate() {
        *a = *a && p[i] > 0.0;
    }
    let mut i = 0;
    c.v.retain(|_| {
        i += 1;
        alive[i - 1]
    });
    c.mark_unsorted();
}

/// Step 2: a token whose text is a prefix of another's is merged with it, into the likelier.
fn merge_prefixes(c: &Candidates, v: &InfillVocab, p: &mut [f64]) {
    let n = c.len();
    let mut dead = vec![false; n];
    for i0 in 0..n {
        for i1 in 0..n {
            if dead[i0] {
                break;
            }
            if i0 == i1 || dead[i1] {
                continue;
            }
            let (a, b) = (v.piece(c.v[i0].id), v.piece(c.v[i1].id));
            if !a.is_empty() && b.starts_with(a) {
                let (dst, src) = if p[i1] > p[i0] { (i1, i0) } else { (i0, i1) };
                p[dst] += p[src];
                p[src] = 0.0;
                dead[src] = true;
            }
        }
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
        let mut v: Vec<TokenId> = c.v.iter().map(|x| x.id).collect();
        v.sort();
        v
    }

    fn probs(ps: &[f64]) -> Vec<f32> {
        ps.iter().map(|p| p.ln() as f32).collect()
    }

    #[test]
    fn prefixes_merge_into_the_likelier_then_thresholds() {
        // "re" (0.3) is a prefix of "return" (0.35): it merges into "return" (0.65);
        // " x" 0.25 and " y" 0.1 (tokens 2, 3); end token 4 at 0 chance (-inf: not a candidate).
        let v = InfillVocab::from_pieces(
            &[
                ("re", false),
                ("return", false),
                (" x", false),
                (" y", false),
                ("", true),
            ],
            4,
        );
        let mut c = cands(&probs(&[0.3, 0.35, 0.25, 0.1]));
        let mut p = Vec::new();
        infill(&mut c, &v, &mut p);
        // After the merge: return 0.65, x 0.25, y 0.1; >= 0.2 keeps return and x; renormalised
        // 0.722, 0.278 against 1/3: only "return".
        assert_eq!(ids(&c), vec![1]);
        // The survivors keep their logits (the draw uses them, as llama.cpp's dist).
        assert_eq!(c.v[0].logit, 0.35f64.ln() as f32);
    }

    #[test]
    fn a_likely_end_wins_and_nothing_left_ends() {
        let v = InfillVocab::from_pieces(&[("a", false), ("b", false), ("<eot>", true)], 2);
        // 3 · 0.2 · 3 = 1.8 > 0.8: only the end token.
        let mut c = cands(&probs(&[0.4, 0.4, 0.2]));
        let mut p = Vec::new();
        infill(&mut c, &v, &mut p);
        assert_eq!(ids(&c), vec![2]);
        // Ten text tokens of 0.099 and an end of 0.01 (3 · 0.01 · 11 = 0.33 < 0.99): none
        // reaches 0.2, so the answer ends with the end token alone.
        let mut pieces: Vec<(String, bool)> = (0..10).map(|i| (format!("t{i}x"), false)).collect();
        pieces.push((String::new(), true));
        let refs: Vec<(&str, bool)> = pieces.iter().map(|(s, e)| (s.as_str(), *e)).collect();
        let v = InfillVocab::from_pieces(&refs, 10);
        let mut ps = vec![0.099; 10];
        ps.push(0.01);
        let mut c = cands(&probs(&ps));
        infill(&mut c, &v, &mut p);
        assert_eq!(ids(&c), vec![10]);
    }
}
