//! Prompt lookup (Saxena 2023; vLLM's `ngram` method): the sequence's last n tokens are looked
//! up earlier in the sequence (the prompt and the output so far), and the tokens that followed
//! their most recent earlier occurrence are proposed. Code edits, quotes and summaries copy
//! long runs of their prompt, which this proposes right; it needs no second model.

use super::Proposer;
use crate::model::ModelError;
use crate::tokenizer::TokenId;

/// Looks up the longest n-gram first, from `max_n` down to `min_n` tokens.
#[derive(Clone, Copy, Debug)]
pub struct NgramProposer {
    pub min_n: usize,
    pub max_n: usize,
}

impl Default for NgramProposer {
    fn default() -> Self {
        // A single token matches too often to be worth a proposal.
        NgramProposer { min_n: 2, max_n: 4 }
    }
}

impl NgramProposer {
    /// The continuation of the most recent earlier occurrence of `context`'s longest
    /// matching suffix n-gram, at most `max` tokens.
    pub fn lookup(&self, context: &[TokenId], max: usize) -> Vec<TokenId> {
        let len = context.len();
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if len <= n {
                continue;
            }
            let tail = &context[len - n..];
            // Occurrences that end before the tail starts to leave something to propose.
            if let Some(i) = (0..len - n).rev().find(|&i| &context[i..i + n] == tail) {
                let start = i + n;
                return context[start..(start + max).min(len)].to_vec();
            }
        }
        Vec::new()
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
}
