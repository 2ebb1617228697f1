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
//!
//! Layers with a sliding window (gemma-3's local layers) keep their blocks in a second pool
//! ([`pool`]) that holds only each sequence's window: blocks that fall out of it are freed
//! ([`sliding`]). A sequence has one block table per pool, indexed alike (block `i` holds
//! positions `i·block_size..`), with holes where the window pool freed a block.

mod events;
mod pool;
mod prefix;
mod sliding;
mod storage;
mod window;

pub use events::KvEvent;
pub use pool::NO_BLOCK;
pub use prefix::{extend_block_hashes, BlockHash};
pub use sliding::{window_blocks_per_seq, SlidingWindow, PINNED_BLOCKS};
pub use storage::KvType;

use half::f16;
use pool::Pool;

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
    #[error(
        "sequence {seq}: its sliding-window layers no longer hold the window of position {pos}"
    )]
    WindowGone { seq: SeqId, pos: usize },
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
    /// The sliding-window layers and their pool, when the model has such layers.
    pub sliding: Option<SlidingWindow>,
}

impl KvConfig {
    /// Bytes of K and V per token in one layer: kv_heads × (a key row + a value row), rows of
    /// f16 (2 bytes a value) or of 32-value blocks (Q8_0: 34 bytes, Q4_0: 18).
    pub fn layer_bytes_per_token(&self) -> usize {
        let ty = self.ty;
        self.n_kv_heads * (ty.row_bytes(self.head_dim_k) + ty.row_bytes(self.head_dim_v))
    }

    /// Bytes of K and V per token held in every layer.
    pub fn bytes_per_token(&self) -> usize {
        self.n_layers * self.layer_bytes_per_token()
    }

    /// Whether `layer` has a sliding window (its blocks live in the window pool).
    pub fn is_window_layer(&self, layer: usize) -> bool {
        self.sliding.is_some_and(|s| s.has_layer(layer))
    }

    /// Layers with a sliding window.
    pub fn window_layers(&self) -> usize {
        (0..self.n_layers)
            .filter(|&l| self.is_window_layer(l))
            .count()
    }

    /// Bytes per token of the layers that keep the whole context: what each token of a long
    /// context costs once the windows are full.
    pub fn full_bytes_per_token(&self) -> usize {
        (self.n_layers - self.window_layers()) * self.layer_bytes_per_token()
    }

    /// Bytes per token of the sliding-window layers (held for the window only).
    pub fn window_bytes_per_token(&self) -> usize {
        self.window_layers() * self.layer_bytes_per_token()
    }

    /// Bytes of both pools.
    pub fn total_bytes(&self) -> usize {
        let window_blocks = self.sliding.map_or(0, |s| s.n_blocks);
        self.block_size
            * (self.full_bytes_per_token() * self.n_blocks
                + self.window_bytes_per_token() * window_blocks)
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

    /// Sizes the sliding-window pool (if any) for `seqs` sequences running at once, each
    /// appending at most `chunk` tokens per forward, plus `extra_blocks` for blocks of forks
    /// (beams); never larger than the full-context pool. The sequences must keep to that:
    /// a forward beyond it fails with [`KvError::OutOfBlocks`].
    pub fn fit_window_pool(mut self, seqs: usize, chunk: usize, extra_blocks: usize) -> KvConfig {
        if let Some(s) = &mut self.sliding {
            let per_seq = window_blocks_per_seq(s.window, chunk.max(1), self.block_size);
            s.n_blocks = seqs
                .max(1)
                .saturating_mul(per_seq)
                .saturating_add(extra_blocks)
                .min(self.n_blocks);
        }
        self
    }

    /// Bytes of a block of the full-context pool (every layer when there is no window pool).
    pub fn bytes_per_block(&self) -> usize {
        self.full_bytes_per_token() * self.block_size
    }
}
#[derive(Clone, Debug, Default)]
struct BlockTable {
    /// Tokens in the sequence.
    len: usize,
    /// Per pool, the blocks holding positions `i·block_size..` ([`NO_BLOCK`] where a window
    /// pool freed them).
    blocks: Vec<Vec<BlockId>>,
    /// Blocks `[0, offered)` have been offered to the prefix cache.
    offered: usize,
}

/// Where one token's keys and values go: its block in each pool and its slot in the blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSlot {
    blocks: [BlockId; 2],
    pub slot: usize,
}

