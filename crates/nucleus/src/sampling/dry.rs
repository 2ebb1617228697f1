//! DRY, "don't repeat yourself" (by pi6am, in koboldcpp and llama.cpp's `dry` sampler): a
//! token that would extend a repeat of the context is penalised, more the longer the repeat.
//!
//! Over the last `last_n` tokens of the context: for each earlier position whose preceding
//! tokens match the context's end for `n` tokens (`n` = the longest such match ending there,
//! capped at the distance back to the last sequence breaker), the token that followed would make
//! the repeat `n + 1` long. Every token whose longest such `n` reaches `allowed_length` loses
//! `multiplier · base^(n − allowed_length)` from its logit (the exponent clamped so the power
//! stays finite). Sequence breakers are strings: a token containing one is a single-token
//! breaker (never penalised); a token ending with the start of one, followed by the tokens of
//! its rest, is a multi-token breaker, as llama.cpp's `get_overlapping_token_sequences` builds
//! them.

use std::collections::HashMap;

use super::{SamplingError, TokenId};
use crate::tokenizer::Tokenizer;

/// llama.cpp's limits: breakers are cut to 40 bytes and their tails to 20 tokens.
const MAX_CHAR_LEN: usize = 40;
const MAX_SEQ_LEN: usize = 20;

/// Sequence breakers as token sequences: a head token and the tails that complete a breaker
/// after it (an empty tail: the head alone is a breaker).
#[derive(Clone, Debug, Default)]
pub struct Breakers {
    map: HashMap<TokenId, Vec<Vec<TokenId>>>,
}

impl Breakers {
    /// From explicit `(head, tail)` sequences.
    pub fn from_sequences(seqs: &[(TokenId, Vec<TokenId>)]) -> Breakers {
        let mut b = Breakers::default();
        for (h, t) in seqs {
            b.add(*h, t.clone());
        }
        b
    }

    fn add(&mut self, head: TokenId, tail: Vec<TokenId>) {
        let tails = self.map.entry(head).or_default();
        if !tails.contains(&tail) {
            tails.push(tail);
        }
    }

    /// The breakers `strings` over `tok`'s vocabulary (a scan of every token's text).
    pub fn for_tokenizer(tok: &Tokenizer, strings: &[String]) -> Result<Breakers, SamplingError> {
        let mut b = Breakers::default();
        for s in strings {
            let s = &s.as_bytes()[..s.len().min(MAX_CHAR_LEN)];
            if s.is_empty() {
                continue;
            }
            for id in 0..tok.vocab_size() as TokenId {
                b.add_overlaps(tok, id, s)?;
            }
        }
        Ok(b)
    }

    /// `word` (token `id`'s text) contains `s`: a single-token breaker; or a suffix of `word`
    /// is a prefix of `s`: `id` followed by the tokens of the rest of `s`.
    fn add_overlaps(
        &mut self,
        tok: &Tokenizer,
        id: TokenId,
        s: &[u8],
    ) -> Result<(), SamplingError> {
        let word = tok.piece(id, false);
        if word.windows(s.len()).any(|w| w == s) {
            self.add(id, Vec::new());
            return Ok(());
        }
        for pos in (0..word.len()).filter(|&p| word[p] == s[0]) {
            let overlap = word.len() - pos;
            if overlap < s.len() && word[pos..] == s[..overlap] {
                // A rest that starts inside a UTF-8 character has no tokenization of its own.
                let Ok(rest) = std::str::from_utf8(&s[overlap..]) else {
                    continue;
                };
                let mut tail =
                    tok.encode(rest, false, false)
                        .map_err(|e| SamplingError::InvalidParam {
                            name: "dry_sequence_breakers",
                            reason: e.to_string(),
                        })?;
                tail.truncate(MAX_SEQ_LEN);
                self.add(id, tail);
            }
        }
        Ok(())
    }

