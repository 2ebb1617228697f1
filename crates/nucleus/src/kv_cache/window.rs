//! Rewriting a sequence's cache in place when its window slides (`--context-policy stream`):
//! the oldest blocks after the sinks are evicted, the blocks after them made private, and
//! their keys re-rotated to their new positions (see `engine::context` and `Model::shift_keys`).

use super::{BlockId, KvCache, KvError, SeqId};

impl KvCache {
    /// Removes `count` full blocks of `seq` starting at block `first` (the middle of a
    /// sequence that has outgrown its window): the tokens after them move down by
    /// `count × block_size` positions in the block table. Their keys still carry their old
    /// positions; the caller re-rotates them ([`update_keys`](Self::update_keys)) after
    /// [`make_private`](Self::make_private).
    pub fn evict_blocks(&mut self, seq: SeqId, first: usize, count: usize) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        let t = self.table_mut(seq)?;
        if (first + count) * bs > t.len {
            return Err(KvError::BadTruncate {
                seq,
                len: t.len,
                to: first * bs,
            });
        }
        let dropped: Vec<BlockId> = t.blocks.drain(first..first + count).collect();
        t.len -= count * bs;
        t.offered = t.offered.min(first);
        for b in dropped {
            self.release(b);
        }
        Ok(())
    }

    /// Makes the blocks of `seq` from block `first` on its own and out of the prefix cache, so
    /// that they can be rewritten in place: shared blocks are copied, cached ones forgotten.
    /// All or nothing.
    pub fn make_private(&mut self, seq: SeqId, first: usize) -> Result<(), KvError> {
        let blocks = self.table(seq)?.blocks.clone();
        let shared = blocks[first.min(blocks.len())..]
            .iter()
            .filter(|&&b| self.refcount[b as usize] > 1)
            .count();
        if shared > self.free_blocks() {
            return Err(KvError::OutOfBlocks {
                needed: shared,
                free: self.free_blocks(),
            });
        }
        for (i, &b) in blocks.iter().enumerate().skip(first) {
            if self.refcount[b as usize] > 1 {
                self.copy_on_write(seq, i)?;
            } else {
                self.prefix.unregister(b);
            }
        }
        Ok(())
    }

    /// Rewrites the keys of slots `slots` of `block` in `layer`: `f(kv_head, key)` gets each
    /// key as f32 and changes it in place. For re-rotating keys whose position changed; the
    /// block must be private ([`make_private`](Self::make_private)).
    pub fn update_keys(
        &mut self,
        layer: usize,
        block: BlockId,
        slots: std::ops::Range<usize>,
        mut f: impl FnMut(usize, &mut [f32]),
    ) {
        let c = self.cfg;
        debug_assert!(!self.prefix.is_cached(block) && self.refcount[block as usize] == 1);
        let mut row = vec![0f32; c.head_dim_k];
        for h in 0..c.n_kv_heads {
            for slot in slots.clone() {
                let r = (block as usize * c.n_kv_heads + h) * c.block_size + slot;
                self.k[layer].read_row(c.ty, r, &mut row);
                f(h, &mut row);
                self.k[layer].write_row(c.ty, r, &row);
            }
        }
    }
}