pub struct KvCache {
    cfg: KvConfig,
    /// Pool 0 holds the layers that see the whole context; pool 1, when present, the
    /// sliding-window layers.
    pools: Vec<Pool>,
    /// Per layer: (pool, index of the layer in its pool).
    layer_pool: Vec<(usize, usize)>,
    seqs: Vec<Option<BlockTable>>,
    prefix_caching: bool,
    /// Tokens a sequence may be cut back by (speculative decoding's rejected drafts): a window
    /// pool keeps the window of that much earlier a position.
    rollback_slack: usize,
}

impl KvCache {
    /// A cache as `cfg` says. Panics when the head dimensions do not fit the type (check with
    /// [`KvConfig::check`] first).
    pub fn new(cfg: KvConfig) -> KvCache {
        assert!(cfg.block_size > 0 && cfg.n_blocks > 0 && cfg.n_blocks < u32::MAX as usize);
        assert_eq!(cfg.check(), Ok(()));
        let mut layer_pool = Vec::with_capacity(cfg.n_layers);
        let mut counts = [0usize; 2];
        for l in 0..cfg.n_layers {
            let p = usize::from(cfg.is_window_layer(l));
            layer_pool.push((p, counts[p]));
            counts[p] += 1;
        }
        let mut pools = vec![Pool::new(&cfg, counts[0], cfg.n_blocks, None)];
        if let Some(s) = cfg.sliding.filter(|_| counts[1] > 0) {
            assert!(s.window > 0 && s.n_blocks > 0 && s.n_blocks < u32::MAX as usize);
            pools.push(Pool::new(&cfg, counts[1], s.n_blocks, Some(s.window)));
        }
        KvCache {
            cfg,
            pools,
            layer_pool,
            seqs: Vec::new(),
            prefix_caching: false,
            rollback_slack: 0,
        }
    }

    /// Lets every sequence be cut back ([`truncate`](Self::truncate)) by up to `tokens` from
    /// its length at any time: a sliding-window pool then keeps that many more positions (its
    /// pool must have room for them: size it with them added to the chunk).
    pub fn set_rollback_slack(&mut self, tokens: usize) {
        self.rollback_slack = tokens;
    }

    pub fn config(&self) -> &KvConfig {
        &self.cfg
    }

    /// Blocks of the full-context pool a sequence can get: free ones and cached ones no
    /// sequence uses (evicted when taken). The window pool is sized so that it never runs out
    /// first (see [`window_blocks_per_seq`]).
    pub fn free_blocks(&self) -> usize {
        self.pools[0].available()
    }

    /// Blocks of the full-context pool that sequences use.
    pub fn used_blocks(&self) -> usize {
        self.cfg.n_blocks - self.free_blocks()
    }

    /// Blocks of the sliding-window pool that sequences use (0 without one).
    pub fn window_used_blocks(&self) -> usize {
        self.pools.get(1).map_or(0, |p| p.n_blocks - p.available())
    }

    /// Bytes the pools take.
    pub fn total_bytes(&self) -> usize {
        self.cfg.total_bytes()
    }

    /// Tokens the pool can hold in all.
    pub fn capacity_tokens(&self) -> usize {
        self.cfg.n_blocks * self.cfg.block_size
    }

