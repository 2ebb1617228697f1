//! The sparse stages of the sampler chain, each a small function with its formula in its
//! comment: they edit the full logits vector in place, touching only the few tokens they
//! concern (logit bias, penalties, n-gram ban), so they cost O(context), not O(vocab). The
//! truncation stages (top-k, top-p, min-p, typical-p) work on a shrinking list of candidates:
//! [`super::candidates`].
//!
//! Ties between equal logits are always broken by the lower token id, so every stage is a
//! deterministic function of its input.

use super::math;
use super::{SamplingError, TokenId};

pub fn apply_logit_bias(logits: &mut [f32], bias: &[(TokenId, f32)]) -> Result<(), SamplingError> {
    let vocab = logits.len();
    for &(t, b) in bias {
        let slot = logits
            .get_mut(t as usize)
            .ok_or(SamplingError::TokenOutOfRange { token: t, vocab })?;
        *slot += b;
    }
    Ok(())
}

/// Counts of each distinct token in `window`, as sorted `(token, count)` runs in `scratch`.
/// Sorting a copy of the (short) window is cheaper than hashing and needs no allocation after
/// the first call.
fn count_tokens(window: &[TokenId], scratch: &mut Vec<TokenId>, out: &mut Vec<(TokenId, u32)>) {
    scratch.clear();
    scratch.extend_from_slice(window);
    scratch.sort_unstable();
    out.clear();
    for &t in scratch.iter() {
        match out.last_mut() {
            Some((last, c)) if *last == t => *c += 1,
            _ => out.push((t, 1)),
        }
    }
}

/// Penalty settings, see [`apply_penalties`].
#[derive(Clone, Copy, Debug)]
pub struct Penalties {
    pub repeat: f32,
    pub last_n: usize,
    pub presence: f32,
    pub frequency: f32,
}

impl Penalties {
    pub fn is_off(&self) -> bool {
        self.last_n == 0 || (self.repeat == 1.0 && self.presence == 0.0 && self.frequency == 0.0)
    }
}

/// Repetition, presence and frequency penalties over the last `last_n` tokens of `context`
/// (`last_n == 0` turns them all off, `usize::MAX` means the whole context), in this order:
///
/// - repetition (CTRL / llama.cpp form), once per distinct token seen:
///   `logit > 0 ? logit / repeat : logit * repeat` — dividing a negative logit would *raise* it;
/// - presence and frequency (OpenAI form): `logit -= count * frequency + (count > 0) * presence`.
///
/// Tokens of the context outside the vocabulary are ignored.
pub fn apply_penalties(
    logits: &mut [f32],
    context: &[TokenId],
    p: &Penalties,
    scratch: &mut Vec<TokenId>,
    counts: &mut Vec<(TokenId, u32)>,
) {
    if p.is_off() {
        return;
    }
    let window = &context[context.len().saturating_sub(p.last_n)..];
    count_tokens(window, scratch, counts);
    for &(t, c) in counts.iter() {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if *l > 0.0 {
            *l /= p.repeat;
        } else {
            *l *= p.repeat;
        }
        *l -= c as f32 * p.frequency + p.presence;
    }
}

