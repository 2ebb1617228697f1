//! The KV cache: fixed-size blocks from one preallocated pool, a block table per sequence, only
//! the KV heads stored (GQA/MQA), f16 storage.
//!
//! Blocks are reference-counted so that sequences can share a prefix (a forked beam, a common
//! system prompt): forking copies only the block table, and a shared block is copied before it
//! is written (copy-on-write), which can only happen to the partial last block.

use half::f16;

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
}

impl KvConfig {
    /// Bytes of K and V per token: 2 bytes × layers × kv_heads × (head_dim_k + head_dim_v).
    pub fn bytes_per_token(&self) -> usize {
        2 * self.n_layers * self.n_kv_heads * (self.head_dim_k + self.head_dim_v)
    }

    pub fn bytes_per_block(&self) -> usize {
        self.bytes_per_token() * self.block_size
    }
}

#[derive(Clone, Debug, Default)]
struct BlockTable {
    blocks: Vec<BlockId>,
    len: usize,
}

pub struct KvCache {
    cfg: KvConfig,
    /// Per layer: `[block][kv_head][slot][head_dim]` so that one head's keys in a block are
    /// contiguous for attention.
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    refcount: Vec<u32>,
    free: Vec<BlockId>,
    seqs: Vec<Option<BlockTable>>,
}

impl KvCache {
    pub fn new(cfg: KvConfig) -> KvCache {
        assert!(cfg.block_size > 0 && cfg.n_blocks > 0 && cfg.n_blocks <= u32::MAX as usize);
        let k_len = cfg.n_blocks * cfg.n_kv_heads * cfg.block_size * cfg.head_dim_k;
        let v_len = cfg.n_blocks * cfg.n_kv_heads * cfg.block_size * cfg.head_dim_v;
        KvCache {
            cfg,
            k: (0..cfg.n_layers).map(|_| vec![f16::ZERO; k_len]).collect(),
            v: (0..cfg.n_layers).map(|_| vec![f16::ZERO; v_len]).collect(),
            refcount: vec![0; cfg.n_blocks],
            // Pop from the end: hand out low block numbers first.
            free: (0..cfg.n_blocks as BlockId).rev().collect(),
            seqs: Vec::new(),
        }
    }

    pub fn config(&self) -> &KvConfig {
        &self.cfg
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    pub fn used_blocks(&self) -> usize {
        self.cfg.n_blocks - self.free.len()
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
            self.free.push(b);
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
        let keep = len.div_ceil(bs);
        let dropped: Vec<BlockId> = t.blocks.drain(keep..).collect();
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
        if needed > self.free.len() {
            return Err(KvError::OutOfBlocks {
                needed,
                free: self.free.len(),
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

    fn alloc_block(&mut self) -> BlockId {
        let b = self.free.pop().expect("caller checked free blocks");
        self.refcount[b as usize] = 1;
        b
    }

    fn copy_block(&mut self, from: BlockId, to: BlockId) {
        let (kb, vb) = self.block_elems();
        for layer in 0..self.cfg.n_layers {
            let (f, t) = (from as usize, to as usize);
            self.k[layer].copy_within(f * kb..(f + 1) * kb, t * kb);
            self.v[layer].copy_within(f * vb..(f + 1) * vb, t * vb);
        }
    }

    /// Elements of K and of V in one block of one layer.
    fn block_elems(&self) -> (usize, usize) {
        let c = &self.cfg;
        (
            c.n_kv_heads * c.block_size * c.head_dim_k,
            c.n_kv_heads * c.block_size * c.head_dim_v,
        )
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

    /// Writes one token's keys and values (all KV heads, f32 in, f16 stored) for one layer.
    pub fn write(&mut self, layer: usize, block: BlockId, slot: usize, k: &[f32], v: &[f32]) {
        let c = self.cfg;
        debug_assert_eq!(k.len(), c.n_kv_heads * c.head_dim_k);
        debug_assert_eq!(v.len(), c.n_kv_heads * c.head_dim_v);
        for h in 0..c.n_kv_heads {
            let ko = ((block as usize * c.n_kv_heads + h) * c.block_size + slot) * c.head_dim_k;
            let src = &k[h * c.head_dim_k..(h + 1) * c.head_dim_k];
            for (d, s) in self.k[layer][ko..ko + c.head_dim_k].iter_mut().zip(src) {
                *d = f16::from_f32(*s);
            }
            let vo = ((block as usize * c.n_kv_heads + h) * c.block_size + slot) * c.head_dim_v;
            let src = &v[h * c.head_dim_v..(h + 1) * c.head_dim_v];
            for (d, s) in self.v[layer][vo..vo + c.head_dim_v].iter_mut().zip(src) {
                *d = f16::from_f32(*s);
            }
        }
    }

    /// Keys of one KV head in one block of one layer: `block_size` rows of `head_dim_k`.
    pub fn block_keys(&self, layer: usize, block: BlockId, head: usize) -> &[f16] {
        let c = &self.cfg;
        let n = c.block_size * c.head_dim_k;
        let o = (block as usize * c.n_kv_heads + head) * n;
        &self.k[layer][o..o + n]
    }

    /// Values of one KV head in one block of one layer: `block_size` rows of `head_dim_v`.
    pub fn block_values(&self, layer: usize, block: BlockId, head: usize) -> &[f16] {
        let c = &self.cfg;
        let n = c.block_size * c.head_dim_v;
        let o = (block as usize * c.n_kv_heads + head) * n;
        &self.v[layer][o..o + n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(n_blocks: usize) -> KvCache {
        KvCache::new(KvConfig {
            n_layers: 2,
            n_kv_heads: 2,
            head_dim_k: 4,
            head_dim_v: 4,
            block_size: 4,
            n_blocks,
        })
    }

    #[test]
    fn bytes_per_token_matches_formula() {
        // 2 (K and V) × layers × kv_heads × head_dim × 2 bytes.
        let c = cache(1);
        assert_eq!(c.config().bytes_per_token(), 2 * 2 * 2 * 4 * 2);
        assert_eq!(c.total_bytes(), c.config().bytes_per_token() * 4);
        let real: usize = c.k.iter().chain(&c.v).map(|l| l.len() * 2).sum();
        assert_eq!(real, c.total_bytes());
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