    pub fn new_seq(&mut self) -> SeqId {
        let table = BlockTable {
            blocks: vec![Vec::new(); self.pools.len()],
            ..BlockTable::default()
        };
        if let Some(i) = self.seqs.iter().position(|s| s.is_none()) {
            self.seqs[i] = Some(table);
            return i;
        }
        self.seqs.push(Some(table));
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

    /// The blocks of a sequence in the full-context pool, in order.
    pub fn seq_blocks(&self, seq: SeqId) -> Result<&[BlockId], KvError> {
        Ok(&self.table(seq)?.blocks[0])
    }

    /// The blocks of a sequence that `layer` reads, in order ([`NO_BLOCK`] for positions out
    /// of a sliding window).
    pub fn layer_blocks(&self, layer: usize, seq: SeqId) -> Result<&[BlockId], KvError> {
        Ok(&self.table(seq)?.blocks[self.layer_pool[layer].0])
    }

    /// Ends a sequence and returns its blocks to the pools (shared blocks stay with their
    /// other owners).
    pub fn free_seq(&mut self, seq: SeqId) -> Result<(), KvError> {
        let table = self
            .seqs
            .get_mut(seq)
            .and_then(|s| s.take())
            .ok_or(KvError::UnknownSeq(seq))?;
        for (pool, blocks) in self.pools.iter_mut().zip(table.blocks) {
            for b in blocks {
                pool.release(b);
            }
        }
        Ok(())
    }

    /// A new sequence sharing all of `src`'s blocks; only the block tables are copied.
    pub fn fork_seq(&mut self, src: SeqId) -> Result<SeqId, KvError> {
        let table = self.table(src)?.clone();
        for (pool, blocks) in self.pools.iter_mut().zip(&table.blocks) {
            for &b in blocks {
                pool.retain(b);
            }
        }
        let id = self.new_seq();
        self.seqs[id] = Some(table);
        Ok(id)
    }

    /// Shortens a sequence to `len` tokens (speculative decoding's rollback), freeing blocks
    /// past the end. A sliding-window pool must still hold the window of position `len`.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        let t = self.table(seq)?;
        if len > t.len {
            return Err(KvError::BadTruncate {
                seq,
                len: t.len,
                to: len,
            });
        }
        self.check_window(seq, &t.blocks, len)?;
        let t = self.table_mut(seq)?;
        t.len = len;
        t.offered = t.offered.min(len / bs);
        let keep = len.div_ceil(bs);
        let dropped: Vec<Vec<BlockId>> = t
            .blocks
            .iter_mut()
            .map(|b| b.drain(keep..).collect())
            .collect();
        let last = (!len.is_multiple_of(bs))
            .then(|| t.blocks.iter().map(|b| b[keep - 1]).collect::<Vec<_>>());
        for (p, pool) in self.pools.iter_mut().enumerate() {
            // The last block is partial again and will be written: it no longer holds its
            // prefix. (When other sequences share it, the write copies it first; the cached
            // prefix stays.)
            if let Some(last) = &last {
                let b = last[p];
                if b != NO_BLOCK && pool.refcount[b as usize] == 1 {
                    pool.prefix.unregister(b);
                }
            }
            for &b in &dropped[p] {
                pool.release(b);
            }
        }
        Ok(())
    }

    /// Blocks of the full-context pool needed to grow `seq` by `n` tokens (including a copy of
    /// a shared partial block).
    pub fn blocks_needed(&self, seq: SeqId, n: usize) -> Result<usize, KvError> {
        Ok(self.pool_blocks_needed(0, self.table(seq)?, n))
    }

    /// Blocks pool `p` needs to grow a sequence by `n` tokens: new blocks, a copy of a shared
    /// partial last block, less what a window pool frees first.
    fn pool_blocks_needed(&self, p: usize, t: &BlockTable, n: usize) -> usize {
        let bs = self.cfg.block_size;
        let pool = &self.pools[p];
        let blocks = &t.blocks[p];
        let new_blocks = (t.len + n).div_ceil(bs) - blocks.len();
        let cow =
            !t.len.is_multiple_of(bs) && n > 0 && blocks.last().is_some_and(|&b| pool.is_shared(b));
        let freed = self.freeable(p, t);
        (new_blocks + cow as usize).saturating_sub(freed)
    }

    /// Makes room for `n` more tokens of `seq`: allocates blocks, and copies a shared partial
    /// last block so that writing to it does not change another sequence. All or nothing.
    pub fn reserve(&mut self, seq: SeqId, n: usize) -> Result<(), KvError> {
        self.reserve_batch(&[(seq, n)])
    }

    /// [`reserve`](Self::reserve) for several sequences (distinct), all or nothing.
    pub fn reserve_batch(&mut self, wants: &[(SeqId, usize)]) -> Result<(), KvError> {
        for p in 0..self.pools.len() {
            let mut needed = 0;
            for &(seq, n) in wants {
                needed += self.pool_blocks_needed(p, self.table(seq)?, n);
            }
            let free = self.pools[p].available();
            if needed > free {
                return Err(KvError::OutOfBlocks { needed, free });
            }
        }
        for &(seq, n) in wants {
            self.grow(seq, n)?;
        }
        Ok(())
    }

