//! Automatic prefix caching, vLLM's scheme: a full block is known by the hash of its tokens
//! chained with the hash of the blocks before it, so equal hashes mean equal prefixes. Full
//! blocks of finished sequences stay in the pool under their hash and are handed to the next
//! sequence whose prompt starts the same way; they are evicted least-recently-used, and only
//! when a block is needed and none is free.
//!
//! What goes into a hash is everything a block's keys and values depend on, so that a block
//! taken from the cache holds the same bits as the block the new sequence would compute: the
//! tokens of the prefix, and for each token the arithmetic it was computed with
//! ([`crate::model::arithmetic_class`]: the kernels llama.cpp would use for the token's place in
//! its prompt). Two prompts that share tokens but would compute them with different kernels
//! share no blocks, and the output of a request never depends on what was cached before it.
//!
//! The hash is SHA-256 of the parent's hash and the block's (token, class) pairs, cut to 128
//! bits: a collision (which would hand a sequence another prefix's keys) is not a practical
//! concern, as in vLLM's sha256 mode.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

use super::events::KvEvent;
use super::{BlockId, KvCache, KvError, SeqId, NO_BLOCK};
use crate::tokenizer::TokenId;

/// The identity of a full block: its tokens and everything before them.
pub type BlockHash = u128;

/// Hashes of the full blocks of `tokens`, where token `i` was computed with arithmetic class
/// `class(i)`. Appends to `out` the hashes of blocks `out.len()..` (so a caller can extend a
/// sequence's hashes as it grows), stopping at the first block not wholly within `tokens`.
pub fn extend_block_hashes(
    tokens: &[TokenId],
    class: impl Fn(usize) -> u8,
    block_size: usize,
    out: &mut Vec<BlockHash>,
) {
    while (out.len() + 1) * block_size <= tokens.len() {
        let b = out.len();
        let parent = out.last().copied().unwrap_or(0);
        let mut h = Sha256::new();
        h.update(parent.to_le_bytes());
        let start = b * block_size;
        for (i, t) in tokens[start..start + block_size].iter().enumerate() {
            h.update(t.to_le_bytes());
            h.update([class(start + i)]);
        }
        let d = h.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&d[..16]);
        out.push(u128::from_le_bytes(first));
    }
}

/// Which blocks hold a cached prefix, and the order in which unused ones are evicted.
#[derive(Default)]
pub(super) struct PrefixIndex {
    by_hash: HashMap<BlockHash, BlockId>,
    hash_of: HashMap<BlockId, BlockHash>,
    /// Cached blocks no sequence uses, by when they were last released (oldest first).
    lru: BTreeMap<u64, BlockId>,
    released_at: HashMap<BlockId, u64>,
    clock: u64,
    /// Events since they were last taken, when recording ([`KvCache::set_events`]).
    pub journal: Option<Vec<KvEvent>>,
}

impl PrefixIndex {
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.by_hash.get(&hash).copied()
    }

    pub fn is_cached(&self, b: BlockId) -> bool {
        self.hash_of.contains_key(&b)
    }

    /// Blocks that hold a cached prefix (in use or not).
    pub fn n_cached(&self) -> usize {
        self.hash_of.len()
    }

    /// Cached blocks no sequence uses: free for the taking, evicted when needed.
    pub fn n_evictable(&self) -> usize {
        self.lru.len()
    }

    pub fn is_evictable(&self, b: BlockId) -> bool {
        self.released_at.contains_key(&b)
    }

    /// Makes `b` (a full block in use) findable under `hash`, unless another block already
    /// is: the first to finish a prefix keeps it. Returns whether `b` was registered.
    pub fn register(&mut self, b: BlockId, hash: BlockHash) -> bool {
        if self.by_hash.contains_key(&hash) || self.hash_of.contains_key(&b) {
            return false;
        }
        self.by_hash.insert(hash, b);
        self.hash_of.insert(b, hash);
        true
    }

    /// Forgets `b` (its contents are about to change); it stays with its sequences.
    pub fn unregister(&mut self, b: BlockId) {
        if let Some(h) = self.hash_of.remove(&b) {
            self.forget(h);
        }
        if let Some(t) = self.released_at.remove(&b) {
            self.lru.remove(&t);
        }
    }

    /// `b`, a cached block, is no longer used by any sequence: it waits for reuse or eviction.
    pub fn park(&mut self, b: BlockId) {
        debug_assert!(self.is_cached(b));
        self.clock += 1;
        self.lru.insert(self.clock, b);
        self.released_at.insert(b, self.clock);
    }

    /// `b`, a parked block, is taken by a sequence again.
    pub fn unpark(&mut self, b: BlockId) {
        if let Some(t) = self.released_at.remove(&b) {
            self.lru.remove(&t);
        }
    }

    /// Takes the least recently used parked block out of the cache, for a new use.
    pub fn evict_lru(&mut self) -> Option<BlockId> {
        let (_, b) = self.lru.pop_first()?;
        self.released_at.remove(&b);
        if let Some(h) = self.hash_of.remove(&b) {
            self.forget(h);
        }
        Some(b)
    }

    /// `hash` is no longer findable (its block's `hash_of` entry is gone already).
    fn forget(&mut self, hash: BlockHash) {
        self.by_hash.remove(&hash);
        if let Some(j) = &mut self.journal {
            j.push(KvEvent::Removed { hash });
        }
    }

    /// The hashes of the cached blocks.
    pub fn hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.by_hash.keys().copied()
    }
}

