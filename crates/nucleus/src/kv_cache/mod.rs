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
mod window;

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
        let have = self.table(seq)?.blocks.len();
        if let Some(last) = last {
            if len % bs != 0 && n > 0 && self.refcount[last as usize] > 1 {
                self.copy_on_write(seq, have - 1)?;
            }
        }
        for _ in have..(len + n).div_ceil(bs) {
            let b = self.alloc_block();
            self.table_mut(seq)?.blocks.push(b);
        }
        Ok(())
    }

    /// Gives `seq` its own copy of its block `i`, which other sequences share (the caller
    /// checked that a block is free).
    fn copy_on_write(&mut self, seq: SeqId, i: usize) -> Result<(), KvError> {
        let shared = self.table(seq)?.blocks[i];
        let copy = self.alloc_block();
        self.copy_block(shared, copy);
        self.release(shared);
        self.table_mut(seq)?.blocks[i] = copy;
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

    /// The row of `head` at `slot` of `block` in a plane (`[block][kv_head][slot]`).
    fn row(&self, block: BlockId, head: usize, slot: usize) -> usize {
        let c = &self.cfg;
        (block as usize * c.n_kv_heads + head) * c.block_size + slot
    }

    /// The stored key of `head` at `slot` of `block` in `layer` (a quantized cache): one row
    /// of the cache's block type.
    pub fn key_blocks(&self, layer: usize, block: BlockId, head: usize, slot: usize) -> &[u8] {
        let c = &self.cfg;
        self.k[layer].block_row(c.ty, self.row(block, head, slot), c.head_dim_k)
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
        self.v[layer].read_row(c.ty, self.row(block, head, slot), &mut out[..c.head_dim_v]);
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
        self.k[layer].read_row(c.ty, self.row(block, head, slot), &mut out[..c.head_dim_k]);
    }
}

#[cfg(test)]
mod tests;