/// No-repeat-n-gram (Hugging Face semantics): ban every token that would complete an n-gram
/// already present anywhere in `context`. With `n == 1` every token seen is banned. The last
/// `n - 1` tokens are the prefix; each earlier occurrence of that prefix bans the token that
/// followed it.
pub fn ban_repeated_ngrams(logits: &mut [f32], context: &[TokenId], n: usize) {
    if n == 0 || context.len() + 1 < n {
        return;
    }
    let prefix = &context[context.len() + 1 - n..];
    // Windows of length n whose first n-1 tokens equal the prefix; the window's last token is
    // the one banned. The window ending at the last token of the context is excluded by
    // construction (it has only n-1 tokens after the start).
    for w in context.windows(n) {
        if &w[..n - 1] == prefix {
            if let Some(l) = logits.get_mut(w[n - 1] as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Index of the largest logit (lowest id among ties), or `None` if every logit is `-inf`.
pub fn argmax(logits: &[f32]) -> Option<usize> {
    math::argmax(logits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_bias_adds_and_checks_range() {
        let mut l = vec![1.0, 2.0, 3.0];
        apply_logit_bias(&mut l, &[(0, 0.5), (2, f32::NEG_INFINITY)]).unwrap();
        assert_eq!(l, vec![1.5, 2.0, f32::NEG_INFINITY]);
        let err = apply_logit_bias(&mut l, &[(3, 1.0)]).unwrap_err();
        assert!(matches!(
            err,
            SamplingError::TokenOutOfRange { token: 3, vocab: 3 }
        ));
    }

    #[test]
    fn repetition_penalty_divides_positive_multiplies_negative_once_per_token() {
        let mut l = vec![2.0, -2.0, 4.0, 1.0];
        let p = Penalties {
            repeat: 2.0,
            last_n: 64,
            presence: 0.0,
            frequency: 0.0,
        };
        let (mut s, mut c) = (vec![], vec![]);
        // token 0 appears twice: still penalised once.
        apply_penalties(&mut l, &[0, 1, 0, 99], &p, &mut s, &mut c);
        assert_eq!(l, vec![1.0, -4.0, 4.0, 1.0]);
    }

    #[test]
    fn penalties_window_and_presence_frequency() {
        let mut l = vec![0.0; 4];
        let p = Penalties {
            repeat: 1.0,
            last_n: 3,
            presence: 0.5,
            frequency: 0.25,
        };
        let (mut s, mut c) = (vec![], vec![]);
        // window = last 3 tokens = [1, 2, 2]; token 3 is outside it.
        apply_penalties(&mut l, &[3, 3, 1, 2, 2], &p, &mut s, &mut c);
        assert_eq!(l, vec![0.0, -0.75, -1.0, 0.0]);
        // last_n = 0 turns everything off.
        let mut l2 = vec![1.0; 4];
        let off = Penalties { last_n: 0, ..p };
        apply_penalties(&mut l2, &[1, 2], &off, &mut s, &mut c);
        assert_eq!(l2, vec![1.0; 4]);
    }

    #[test]
    fn no_repeat_ngram_bans_completions() {
        let inf = f32::NEG_INFINITY;
        // context 5 6 7 5 6 : bigram ban (n=2) with prefix [6] bans 7; trigram prefix [5,6] bans 7.
        let ctx = [5, 6, 7, 5, 6];
        let mut l = vec![0.0; 8];
        ban_repeated_ngrams(&mut l, &ctx, 3);
        assert_eq!(l[7], inf);
        assert_eq!(l.iter().filter(|x| x.is_infinite()).count(), 1);
        let mut l = vec![0.0; 8];
        ban_repeated_ngrams(&mut l, &ctx, 2);
        assert_eq!(l.iter().filter(|x| x.is_infinite()).count(), 1);
        assert_eq!(l[7], inf);
        // n = 1: everything seen is banned.
        let mut l = vec![0.0; 8];
        ban_repeated_ngrams(&mut l, &ctx, 1);
        let banned: Vec<usize> = (0..8).filter(|&i| l[i] == inf).collect();
        assert_eq!(banned, vec![5, 6, 7]);
        // context shorter than n-1: nothing to ban.
        let mut l = vec![0.0; 8];
        ban_repeated_ngrams(&mut l, &[1], 3);
        assert!(l.iter().all(|x| *x == 0.0));
        // prefix [7] never occurred before: nothing banned.
        let mut l = vec![0.0; 8];
        ban_repeated_ngrams(&mut l, &[1, 2, 7], 2);
        assert!(l.iter().all(|x| *x == 0.0));
    }

    #[test]
    fn argmax_lowest_id_on_ties_and_none_when_all_masked() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), None);
        assert_eq!(argmax(&[f32::NEG_INFINITY, -1e30]), Some(1));
    }
}