    fn is_single_token(&self, t: TokenId) -> bool {
        self.map
            .get(&t)
            .is_some_and(|ts| ts.iter().any(Vec::is_empty))
    }

    /// Length of the longest breaker that ends `i` tokens before the end of `w`, where
    /// `rat(i) = w[len − 1 − i]` is its head (the tail runs towards the end); `None` if none.
    fn longest_at(&self, w: &[TokenId], i: usize) -> Option<usize> {
        let rat = |j: usize| w[w.len() - 1 - j];
        let tails = self.map.get(&rat(i))?;
        tails
            .iter()
            .filter(|t| t.len() <= i && t.iter().enumerate().all(|(o, &x)| x == rat(i - o - 1)))
            .map(Vec::len)
            .max()
    }
}

/// DRY's settings.
#[derive(Clone, Copy, Debug)]
pub struct DrySettings {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
    pub last_n: usize,
}

/// Z-array of `r`: `z[k]` = length of the longest common prefix of `r` and `r[k..]` (`z[0]`
/// unused). Linear time.
fn z_array(r: &[TokenId], z: &mut Vec<usize>) {
    let n = r.len();
    z.clear();
    z.resize(n, 0);
    let (mut l, mut rt) = (0usize, 0usize); // the rightmost Z-box [l, rt)
    for k in 1..n {
        let mut len = if k < rt { z[k - l].min(rt - k) } else { 0 };
        while k + len < n && r[len] == r[k + len] {
            len += 1;
        }
        z[k] = len;
        if k + len > rt {
            (l, rt) = (k, k + len);
        }
    }
}

