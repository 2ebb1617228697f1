//! The KV cache: fixed-size blocks from one preallocated pool, a block table per sequence, only
//! the KV heads stored (GQA/MQA), f16 storage.
//!
//! Blocks are reference-counted so that sequences can share a prefix (a forked beam, a common
//! system prompt): forking copies only the block table, and a shared block is copied before it
//! is written (copy-on-write), which can only happen to the partial last block.
//!
//! With prefix caching ([`prefix`]), full blocks are also kept after their last sequence ends,
//! under the hash of the prefix they hold, until the pool needs them (least recently used
//! first). Such a block is never written again: only full blocks are cached, sequences write
//! past their end, and a sequence cut back into a cached block takes it out of the cache first.

mod prefix;
mod storage;

pub use prefix::{extend_block_hashes, BlockHash};
pub use storage::KvType;

use half::f16;
use prefix::PrefixIndex;
use storage::Plane;

/// A sequence's handle in the cache.
pub type SeqId = usize;
pub type BlockId = u32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("KV cache is full: {needed} more blocks needed, {free} free")]
    OutOfBlocks { needed: usize, free: usize },
    #[error("unknown sequence {0}")]
    UnknownSeq(SeqId),
    #[error("sequence {seq} has {len} tokens; cannot truncate to {to}")]
    BadTruncate { seq: SeqId, len: usize, to: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvConfig {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Tokens per block.
    pub block_size: usize,
    pub n_blocks: usize,
    /// How keys and values are stored.
    pub ty: KvType,
}

impl KvConfig {
    /// Bytes of K and V per token: layers × kv_heads × (a key row + a value row), rows of
    /// f16 (2 bytes a value) or of 32-value blocks (Q8_0: 34 bytes, Q4_0: 18).
    pub fn bytes_per_token(&self) -> usize {
        let ty = self.ty;
        self.n_layers
            * self.n_kv_heads
            * (ty.row_bytes(self.head_dim_k) + ty.row_bytes(self.head_dim_v))
    }

    /// Whether the head dimensions can be stored in the type (block types need multiples
    /// of 32).
    pub fn check(&self) -> Result<(), String> {
        for dim in [self.head_dim_k, self.head_dim_v] {
            if !self.ty.fits(dim) {
                return Err(format!(
                    "a {} KV cache needs head dimensions that are multiples of 32; this model's is {dim}",
                    self.ty
                ));
            }
        }
        Ok(())
    }

    pub fn bytes_per_block(&self) -> usize {
        self.bytes_per_token() * self.block_size
    }
}

#[derive(Clone, Debug, Default)]
struct BlockTable {
    blocks: Vec<BlockId>,
    len: usize,
    /// Blocks `[0, offered)` have been offered to the prefix cache.
    offered: usize,
}

pub struct KvCache {
    cfg: KvConfig,
    /// Per layer: `[block][kv_head][slot][row]` so that one head's keys in a block are
    /// contiguous for attention.
    k: Vec<Plane>,
    v: Vec<Plane>,
    refcount: Vec<u32>,
    /// Blocks no sequence uses and no cached prefix holds.
    free: Vec<BlockId>,
    seqs: Vec<Option<BlockTable>>,
    prefix: PrefixIndex,
    prefix_caching: bool,
}

impl KvCache {
    /// A cache as `cfg` says. Panics when the head dimensions do not fit the type (check with
    /// [`KvConfig::check`] first).
    pub fn new(cfg: KvConfig) -> KvCache {
        assert!(cfg.block_size > 0 && cfg.n_blocks > 0 && cfg.n_blocks <= u32::MAX as usize);
        assert_eq!(cfg.check(), Ok(()));
        let rows = cfg.n_blocks * cfg.n_kv_heads * cfg.block_size;
        KvCache {
            cfg,
            k: (0..cfg.n_layers)
                .map(|_| Plane::new(cfg.ty, rows, cfg.head_dim_k))
                .collect(),
            v: (0..cfg.n_layers)
                .map(|_| Plane::new(cfg.ty, rows, cfg.head_dim_v))
                .collect(),
            refcount: vec![0; cfg.n_blocks],
            // Pop from the end: hand out low block numbers first.
            free: (0..cfg.n_blocks as BlockId).rev().collect(),
            seqs: Vec::new(),
            prefix: PrefixIndex::default(),
            prefix_caching: false,
        }
    }

    /// Turns prefix caching on or off (off by default). Turning it off drops every cached
    /// prefix.
    pub fn set_prefix_caching(&mut self, on: bool) {
        if !on {
            while let Some(b) = self.prefix.evict_lru() {
                self.free.push(b);
            }
            let cached: Vec<BlockId> = (0..self.cfg.n_blocks as BlockId)
                .filter(|&b| self.prefix.is_cached(b))
                .collect();
            for b in cached {
                self.prefix.unregister(b);
            }
        }
        self.prefix_caching = on;
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks holding a cached prefix, whether a sequence uses them or not.
    pub fn cached_blocks(&self) -> usize {
        self.prefix.n_cached()
    }

    /// How many of `hashes` (the block hashes of a prompt, in order) are cached, counted from
    /// the first: `(blocks found, of which no sequence uses)`. Taking the second kind uses up
    /// free blocks.
    pub fn lookup_prefix(&self, hashes: &[BlockHash]) -> (usize, usize) {
        if !self.prefix_caching {
            return (0, 0);
        }
        let mut parked = 0;
        for (i, &h) in hashes.iter().enumerate() {
            match self.prefix.lookup(h) {
                Some(b) => parked += usize::from(self.prefix.is_evictable(b)),
                None => return (i, parked),
            }
        }
        (hashes.len(), parked)
    }

    /// Appends to `seq`, which must end on a block edge, the cached blocks that continue it:
    /// those of `hashes[n..]` (n = its blocks) in order while they are cached. `hashes` are
    /// the block hashes of the sequence's tokens. Returns the tokens added.
    pub fn attach_cached(&mut self, seq: SeqId, hashes: &[BlockHash]) -> Result<usize, KvError> {
        let bs = self.cfg.block_size;
        let t = self.table(seq)?;
        if !self.prefix_caching || t.len != t.blocks.len() * bs {
            return Ok(0);
        }
        let mut added = 0;
        for &h in hashes.iter().skip(t.blocks.len()) {
            let Some(b) = self.prefix.lookup(h) else {
                break;
            };
            if self.refcount[b as usize] == 0 {
                self.prefix.unpark(b);
            }
            self.refcount[b as usize] += 1;
            let t = self.table_mut(seq)?;
            t.blocks.push(b);
            t.len += bs;
            t.offered = t.blocks.len();
            added += bs;
        }
        Ok(added)
    }

    /// Offers the full blocks of `seq` to the prefix cache, under `hashes` (the block hashes of
    /// its tokens; blocks beyond `hashes` are not offered). A block whose prefix is already
    /// cached elsewhere stays private to its sequence.
    pub fn offer_blocks(&mut self, seq: SeqId, hashes: &[BlockHash]) -> Result<(), KvError> {
        if !self.prefix_caching {
            return Ok(());
        }
        let bs = self.cfg.block_size;
        let t = self.table(seq)?;
        let (from, full) = (t.offered, (t.len / bs).min(hashes.len()));
        for (i, &hash) in hashes.iter().enumerate().take(full).skip(from) {
            let b = self.table(seq)?.blocks[i];
            self.prefix.register(b, hash);
        }
        let t = self.table_mut(seq)?;
        t.offered = t.offered.max(full);
        Ok(())
    }

    pub fn config(&self) -> &KvConfig {
        &self.cfg
    }

    /// Blocks a sequence can get: free ones and cached ones no sequence uses (evicted when
    /// taken).
    pub fn free_blocks(&self) -> usize {
        self.free.len() + self.prefix.n_evictable()
    }

    /// Blocks sequences use.
    pub fn used_blocks(&self) -> usize {
        self.cfg.n_blocks - self.free_blocks()
    }

    /// Bytes the whole pool takes.
    pub fn total_bytes(&self) -> usize {
        self.cfg.bytes_per_block() * self.cfg.n_blocks
    }

    /// Tokens the pool can hold in all.
    pub fn capacity_tokens(&self) -> usize {
        self.cfg.n_blocks * self.cfg.block_size
    }

    pub fn new_seq(&mut self) -> SeqId {
        if let Some(i) = self.seqs.iter().position(|s| s.is_none()) {
            self.seqs[i] = Some(BlockTable::default());
            return i;
        }
        self.seqs.push(Some(BlockTable::default()));
        self.seqs.len() - 1
    }

    fn table(&self, seq: SeqId) -> Result<&BlockTable, KvError> {
        self.seqs
            .get(seq)
            .and_then(|s| s.as_ref())
            .ok_or(KvError::UnknownSeq(seq))
    }

    fn table_mut(&mut self, seq: SeqId) -> Result<&mut BlockTable, KvError> {
        self.seqs
            .get_mut(seq)
            .and_then(|s| s.as_mut())
            .ok_or(KvError::UnknownSeq(seq))
    }

    pub fn seq_len(&self, seq: SeqId) -> Result<usize, KvError> {
        Ok(self.table(seq)?.len)
    }

    /// The blocks of a sequence, in order.
    pub fn seq_blocks(&self, seq: SeqId) -> Result<&[BlockId], KvError> {
        Ok(&self.table(seq)?.blocks)
    }

    /// Ends a sequence and returns its blocks to the pool (shared blocks stay with their
    /// other owners).
    pub fn free_seq(&mut self, seq: SeqId) -> Result<(), KvError> {
        let table = self
            .seqs
            .get_mut(seq)
            .and_then(|s| s.take())
            .ok_or(KvError::UnknownSeq(seq))?;
        for b in table.blocks {
            self.release(b);
        }
        Ok(())
    }

    fn release(&mut self, b: BlockId) {
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

    /// A new sequence sharing all of `src`'s blocks; only the block table is copied.
    pub fn fork_seq(&mut self, src: SeqId) -> Result<SeqId, KvError> {
        let table = self.table(src)?.clone();
        for &b in &table.blocks {
            self.refcount[b as usize] += 1;
        }
        let id = self.new_seq();
        self.seqs[id] = Some(table);
        Ok(id)
    }

    /// Shortens a sequence to `len` tokens (speculative decoding's rollback), freeing blocks
    /// past the end.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        let t = self.table_mut(seq)?;
        if len > t.len {
            return Err(KvError::BadTruncate {
                seq,
                len: t.len,
                to: len,
            });
        }
        t.len = len;
        t.offered = t.offered.min(len / bs);
        let keep = len.div_ceil(bs);
        let dropped: Vec<BlockId> = t.blocks.drain(keep..).collect();
        // The last block is partial again and will be written: it no longer holds its prefix.
        // (When other sequences share it, the write copies it first; the cached prefix stays.)
        let last = (!len.is_multiple_of(bs)).then(|| t.blocks[keep - 1]);
        if let Some(b) = last {
            if self.refcount[b as usize] == 1 {
                self.prefix.unregister(b);
            }
        }
        for b in dropped {
            self.release(b);
        }
        Ok(())
    }

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
                let copy = self.alloc_block();
                self.copy_block(b, copy);
                self.release(b);
                self.table_mut(seq)?.blocks[i] = copy;
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

    /// Blocks needed to grow `seq` by `n` tokens (including a copy of a shared partial block).
    pub fn blocks_needed(&self, seq: SeqId, n: usize) -> Result<usize, KvError> {
        let t = self.table(seq)?;
        let bs = self.cfg.block_size;
        let new_blocks = (t.len + n).div_ceil(bs) - t.blocks.len();
        let cow = t.len % bs != 0
            && n > 0
            && t.blocks
                .last()
                .is_some_and(|&b| self.refcount[b as usize] > 1);
        Ok(new_blocks + cow as usize)
    }

    /// Makes room for `n` more tokens of `seq`: allocates blocks, and copies a shared partial
    /// last block so that writing to it does not change another sequence. All or nothing.
    pub fn reserve(&mut self, seq: SeqId, n: usize) -> Result<(), KvError> {
        let needed = self.blocks_needed(seq, n)?;
        if needed > self.free_blocks() {
            return Err(KvError::OutOfBlocks {
                needed,
                free: self.free_blocks(),
            });
        }
        let bs = self.cfg.block_size;
        let (len, last) = {
            let t = self.table(seq)?;
            (t.len, t.blocks.last().copied())
        };
        if let Some(last) = last {
            if len % bs != 0 && n > 0 && self.refcount[last as usize] > 1 {
                let copy = self.alloc_block();
                self.copy_block(last, copy);
                self.release(last);
                let t = self.table_mut(seq)?;
                *t.blocks.last_mut().expect("has a last block") = copy;
            }
        }
        let have = self.table(seq)?.blocks.len();
        for _ in have..(len + n).div_ceil(bs) {
            let b = self.alloc_block();
            self.table_mut(seq)?.blocks.push(b);
        }
        Ok(())
    }

    /// A block for new contents: a free one, else the least recently used cached one.
    fn alloc_block(&mut self) -> BlockId {
        let b = self
            .free
            .pop()
            .or_else(|| self.prefix.evict_lru())
            .expect("caller checked free blocks");
        self.refcount[b as usize] = 1;
        b
    }

    fn copy_block(&mut self, from: BlockId, to: BlockId) {
        let c = self.cfg;
        let rows = c.n_kv_heads * c.block_size;
        let (f, t) = (from as usize * rows, to as usize * rows);
        for layer in 0..c.n_layers {
            self.k[layer].copy_rows(c.ty, f, t, rows, c.head_dim_k);
            self.v[layer].copy_rows(c.ty, f, t, rows, c.head_dim_v);
        }
    }

    /// Marks `n` tokens as appended to `seq` (after [`reserve`](Self::reserve) and the writes).
    pub fn commit(&mut self, seq: SeqId, n: usize) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        let t = self.table_mut(seq)?;
        assert!(
            t.len + n <= t.blocks.len() * bs,
            "commit past reserved blocks"
        );
        t.len += n;
        Ok(())
    }

    /// Where token position `pos` of `seq` lives: (block, slot). The position must be reserved.
    pub fn slot(&self, seq: SeqId, pos: usize) -> Result<(BlockId, usize), KvError> {
        let t = self.table(seq)?;
        let bs = self.cfg.block_size;
        t.blocks
            .get(pos / bs)
            .map(|&b| (b, pos % bs))
            .ok_or(KvError::UnknownSeq(seq))
    }

    /// Writes one token's keys and values (all KV heads, f32 in, stored in the cache's type)
    /// for one layer.
    pub fn write(&mut self, layer: usize, block: BlockId, slot: usize, k: &[f32], v: &[f32]) {
        let c = self.cfg;
        debug_assert!(!self.prefix.is_cached(block), "a cached block is read-only");
        debug_assert_eq!(k.len(), c.n_kv_heads * c.head_dim_k);
        debug_assert_eq!(v.len(), c.n_kv_heads * c.head_dim_v);
        for h in 0..c.n_kv_heads {
            let row = (block as usize * c.n_kv_heads + h) * c.block_size + slot;
            let (dk, dv) = (c.head_dim_k, c.head_dim_v);
            self.k[layer].write_row(c.ty, row, &k[h * dk..(h + 1) * dk]);
            self.v[layer].write_row(c.ty, row, &v[h * dv..(h + 1) * dv]);
        }
    }

    /// Keys of one KV head in one block of one layer: `block_size` rows of `head_dim_k`
    /// (an f16 cache).
    pub fn block_keys(&self, layer: usize, block: BlockId, head: usize) -> &[f16] {
        let c = &self.cfg;
        let first = (block as usize * c.n_kv_heads + head) * c.block_size;
        self.k[layer].f16_rows(first, c.block_size, c.head_dim_k)
    }

    /// Values of one KV head in one block of one layer: `block_size` rows of `head_dim_v`
    /// (an f16 cache).
    pub fn block_values(&self, layer: usize, block: BlockId, head: usize) -> &[f16] {
        let c = &self.cfg;
        let first = (block as usize * c.n_kv_heads + head) * c.block_size;
        self.v[layer].f16_rows(first, c.block_size, c.head_dim_v)
    }

    /// The stored key of `head` at `slot` of `block` in `layer` (a quantized cache): one row
    /// of the cache's block type.
    pub fn key_blocks(&self, layer: usize, block: BlockId, head: usize, slot: usize) -> &[u8] {
        let c = &self.cfg;
        let row = (block as usize * c.n_kv_heads + head) * c.block_size + slot;
        self.k[layer].block_row(c.ty, row, c.head_dim_k)
    }

    /// The value of `head` at `slot` of `block` in `layer`, as f32 (any type).
    pub fn read_value(
        &self,
        layer: usize,
        block: BlockId,
        head: usize,
        slot: usize,
        out: &mut [f32],
    ) {
        let c = &self.cfg;
        let row = (block as usize * c.n_kv_heads + head) * c.block_size + slot;
        self.v[layer].read_row(c.ty, row, &mut out[..c.head_dim_v]);
    }

    /// The key of `head` at `slot` of `block` in `layer`, as f32 (any type).
    pub fn read_key(
        &self,
        layer: usize,
        block: BlockId,
        head: usize,
        slot: usize,
        out: &mut [f32],
    ) {
        let c = &self.cfg;
        let row = (block as usize * c.n_kv_heads + head) * c.block_size + slot;
        self.k[layer].read_row(c.ty, row, &mut out[..c.head_dim_k]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::TokenId;

    fn cache(n_blocks: usize) -> KvCache {
        KvCache::new(KvConfig {
            n_layers: 2,
            n_kv_heads: 2,
            head_dim_k: 4,
            head_dim_v: 4,
            block_size: 4,
            n_blocks,
            ty: KvType::F16,
        })
    }

    #[test]
    fn bytes_per_token_matches_formula_and_allocation() {
        // 2 (K and V) × layers × kv_heads × head_dim × 2 bytes.
        let c = cache(1);
        assert_eq!(c.config().bytes_per_token(), 2 * 2 * 2 * 4 * 2);
        // Rows of 64: f16 128 bytes, Q8_0 2 × 34, Q4_0 2 × 18.
        for (ty, row) in [(KvType::F16, 128), (KvType::Q8_0, 68), (KvType::Q4_0, 36)] {
            let c = KvCache::new(KvConfig {
                n_layers: 3,
                n_kv_heads: 2,
                head_dim_k: 64,
                head_dim_v: 64,
                block_size: 16,
                n_blocks: 5,
                ty,
            });
            assert_eq!(c.config().bytes_per_token(), 3 * 2 * 2 * row, "{ty}");
            assert_eq!(c.total_bytes(), c.config().bytes_per_token() * 16 * 5);
            let real: usize = c.k.iter().chain(&c.v).map(Plane::bytes).sum();
            assert_eq!(real, c.total_bytes(), "{ty}");
        }
        let odd = KvConfig {
            head_dim_k: 48,
            ty: KvType::Q8_0,
            ..*c.config()
        };
        assert!(odd.check().unwrap_err().contains("multiples of 32"));
    }

    #[test]
    fn blocks_are_allocated_and_returned() {
        let mut c = cache(4);
        let s = c.new_seq();
        c.reserve(s, 5).unwrap();
        c.commit(s, 5).unwrap();
        assert_eq!(c.used_blocks(), 2);
        assert_eq!(c.slot(s, 4).unwrap().1, 0);
        let t = c.new_seq();
        assert_eq!(
            c.reserve(t, 9),
            Err(KvError::OutOfBlocks { needed: 3, free: 2 })
        );
        assert_eq!(c.used_blocks(), 2, "a failed reserve takes nothing");
        c.free_seq(s).unwrap();
        assert_eq!(c.free_blocks(), 4);
        assert!(c.free_seq(s).is_err());
    }

    #[test]
    fn fork_shares_blocks_and_copies_partial_block_on_write() {
        let mut c = cache(8);
        let a = c.new_seq();
        c.reserve(a, 6).unwrap();
        for pos in 0..6 {
            let (b, slot) = c.slot(a, pos).unwrap();
            c.write(0, b, slot, &[pos as f32; 8], &[1.0; 8]);
        }
        c.commit(a, 6).unwrap();
        let b = c.fork_seq(a).unwrap();
        assert_eq!(c.used_blocks(), 2, "fork copies only the table");
        assert_eq!(c.blocks_needed(b, 1).unwrap(), 1);
        c.reserve(b, 1).unwrap();
        assert_eq!(c.used_blocks(), 3, "the partial last block was copied");
        assert_eq!(c.seq_blocks(a).unwrap()[0], c.seq_blocks(b).unwrap()[0]);
        assert_ne!(c.seq_blocks(a).unwrap()[1], c.seq_blocks(b).unwrap()[1]);
        // The copy holds the shared tokens.
        let (blk, slot) = c.slot(b, 5).unwrap();
        assert_eq!(c.block_keys(0, blk, 0)[slot * 4].to_f32(), 5.0);
        // Writing to the fork leaves the original alone.
        c.write(0, blk, 2, &[9.0; 8], &[9.0; 8]);
        let (ablk, _) = c.slot(a, 6 - 1).unwrap();
        assert_eq!(c.block_keys(0, ablk, 0)[2 * 4].to_f32(), 0.0);
        c.free_seq(a).unwrap();
        assert_eq!(c.used_blocks(), 2);
        c.free_seq(b).unwrap();
        assert_eq!(c.used_blocks(), 0);
    }

    /// Hashes for `n` tokens `0..n` of one sequence, blocks of 4.
    fn hashes(tokens: &[TokenId]) -> Vec<BlockHash> {
        let mut h = Vec::new();
        extend_block_hashes(tokens, |_| 0, 4, &mut h);
        h
    }

    /// A sequence of `tokens`, written (key = token id) and offered to the prefix cache.
    fn filled(c: &mut KvCache, tokens: &[TokenId]) -> SeqId {
        let s = c.new_seq();
        let h = hashes(tokens);
        let got = c.attach_cached(s, &h[..(tokens.len() - 1) / 4]).unwrap();
        c.reserve(s, tokens.len() - got).unwrap();
        for (pos, &t) in tokens.iter().enumerate().skip(got) {
            let (b, slot) = c.slot(s, pos).unwrap();
            c.write(0, b, slot, &[t as f32; 8], &[t as f32; 8]);
        }
        c.commit(s, tokens.len() - got).unwrap();
        c.offer_blocks(s, &h).unwrap();
        s
    }

    fn keys_of(c: &KvCache, s: SeqId) -> Vec<f32> {
        (0..c.seq_len(s).unwrap())
            .map(|p| {
                let (b, slot) = c.slot(s, p).unwrap();
                c.block_keys(0, b, 0)[slot * 4].to_f32()
            })
            .collect()
    }

    #[test]
    fn prefix_blocks_are_shared_and_outlive_their_sequence() {
        let mut c = cache(8);
        c.set_prefix_caching(true);
        let a_toks: Vec<TokenId> = (0..10).collect();
        let a = filled(&mut c, &a_toks);
        assert_eq!(
            c.cached_blocks(),
            2,
            "two full blocks cached, the partial one not"
        );
        // A second prompt sharing 9 tokens gets the two full blocks and computes the rest.
        let b_toks: Vec<TokenId> = (0..9).chain([50, 51, 52]).collect();
        let (found, parked) = c.lookup_prefix(&hashes(&b_toks));
        assert_eq!((found, parked), (2, 0));
        let b = filled(&mut c, &b_toks);
        assert_eq!(c.seq_blocks(a).unwrap()[..2], c.seq_blocks(b).unwrap()[..2]);
        assert_eq!(
            keys_of(&c, b),
            b_toks.iter().map(|&t| t as f32).collect::<Vec<_>>()
        );
        assert_eq!(c.used_blocks(), 3 + 1, "a: 3 blocks, b: 1 of its own");
        // Both end: the cached blocks stay, parked, and count as free.
        let a_blocks = c.seq_blocks(a).unwrap().to_vec();
        c.free_seq(a).unwrap();
        c.free_seq(b).unwrap();
        assert_eq!(c.used_blocks(), 0);
        assert_eq!(c.free_blocks(), 8);
        assert_eq!(
            c.cached_blocks(),
            3,
            "b's third block (8..12) is cached too"
        );
        assert_eq!(c.lookup_prefix(&hashes(&b_toks)), (3, 3));
        // A prompt that is exactly two cached blocks recomputes its last block (the last
        // token's logits are needed), so it takes one.
        let d = filled(&mut c, &a_toks[..8]);
        assert_eq!(c.seq_blocks(d).unwrap()[0], a_blocks[0]);
        assert_ne!(c.seq_blocks(d).unwrap()[1], a_blocks[1]);
    }

    #[test]
    fn cached_blocks_are_evicted_least_recently_used_and_only_when_needed() {
        let mut c = cache(4);
        c.set_prefix_caching(true);
        let x: Vec<TokenId> = (0..4).collect();
        let y: Vec<TokenId> = (100..104).collect();
        let sx = filled(&mut c, &x);
        let sy = filled(&mut c, &y);
        c.free_seq(sx).unwrap(); // released first: evicted first
        c.free_seq(sy).unwrap();
        assert_eq!(c.cached_blocks(), 2);
        // Two free blocks are taken before any cached one.
        let s = c.new_seq();
        c.reserve(s, 8).unwrap();
        assert_eq!(c.cached_blocks(), 2, "free blocks go first");
        c.reserve(s, 12).unwrap(); // a third block: evicts x's (least recently used)
        assert_eq!(c.lookup_prefix(&hashes(&x)), (0, 0));
        assert_eq!(c.lookup_prefix(&hashes(&y)), (1, 1));
        assert_eq!(
            c.reserve(s, 20),
            Err(KvError::OutOfBlocks { needed: 2, free: 1 }),
            "evictable blocks count as free"
        );
    }

    #[test]
    fn a_sequence_cut_back_into_a_cached_block_does_not_change_the_cache() {
        let mut c = cache(8);
        c.set_prefix_caching(true);
        let toks: Vec<TokenId> = (0..8).collect();
        let a = filled(&mut c, &toks);
        let b = filled(&mut c, &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(c.seq_blocks(a).unwrap()[1], c.seq_blocks(b).unwrap()[1]);
        // b rolls back into the shared cached block and writes: copy-on-write.
        c.truncate(b, 6).unwrap();
        c.reserve(b, 1).unwrap();
        let (blk, slot) = c.slot(b, 6).unwrap();
        assert_ne!(blk, c.seq_blocks(a).unwrap()[1]);
        c.write(0, blk, slot, &[77.0; 8], &[77.0; 8]);
        c.commit(b, 1).unwrap();
        assert_eq!(keys_of(&c, a), (0..8).map(|t| t as f32).collect::<Vec<_>>());
        // a alone rolls back into its cached block: the block leaves the cache first.
        c.free_seq(b).unwrap();
        c.truncate(a, 5).unwrap();
        assert_eq!(c.lookup_prefix(&hashes(&toks)), (1, 0));
        c.reserve(a, 1).unwrap();
        let (blk, slot) = c.slot(a, 5).unwrap();
        c.write(0, blk, slot, &[55.0; 8], &[55.0; 8]);
        // Turning caching off drops every cached prefix.
        c.free_seq(a).unwrap();
        c.set_prefix_caching(false);
        assert_eq!(c.cached_blocks(), 0);
        assert_eq!(c.free_blocks(), 8);
    }

    #[test]
    fn evicting_the_middle_keeps_the_ends_and_frees_the_rest() {
        let mut c = cache(8);
        c.set_prefix_caching(true);
        let toks: Vec<TokenId> = (0..16).collect();
        let other = filled(&mut c, &toks); // `s` takes its 4 blocks
        let s = filled(&mut c, &(0..18).collect::<Vec<_>>());
        assert_eq!(c.used_blocks(), 4 + 1);
        c.evict_blocks(s, 1, 2).unwrap();
        assert_eq!(c.seq_len(s).unwrap(), 10);
        assert_eq!(
            keys_of(&c, s),
            [0., 1., 2., 3., 12., 13., 14., 15., 16., 17.]
        );
        // Block 1 of `s` (tokens 12..16) is still `other`'s and cached: made private, it is
        // copied, and rewriting it leaves `other` alone.
        assert_eq!(c.seq_blocks(s).unwrap()[1], c.seq_blocks(other).unwrap()[3]);
        c.make_private(s, 1).unwrap();
        assert_ne!(c.seq_blocks(s).unwrap()[1], c.seq_blocks(other).unwrap()[3]);
        for (i, &b) in c.seq_blocks(s).unwrap().to_vec().iter().enumerate().skip(1) {
            let n = if i == 1 { 4 } else { 2 };
            c.update_keys(0, b, 0..n, |_, k| k.iter_mut().for_each(|x| *x += 100.0));
        }
        assert_eq!(
            keys_of(&c, s),
            [0., 1., 2., 3., 112., 113., 114., 115., 116., 117.]
        );
        assert_eq!(
            keys_of(&c, other),
            (0..16).map(|t| t as f32).collect::<Vec<_>>()
        );
        assert!(c.evict_blocks(s, 1, 5).is_err(), "past the end");
    }

    #[test]
    fn truncate_frees_blocks() {
        let mut c = cache(4);
        let s = c.new_seq();
        c.reserve(s, 10).unwrap();
        c.commit(s, 10).unwrap();
        assert_eq!(c.used_blocks(), 3);
        c.truncate(s, 4).unwrap();
        assert_eq!(c.used_blocks(), 1);
        assert_eq!(c.seq_len(s).unwrap(), 4);
        assert!(c.truncate(s, 5).is_err());
    }
}