    fn grow(&mut self, seq: SeqId, n: usize) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        self.trim_window(seq)?;
        for p in 0..self.pools.len() {
            let t = self.table(seq)?;
            let (len, have) = (t.len, t.blocks[p].len());
            if let Some(&last) = t.blocks[p].last() {
                if !len.is_multiple_of(bs) && n > 0 && self.pools[p].is_shared(last) {
                    self.copy_on_write(seq, p, have - 1)?;
                }
            }
            for _ in have..(len + n).div_ceil(bs) {
                let b = self.pools[p].alloc();
                self.table_mut(seq)?.blocks[p].push(b);
            }
        }
        Ok(())
    }

    /// Gives `seq` its own copy of its block `i` in pool `p`, which other sequences share (the
    /// caller checked that a block is free).
    fn copy_on_write(&mut self, seq: SeqId, p: usize, i: usize) -> Result<(), KvError> {
        let shared = self.table(seq)?.blocks[p][i];
        let cfg = self.cfg;
        let pool = &mut self.pools[p];
        let copy = pool.alloc();
        pool.copy_block(&cfg, shared, copy);
        pool.release(shared);
        self.table_mut(seq)?.blocks[p][i] = copy;
        Ok(())
    }

    /// Marks `n` tokens as appended to `seq` (after [`reserve`](Self::reserve) and the writes).
    pub fn commit(&mut self, seq: SeqId, n: usize) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        let t = self.table_mut(seq)?;
        assert!(
            t.len + n <= t.blocks[0].len() * bs,
            "commit past reserved blocks"
        );
        t.len += n;
        Ok(())
    }

    /// Where token position `pos` of `seq` lives in the full-context pool: (block, slot). The
    /// position must be reserved.
    pub fn slot(&self, seq: SeqId, pos: usize) -> Result<(BlockId, usize), KvError> {
        let s = self.position(seq, pos)?;
        Ok((s.blocks[0], s.slot))
    }

    /// Where token position `pos` of `seq` lives in every pool. The position must be reserved.
    pub fn position(&self, seq: SeqId, pos: usize) -> Result<KvSlot, KvError> {
        let t = self.table(seq)?;
        let bs = self.cfg.block_size;
        let mut blocks = [NO_BLOCK; 2];
        for (p, b) in t.blocks.iter().enumerate() {
            blocks[p] = *b.get(pos / bs).ok_or(KvError::UnknownSeq(seq))?;
        }
        Ok(KvSlot {
            blocks,
            slot: pos % bs,
        })
    }

    /// Writes one token's keys and values (all KV heads, f32 in, stored in the cache's type)
    /// for one layer, at a position from [`position`](Self::position).
    pub fn write_at(&mut self, layer: usize, at: &KvSlot, k: &[f32], v: &[f32]) {
        let (p, li) = self.layer_pool[layer];
        self.pools[p].write(&self.cfg, li, at.blocks[p], at.slot, k, v);
    }

    /// [`write_at`](Self::write_at) with the block of `layer`'s pool given.
    pub fn write(&mut self, layer: usize, block: BlockId, slot: usize, k: &[f32], v: &[f32]) {
        let (p, li) = self.layer_pool[layer];
        self.pools[p].write(&self.cfg, li, block, slot, k, v);
    }

    /// Keys of one KV head in one block of one layer: `block_size` rows of `head_dim_k`
    /// (an f16 cache).
    pub fn block_keys(&self, layer: usize, block: BlockId, head: usize) -> &[f16] {
        let (p, li) = self.layer_pool[layer];
        self.pools[p].f16_keys(&self.cfg, li, block, head)
    }

    /// Values of one KV head in one block of one layer: `block_size` rows of `head_dim_v`
    /// (an f16 cache).
    pub fn block_values(&self, layer: usize, block: BlockId, head: usize) -> &[f16] {
        let (p, li) = self.layer_pool[layer];
        self.pools[p].f16_values(&self.cfg, li, block, head)
    }

    /// The stored key of `head` at `slot` of `block` in `layer` (a quantized cache): one row
    /// of the cache's block type.
    pub fn key_blocks(&self, layer: usize, block: BlockId, head: usize, slot: usize) -> &[u8] {
        let (p, li) = self.layer_pool[layer];
        self.pools[p].key_row(&self.cfg, li, block, head, slot)
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
        let (p, li) = self.layer_pool[layer];
        let c = &self.cfg;
        let r = pool::row(c, block, head, slot);
        self.pools[p].v[li].read_row(c.ty, r, &mut out[..c.head_dim_v]);
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
        let (p, li) = self.layer_pool[layer];
        let c = &self.cfg;
        let r = pool::row(c, block, head, slot);
        self.pools[p].k[li].read_row(c.ty, r, &mut out[..c.head_dim_k]);
    }
}

#[cfg(test)]
mod tests;
