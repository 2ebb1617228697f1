//! What the prefix cache tells a router: which full blocks it holds (KV-cache events).
//!
//! A router that knows which replica caches which prefix can send a request where its prompt is
//! already computed (llm-d's precise prefix-cache scorer, fed by vLLM's KV events). The
//! journal records, in order, every block of the full-context pool that becomes findable by its
//! hash ([`KvEvent::Stored`], with its parent's hash and its tokens, from which the router
//! computes keys of its own) and every block that stops being findable ([`KvEvent::Removed`]:
//! evicted for new contents, overwritten, or dropped with the cache). Replayed in order, the
//! events give exactly the set of hashes [`KvCache::cached_hashes`] lists.

use super::prefix::BlockHash;
use super::KvCache;
use crate::tokenizer::TokenId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// A full block is cached under `hash`; `parent` is the hash of the block before it (none
    /// for a prompt's first block), `tokens` the block's tokens.
    Stored {
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: Vec<TokenId>,
    },
    /// The block cached under `hash` is no longer.
    Removed { hash: BlockHash },
}

impl KvCache {
    /// Starts (or stops, dropping what was not taken) recording [`KvEvent`]s. Off by default:
    /// a journal nobody takes would grow without bound.
    pub fn set_events(&mut self, on: bool) {
        self.pools[0].prefix.journal = on.then(Vec::new);
    }

    /// The events recorded since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.pools[0]
            .prefix
            .journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Whether events were recorded and not taken yet.
    pub fn has_events(&self) -> bool {
        self.pools[0]
            .prefix
            .journal
            .as_ref()
            .is_some_and(|j| !j.is_empty())
    }

    /// The hashes of the full-context pool's cached blocks, in no particular order.
    pub fn cached_hashes(&self) -> Vec<BlockHash> {
        self.pools[0].prefix.hashes().collect()
    }
}