/// Applies DRY to `logits` given the `context` (prompt and output so far). `scratch` buffers
/// are reused between calls. Returns how many tokens were penalised.
pub fn apply_dry(
    logits: &mut [f32],
    context: &[TokenId],
    s: &DrySettings,
    breakers: &Breakers,
    scratch: &mut (Vec<TokenId>, Vec<usize>, Vec<(TokenId, usize)>),
) -> usize {
    if s.multiplier == 0.0 || s.base < 1.0 || s.last_n == 0 {
        return 0;
    }
    let w = &context[context.len().saturating_sub(s.last_n)..];
    let n = w.len();
    if n <= s.allowed_length {
        return 0;
    }
    // Step 1: the nearest breaker from the end caps how long a repeat can be.
    let rep_limit = (0..n)
        .find_map(|i| breakers.longest_at(w, i).map(|len| i - len))
        .unwrap_or(n);
    if rep_limit < s.allowed_length {
        return 0;
    }
    // Step 2: on the reversed window, z[k] is how many tokens ending at w[n-1-k] match the end.
    let (rev, z, found) = scratch;
    rev.clear();
    rev.extend(w.iter().rev());
    z_array(rev, z);
    // Step 3: the token after each such position would extend its repeat.
    found.clear();
    for k in 1..n {
        let len = z[k].min(rep_limit);
        if len >= s.allowed_length {
            found.push((w[n - k], len));
        }
    }
    found.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    found.dedup_by_key(|x| x.0);
    // Step 4: the penalty, with the exponent clamped below ln(f32::MAX) / ln(base).
    let max_exp = if s.base > 1.000001 {
        (88.722_84 / s.base.ln()) as usize
    } else {
        0
    };
    let mut hit = 0;
    for &(t, len) in found.iter() {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if breakers.is_single_token(t) {
            continue;
        }
        let mut e = len - s.allowed_length;
        if max_exp > 0 {
            e = e.min(max_exp);
        }
        *l -= s.multiplier * s.base.powi(e as i32);
        hit += 1;
    }
    hit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ctx: &[TokenId], s: &DrySettings, b: &Breakers) -> Vec<f32> {
        let mut l = vec![0.0f32; 10];
        apply_dry(&mut l, ctx, s, b, &mut Default::default());
        l
    }

    const S: DrySettings = DrySettings {
        multiplier: 0.8,
        base: 1.75,
        allowed_length: 2,
        last_n: 64,
    };

    #[test]
    fn z_array_by_hand() {
        // "aabxaab": z = [_, 1, 0, 0, 3, 1, 0]
        let mut z = vec![];
        z_array(&[1, 1, 2, 9, 1, 1, 2], &mut z);
        assert_eq!(&z[1..], &[1, 0, 0, 3, 1, 0]);
    }

    /// llama.cpp's own worked example (llama-sampler.cpp, step 2-3 comments): context
    /// `a b c c b c y a b c`; repeat counts `0 0 3 1 0 2 0 0 0 0`, so with allowed length 2:
    /// `c` (after `a b c`, n = 3) gets 0.8 · 1.75^(3−2) = 1.4, `y` (after `b c`, n = 2) gets
    /// 0.8 · 1.75^0 = 0.8, `b` (n = 1) nothing.
    #[test]
    fn penalties_of_llama_cpp_example() {
        let (a, b, c, y) = (1, 2, 3, 4);
        let l = run(&[a, b, c, c, b, c, y, a, b, c], &S, &Breakers::default());
        assert!((l[c as usize] + 1.4).abs() < 1e-6, "{l:?}");
        assert!((l[y as usize] + 0.8).abs() < 1e-6, "{l:?}");
        assert_eq!(l[b as usize], 0.0);
        assert_eq!(l.iter().filter(|x| **x != 0.0).count(), 2);
    }

    #[test]
    fn breakers_cap_repeats_and_are_never_penalised() {
        let (a, b, c, y, nl) = (1, 2, 3, 4, 5);
        // A single-token breaker 2 tokens from the end: repeats are capped at 2 tokens, so `c`
        // (n = 3 → 2) gets 0.8 and `y` (n = 2) gets 0.8.
        let ctx = [a, b, c, c, b, c, y, nl, b, c];
        let br = Breakers::from_sequences(&[(nl, vec![])]);
        let l = run(&ctx, &S, &br);
        assert_eq!(l[nl as usize], 0.0);
        // Without the breaker `a b c` vs `nl b c`: only `b c` repeats, n = 2 for `y` and `c`.
        let l0 = run(&ctx, &S, &Breakers::default());
        assert_eq!(l, l0);
        // A breaker as the last token: no repeat can span it, nothing is penalised.
        let l = run(&[a, b, a, b, nl], &S, &br);
        assert!(l.iter().all(|x| *x == 0.0));
        // A repeat that would continue into a breaker token: the breaker is not penalised.
        let l = run(&[a, b, nl, a, b], &S, &br);
        assert!(l.iter().all(|x| *x == 0.0), "{l:?}");
        // A two-token breaker (head `a`, tail [b]) at the end caps the repeat at 0.
        let br2 = Breakers::from_sequences(&[(a, vec![b])]);
        let l = run(&[c, a, b, c, a, b], &S, &br2);
        assert!(l.iter().all(|x| *x == 0.0), "{l:?}");
    }

    #[test]
    fn window_and_exponent_clamp() {
        // last_n = 3 sees only `1 2 3`: nothing repeats.
        let ctx = [1, 2, 3, 1, 2, 3];
        let l = run(&ctx, &DrySettings { last_n: 3, ..S }, &Breakers::default());
        assert!(l.iter().all(|x| *x == 0.0));
        // Whole window: `1` follows `1 2 3` (n = 3): 0.8 · 1.75.
        let l = run(&ctx, &S, &Breakers::default());
        assert!((l[1] + 1.4).abs() < 1e-6, "{l:?}");
        // A long repeat with a big base stays finite.
        let long: Vec<TokenId> = (0..200).map(|i| (i % 2) as TokenId).collect();
        let l = run(
            &long,
            &DrySettings {
                base: 8.0,
                last_n: 1000,
                ..S
            },
            &Breakers::default(),
        );
        assert!(l[0].is_finite() && l[0] < -1e30, "{l:?}");
    }
}