/// The prefix cache as the pool's callers see it.
impl KvCache {
    /// Turns prefix caching on or off (off by default). Turning it off drops every cached
    /// prefix.
    pub fn set_prefix_caching(&mut self, on: bool) {
        if !on {
            self.pools.iter_mut().for_each(|p| p.drop_cached());
        }
        self.prefix_caching = on;
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks of the full-context pool holding a cached prefix, whether a sequence uses them
    /// or not.
    pub fn cached_blocks(&self) -> usize {
        self.pools[0].prefix.n_cached()
    }

    /// How many of `hashes` (the block hashes of a prompt, in order) a new sequence would take
    /// from the cache, counted from the first: `(blocks found, of which no sequence uses)`.
    /// Taking the second kind uses up free blocks of the full-context pool.
    pub fn lookup_prefix(&self, hashes: &[BlockHash]) -> (usize, usize) {
        if !self.prefix_caching {
            return (0, 0);
        }
        let found = self.cached_run(hashes, 0);
        let full = &self.pools[0].prefix;
        let parked = hashes[..found]
            .iter()
            .filter(|&&h| full.lookup(h).is_some_and(|b| full.is_evictable(b)))
            .count();
        (found, parked)
    }

    /// Appends to `seq`, which must end on a block edge, the cached blocks that continue it:
    /// those of `hashes[n..]` (n = its blocks) in order while they are cached. `hashes` are
    /// the block hashes of the sequence's tokens. Returns the tokens added.
    pub fn attach_cached(&mut self, seq: SeqId, hashes: &[BlockHash]) -> Result<usize, KvError> {
        let bs = self.cfg.block_size;
        let t = self.table(seq)?;
        let from = t.blocks[0].len();
        if !self.prefix_caching || t.len != from * bs {
            return Ok(0);
        }
        let k = self.cached_run(hashes, from);
        if k == from {
            return Ok(0);
        }
        self.take_cached_run(seq, hashes, from, k)?;
        Ok((k - from) * bs)
    }

    /// Offers the full blocks of `seq` not offered yet to the prefix cache, under `hashes`
    /// (the block hashes of `tokens`, its tokens from the first; blocks past the hashes are not
    /// offered). A block whose prefix is cached already stays private (the cached copy is the
    /// one found).
    pub fn offer_blocks(
        &mut self,
        seq: SeqId,
        hashes: &[BlockHash],
        tokens: &[TokenId],
    ) -> Result<(), KvError> {
        if !self.prefix_caching {
            return Ok(());
        }
        let bs = self.cfg.block_size;
        let t = self.table(seq)?;
        let (from, full) = (t.offered, (t.len / bs).min(hashes.len()));
        let offers: Vec<(usize, usize, BlockId)> = (0..self.pools.len())
            .flat_map(|p| (from..full).map(move |i| (p, i)))
            .map(|(p, i)| (p, i, t.blocks[p][i]))
            .filter(|&(_, _, b)| b != NO_BLOCK)
            .collect();
        for (p, i, b) in offers {
            let prefix = &mut self.pools[p].prefix;
            if prefix.register(b, hashes[i]) && p == 0 {
                if let Some(j) = &mut prefix.journal {
                    j.push(KvEvent::Stored {
                        hash: hashes[i],
                        parent: i.checked_sub(1).map(|k| hashes[k]),
                        tokens: tokens.get(i * bs..(i + 1) * bs).unwrap_or(&[]).to_vec(),
                    });
                }
            }
        }
        let t = self.table_mut(seq)?;
        t.offered = t.offered.max(full);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_and_cover_full_blocks_only() {
        let toks: Vec<TokenId> = (0..10).collect();
        let mut h = Vec::new();
        extend_block_hashes(&toks, |_| 0, 4, &mut h);
        assert_eq!(h.len(), 2, "10 tokens: two full blocks of 4");
        // Extending with more tokens keeps the existing hashes and adds the new full block.
        let toks2: Vec<TokenId> = (0..12).collect();
        let mut h2 = h.clone();
        extend_block_hashes(&toks2, |_| 0, 4, &mut h2);
        assert_eq!(&h2[..2], &h[..]);
        assert_eq!(h2.len(), 3);
        // The same block of tokens after a different prefix has a different hash (chaining).
        let other: Vec<TokenId> = [99, 1, 2, 3, 4, 5, 6, 7].to_vec();
        let mut ho = Vec::new();
        extend_block_hashes(&other, |_| 0, 4, &mut ho);
        assert_ne!(ho[0], h[0]);
        assert_ne!(
            ho[1], h[1],
            "block 1 has the same tokens but another parent"
        );
        // The arithmetic class is part of the identity.
        let mut hc = Vec::new();
        extend_block_hashes(&toks, |i| u8::from(i == 5), 4, &mut hc);
        assert_eq!(hc[0], h[0]);
        assert_ne!(hc[1], h[1]);
    }

    #[test]
    fn eviction_is_least_recently_released_first() {
        let mut p = PrefixIndex::default();
        for b in 0..3 {
            assert!(p.register(b, 100 + b as u128));
        }
        assert!(!p.register(7, 100), "the first block of a prefix keeps it");
        p.park(2);
        p.park(0);
        p.park(1);
        assert_eq!(p.n_evictable(), 3);
        p.unpark(0); // taken again: not evictable
        assert_eq!(p.evict_lru(), Some(2));
        assert_eq!(p.lookup(102), None, "an evicted block is no longer found");
        assert_eq!(p.evict_lru(), Some(1));
        assert_eq!(p.evict_lru(), None);
        assert_eq!(p.lookup(100), Some(0));
        p.unregister(0);
        assert_eq!(p.lookup(100), None);
        assert_eq!(p.n_cached(), 0);
    }
}
