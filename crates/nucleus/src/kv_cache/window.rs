//! Rewriting a sequence's cache in place when its window slides (`--context-policy stream`):
//! the oldest blocks after the sinks are evicted, the blocks after them made private, and
//! their keys re-rotated to their new positions (see `engine::context` and `Model::shift_keys`).

use super::{BlockId, KvCache, KvError, SeqId, NO_BLOCK};

impl KvCache {
    /// Removes `count` full blocks of `seq` starting at block `first` (the middle of a
    /// sequence that has outgrown its window): the tokens after them move down by
    /// `count × block_size` positions in the block table. Their keys still carry their old
    /// positions; the caller re-rotates them ([`update_keys`](Self::update_keys)) after
    /// [`make_private`](Self::make_private).
    pub fn evict_blocks(&mut self, seq: SeqId, first: usize, count: usize) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        let t = self.table(seq)?;
        if (first + count) * bs > t.len {
            return Err(KvError::BadTruncate {
                seq,
                len: t.len,
                to: first * bs,
            });
        }
        // The sliding-window layers must still hold what the shorter sequence reads.
        let mut after = t.blocks.clone();
        after.iter_mut().for_each(|b| {
            b.drain(first..first + count);
        });
        self.check_window(seq, &after, t.len - count * bs)?;
        let t = self.table_mut(seq)?;
        let before = std::mem::replace(&mut t.blocks, after);
        t.len -= count * bs;
        t.offered = t.offered.min(first);
        for (pool, blocks) in self.pools.iter_mut().zip(before) {
            for &b in &blocks[first..first + count] {
                pool.release(b);
            }
        }
        Ok(())
    }

    /// Makes the blocks of `seq` from block `first` on its own and out of the prefix cache, so
    /// that they can be rewritten in place: shared blocks are copied, cached ones forgotten.
    /// All or nothing.
    pub fn make_private(&mut self, seq: SeqId, first: usize) -> Result<(), KvError> {
        let t = self.table(seq)?;
        for (pool, blocks) in self.pools.iter().zip(&t.blocks) {
            let from = first.min(blocks.len());
            let shared = blocks[from..]
                .iter()
                .filter(|&&b| pool.is_shared(b))
                .count();
            if shared > pool.available() {
                return Err(KvError::OutOfBlocks {
                    needed: shared,
                    free: pool.available(),
                });
            }
        }
        for p in 0..self.pools.len() {
            let blocks = self.table(seq)?.blocks[p].clone();
            for (i, &b) in blocks.iter().enumerate().skip(first) {
                if self.pools[p].is_shared(b) {
                    self.copy_on_write(seq, p, i)?;
                } else if b != NO_BLOCK {
                    self.pools[p].prefix.unregister(b);
                }
            }
        }
        Ok(())
    }

    /// Rewrites the keys at `slots` of `block` (of `layer`'s pool) in `layer`, every KV head:
    /// `f(kv_head, key)` changes each key in place (as f32; stored back in the cache's type).
    /// The block must be private to its sequence and not cached.
    pub fn update_keys(
        &mut self,
        layer: usize,
        block: BlockId,
        slots: std::ops::Range<usize>,
        mut f: impl FnMut(usize, &mut [f32]),
    ) {
        let c = self.cfg;
        let (p, li) = self.layer_pool[layer];
        let pool = &mut self.pools[p];
        debug_assert!(!pool.prefix.is_cached(block) && pool.refcount[block as usize] == 1);
        let mut row = vec![0f32; c.head_dim_k];
        for h in 0..c.n_kv_heads {
            for slot in slots.clone() {
                let r = super::pool::row(&c, block, h, slot);
                pool.k[li].read_row(c.ty, r, &mut row);
                f(h, &mut row);
                pool.k[li].write_row(c.ty, r, &row);
            }
        }
    }
}
