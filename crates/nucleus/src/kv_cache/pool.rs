//! One pool of KV blocks for a set of layers: their keys and values, a reference count per
//! block, the free list and the prefix index of the blocks it caches.
//!
//! A cache has one pool for the layers that attend over the whole context and, when the model
//! has sliding-window layers, a second, smaller one for those (see [`super::sliding`]). Block
//! numbers are per pool.

use half::f16;

use super::prefix::PrefixIndex;
use super::storage::Plane;
use super::{BlockId, KvConfig, KvType};

/// A sliding-window pool's table has no block where positions fell out of the window.
pub const NO_BLOCK: BlockId = BlockId::MAX;

pub(super) struct Pool {
    /// `Some(w)`: the layers see only the last `w` positions, and blocks before that are freed.
    pub window: Option<usize>,
    pub n_blocks: usize,
    /// Per layer of the pool: `[block][kv_head][slot][row]`, so that one head's keys in a block
    /// are contiguous for attention.
    pub k: Vec<Plane>,
    pub v: Vec<Plane>,
    pub refcount: Vec<u32>,
    /// Blocks no sequence uses and no cached prefix holds.
    pub free: Vec<BlockId>,
    pub prefix: PrefixIndex,
}

impl Pool {
    pub fn new(cfg: &KvConfig, n_layers: usize, n_blocks: usize, window: Option<usize>) -> Pool {
        let rows = n_blocks * cfg.n_kv_heads * cfg.block_size;
        Pool {
            window,
            n_blocks,
            k: (0..n_layers)
                .map(|_| Plane::new(cfg.ty, rows, cfg.head_dim_k))
                .collect(),
            v: (0..n_layers)
                .map(|_| Plane::new(cfg.ty, rows, cfg.head_dim_v))
                .collect(),
            refcount: vec![0; n_blocks],
            // Pop from the end: hand out low block numbers first.
            free: (0..n_blocks as BlockId).rev().collect(),
            prefix: PrefixIndex::default(),
        }
    }

    /// Blocks a sequence can get: free ones and cached ones no sequence uses (evicted when
    /// taken).
    pub fn available(&self) -> usize {
        self.free.len() + self.prefix.n_evictable()
    }

    /// Drops one reference to `b`; a block nobody holds is parked in the prefix cache when it
    /// holds a cached prefix, else freed.
    pub fn release(&mut self, b: BlockId) {
        if b == NO_BLOCK {
            return;
        }
        let rc = &mut self.refcount[b as usize];
        debug_assert!(*rc > 0);
        *rc -= 1;
        if *rc == 0 {
            if self.prefix.is_cached(b) {
                self.prefix.park(b);
            } else {
                self.free.push(b);
            }
        }
    }

    /// One more reference to `b` (a fork, or a cached prefix taken).
    pub fn retain(&mut self, b: BlockId) {
        if b == NO_BLOCK {
            return;
        }
        if self.refcount[b as usize] == 0 {
            self.prefix.unpark(b);
        }
        self.refcount[b as usize] += 1;
    }

    pub fn is_shared(&self, b: BlockId) -> bool {
        b != NO_BLOCK && self.refcount[b as usize] > 1
    }

    /// A block for new contents: a free one, else the least recently used cached one.
    pub fn alloc(&mut self) -> BlockId {
        let b = self
            .free
            .pop()
            .or_else(|| self.prefix.evict_lru())
            .expect("caller checked free blocks");
        self.refcount[b as usize] = 1;
        b
    }

    pub fn copy_block(&mut self, cfg: &KvConfig, from: BlockId, to: BlockId) {
        let rows = cfg.n_kv_heads * cfg.block_size;
        let (f, t) = (from as usize * rows, to as usize * rows);
        for (k, v) in self.k.iter_mut().zip(&mut self.v) {
            k.copy_rows(cfg.ty, f, t, rows, cfg.head_dim_k);
            v.copy_rows(cfg.ty, f, t, rows, cfg.head_dim_v);
        }
    }

    /// Forgets every cached prefix (caching turned off).
    pub fn drop_cached(&mut self) {
        while let Some(b) = self.prefix.evict_lru() {
            self.free.push(b);
        }
        for b in 0..self.n_blocks as BlockId {
            self.prefix.unregister(b);
        }
    }

    #[cfg(test)]
    pub fn allocated_bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(Plane::bytes).sum()
    }
}

/// Row addressing shared by the pools: `[block][kv_head][slot]`.
pub(super) fn row(cfg: &KvConfig, block: BlockId, head: usize, slot: usize) -> usize {
    (block as usize * cfg.n_kv_heads + head) * cfg.block_size + slot
}

impl Pool {
    pub fn write(
        &mut self,
        cfg: &KvConfig,
        li: usize,
        block: BlockId,
        slot: usize,
        k: &[f32],
        v: &[f32],
    ) {
        debug_assert!(!self.prefix.is_cached(block), "a cached block is read-only");
        let (dk, dv) = (cfg.head_dim_k, cfg.head_dim_v);
        debug_assert_eq!(k.len(), cfg.n_kv_heads * dk);
        debug_assert_eq!(v.len(), cfg.n_kv_heads * dv);
        for h in 0..cfg.n_kv_heads {
            let r = row(cfg, block, h, slot);
            self.k[li].write_row(cfg.ty, r, &k[h * dk..(h + 1) * dk]);
            self.v[li].write_row(cfg.ty, r, &v[h * dv..(h + 1) * dv]);
        }
    }

    pub fn f16_keys(&self, cfg: &KvConfig, li: usize, block: BlockId, head: usize) -> &[f16] {
        self.k[li].f16_rows(row(cfg, block, head, 0), cfg.block_size, cfg.head_dim_k)
    }

    pub fn f16_values(&self, cfg: &KvConfig, li: usize, block: BlockId, head: usize) -> &[f16] {
        self.v[li].f16_rows(row(cfg, block, head, 0), cfg.block_size, cfg.head_dim_v)
    }

    pub fn key_row(
        &self,
        cfg: &KvConfig,
        li: usize,
        block: BlockId,
        head: usize,
        slot: usize,
    ) -> &[u8] {
        let ty: KvType = cfg.ty;
        self.k[li].block_row(ty, row(cfg, block, head, slot), cfg.head_dim_k)
    }
}
