//! Prompt lookup (Saxena 2023; vLLM's `ngram` method): the sequence's last n tokens are looked
//! up earlier in the sequence (the prompt and the output so far), and the tokens that followed
//! the occurrence are proposed. Code edits, quotes and summaries copy long runs of their
//! prompt, which this proposes right; it needs no second model.
//!
//! Of the earlier occurrences the one that matches the longest suffix wins (up to `max_n`
//! tokens; the most recent among equals). Short n-grams recur in code with different
//! continuations: in a rename, `self.cur` is followed by `_line` in the prompt and by
//! `rent_line` in the answer, and only a match reaching back past the previous line tells
//! which copy the answer is in (`scripts/bench_speculation.py`, the rename of `cur_line`: 339
//! of 379 proposed tokens accepted with matches of at most four tokens, 353 of 353 with up to
//! 32).

use super::Proposer;
use crate::model::ModelError;
use crate::tokenizer::TokenId;

/// Looks up the longest suffix of at least `min_n` and at most `max_n` tokens.
#[derive(Clone, Copy, Debug)]
pub struct NgramProposer {
    pub min_n: usize,
    pub max_n: usize,
}

impl Default for NgramProposer {
    fn default() -> Self {
        // A single token matches too often to be worth a proposal.
        NgramProposer {
            min_n: 2,
            max_n: 32,
        }
    }
}

impl NgramProposer {
    /// The continuation, at most `max` tokens, of the earlier occurrence that shares the
    /// longest suffix with `context` (capped at `max_n`; the most recent among equals), if that
    /// suffix has at least `min_n` tokens.
    pub fn lookup(&self, context: &[TokenId], max: usize) -> Vec<TokenId> {
        let len = context.len();
        let (min_n, max_n) = (self.min_n.max(1), self.max_n.max(self.min_n.max(1)));
        let Some(&last) = context.last() else {
            return Vec::new();
        };
        // (shared suffix length, where the continuation starts)
        let mut best = (0, 0);
        // An occurrence ends at `end` (< len - 1: something follows it), newest first. Each
        // comparison stops at `max_n` tokens, so the scan is at most max_n · len steps.
        for end in (0..len.saturating_sub(1)).rev() {
            if context[end] != last {
                continue;
            }
            let reach = max_n.min(end + 1);
            let shared = 1
                + (1..reach)
                    .take_while(|&j| context[end - j] == context[len - 1 - j])
                    .count();
            if shared > best.0 {
                best = (shared, end + 1);
                if shared == max_n {
                    break;
                }
            }
        }
        let (shared, start) = best;
        if shared < min_n {
            return Vec::new();
        }
        context[start..(start + max).min(len)].to_vec()
    }
}

impl Proposer for NgramProposer {
    fn propose(&mut self, context: &[TokenId], max: usize) -> Result<Vec<TokenId>, ModelError> {
        Ok(self.lookup(context, max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, directly: every earlier occurrence of every suffix length.
    fn lookup_by_definition(p: &NgramProposer, context: &[TokenId], max: usize) -> Vec<TokenId> {
        let len = context.len();
        for n in (p.min_n.max(1)..=p.max_n).rev() {
            if len <= n {
                continue;
            }
            let tail = &context[len - n..];
            if let Some(i) = (0..len - n).rev().find(|&i| &context[i..i + n] == tail) {
                let start = i + n;
                return context[start..(start + max).min(len)].to_vec();
            }
        }
        Vec::new()
    }

    #[test]
    fn proposes_what_followed_the_longest_recent_match() {
        let p = NgramProposer::default();
        // "1 2 3 4 5 ... 1 2 3" → the 3-gram [1 2 3] was followed by 4 5 6.
        let ctx = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3];
        assert_eq!(p.lookup(&ctx, 3), [4, 5, 6]);
        assert_eq!(p.lookup(&ctx, 10), [4, 5, 6, 9, 9, 1, 2, 3]);
        // The most recent occurrence wins: [7 8] was followed by 1, then by 2.
        let ctx = [7, 8, 1, 0, 7, 8, 2, 0, 7, 8];
        assert_eq!(p.lookup(&ctx, 1), [2]);
        // A longer match beats a more recent shorter one: [5 7 8] → 3.
        let ctx = [5, 7, 8, 3, 0, 7, 8, 2, 0, 5, 7, 8];
        assert_eq!(p.lookup(&ctx, 1), [3]);
        // No 2-gram repeats: nothing.
        assert!(p.lookup(&[1, 2, 3, 4, 1], 4).is_empty());
        assert!(p.lookup(&[], 4).is_empty());
        assert!(
            p.lookup(&[1, 1], 4).is_empty(),
            "too short for a 2-gram and its follower"
        );
        // A run: [1 1] occurs earlier, followed by 1.
        assert_eq!(p.lookup(&[1, 1, 1], 4), [1]);
    }

    #[test]
    fn a_match_reaching_past_four_tokens_picks_the_copy() {
        // Two copies of a line that differ after "a b c d": the older one (…x a b c d → 1) and a
        // newer one (…y a b c d → 2). The context ends "x a b c d": the older one shares five.
        let ctx = [
            9, 8, 7, 6, 5, 0, 1, 2, 3, 4, 1, 5, 0, 1, 2, 3, 4, 2, 9, 8, 7, 6, 5, 0, 1, 2, 3, 4,
        ];
        assert_eq!(NgramProposer::default().lookup(&ctx, 2), [1, 5]);
        // Capped at four tokens, the newer copy wins the tie.
        let four = NgramProposer { min_n: 2, max_n: 4 };
        assert_eq!(four.lookup(&ctx, 2), [2, 9]);
    }

    #[test]
    fn the_scan_agrees_with_the_definition() {
        // Short alphabets make many repeats; every prefix of every sequence is a context.
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m) as TokenId
        };
        for (min_n, max_n) in [(2, 32), (1, 3), (2, 4), (3, 3)] {
            let p = NgramProposer { min_n, max_n };
            for alphabet in [2, 3, 5] {
                let seq: Vec<TokenId> = (0..120).map(|_| next(alphabet)).collect();
                for len in 0..=seq.len() {
                    for max in [1, 5, 16] {
                        assert_eq!(
                            p.lookup(&seq[..len], max),
                            lookup_by_definition(&p, &seq[..len], max),
                            "min {min_n} max {max_n} alphabet {alphabet} len {len} max {max}"
                        );
                    }
                }
            }
        }
    }
}
