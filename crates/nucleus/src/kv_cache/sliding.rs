//! Sliding-window layers hold only their window.
//!
//! A query at position `p` of a layer with window `w` sees positions `p+1-w ..= p` (see
//! `model::attention::visible_range`). The next query of a sequence of `len` tokens is at
//! `len`, and a sequence only grows (or is cut back no further than its length at its last
//! [`reserve`](KvCache::reserve)), so the blocks wholly before `len+1-w` are never read again:
//! [`reserve`](KvCache::reserve) frees them from the window pool before it allocates, leaving
//! [`NO_BLOCK`] in the table. (With a rollback slack of `s` tokens, speculative decoding's,
//! it keeps the window of position `len - s` instead.) The first [`PINNED_BLOCKS`] blocks are kept: after a streamed
//! context evicts its middle (`engine::context`), the sequence is shorter and its first
//! positions, the attention sinks, may be inside the window again.
//!
//! Each sequence then holds at most [`window_blocks_per_seq`] blocks of the window pool, so a
//! pool of that many blocks per sequence that can run at once never runs out before the
//! full-context pool does: the scheduler and the sessions size it so, and admit sequences by
//! the full-context pool alone.
//!
//! A cached prefix of `k` blocks is usable when the full-context pool has all `k` and the
//! window pool has the pinned blocks and those of the window of position `k·block_size`.

use super::pool::NO_BLOCK;
use super::{BlockHash, BlockId, BlockTable, KvCache, KvError, SeqId};

/// Leading blocks of a sequence the window pool keeps whatever the window (the attention
/// sinks of a streamed context).
pub const PINNED_BLOCKS: usize = 1;

/// The sliding-window layers of a cache and the size of their pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Positions a query of these layers sees, itself included.
    pub window: usize,
    /// Bit `l` set: layer `l` has the window (layers from 128 on keep the whole context).
    pub layers: u128,
    /// Blocks of the window pool.
    pub n_blocks: usize,
}

impl SlidingWindow {
    pub fn has_layer(&self, layer: usize) -> bool {
        layer < 128 && self.layers >> layer & 1 == 1
    }
}

/// Window-pool blocks one sequence holds at most when each forward appends at most `chunk`
/// of its tokens: the pinned ones, and those covering the `window - 1` positions before the
/// chunk and the chunk itself, which may straddle one more block boundary.
pub fn window_blocks_per_seq(window: usize, chunk: usize, block_size: usize) -> usize {
    PINNED_BLOCKS + (window + chunk).div_ceil(block_size) + 1
}

/// Blocks before this one are out of the window of a query at position `len`.
fn first_needed(len: usize, window: usize, block_size: usize) -> usize {
    (len + 1).saturating_sub(window) / block_size
}

impl KvCache {
    /// Blocks of window pool `p` that [`trim_window`](Self::trim_window) would return to it
    /// now (0 for the full-context pool).
    pub(super) fn freeable(&self, p: usize, t: &BlockTable) -> usize {
        let Some(w) = self.pools[p].window else {
            return 0;
        };
        let len = t.len.saturating_sub(self.rollback_slack);
        let end = first_needed(len, w, self.cfg.block_size).min(t.blocks[p].len());
        t.blocks[p][PINNED_BLOCKS.min(end)..end]
            .iter()
            .filter(|&&b| b != NO_BLOCK && !self.pools[p].is_shared(b))
            .count()
    }

    /// Frees the blocks of `seq`'s window pools that no query of it will read again.
    pub(super) fn trim_window(&mut self, seq: SeqId) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        for p in 1..self.pools.len() {
            let w = self.pools[p]
                .window
                .expect("pools after the first have windows");
            let slack = self.rollback_slack;
            let t = self.table_mut(seq)?;
            let end = first_needed(t.len.saturating_sub(slack), w, bs).min(t.blocks[p].len());
            let gone: Vec<BlockId> = t.blocks[p][PINNED_BLOCKS.min(end)..end]
                .iter_mut()
                .map(|b| std::mem::replace(b, NO_BLOCK))
                .collect();
            for b in gone {
                self.pools[p].release(b);
            }
        }
        Ok(())
    }

    /// Whether the window pools of a table `blocks` still hold what a query at `len` reads.
    pub(super) fn check_window(
        &self,
        seq: SeqId,
        blocks: &[Vec<BlockId>],
        len: usize,
    ) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        for (p, pool) in self.pools.iter().enumerate().skip(1) {
            let w = pool.window.expect("pools after the first have windows");
            let needed = first_needed(len, w, bs)..len.div_ceil(bs);
            if needed.clone().any(|i| blocks[p].get(i) == Some(&NO_BLOCK)) {
                return Err(KvError::WindowGone { seq, pos: len });
            }
        }
        Ok(())
    }

    /// How many blocks of `hashes` a sequence that holds the first `from` of them can take
    /// from the prefix cache: the most `k` such that the full-context pool caches blocks
    /// `from..k` and every window pool the ones of them it keeps for a sequence of `k` blocks.
    pub(super) fn cached_run(&self, hashes: &[BlockHash], from: usize) -> usize {
        let full = &self.pools[0].prefix;
        let mut k = from;
        while k < hashes.len() && full.lookup(hashes[k]).is_some() {
            k += 1;
        }
        let bs = self.cfg.block_size;
        'shorter: while k > from {
            for pool in &self.pools[1..] {
                let w = pool.window.expect("pools after the first have windows");
                let kept = |i: usize| i < PINNED_BLOCKS || i >= first_needed(k * bs, w, bs);
                if (from..k).any(|i| kept(i) && pool.prefix.lookup(hashes[i]).is_none()) {
                    k -= 1;
                    continue 'shorter;
                }
            }
            break;
        }
        k
    }

    /// Appends cached blocks `from..k` of `hashes` to `seq` (which holds `from` full blocks),
    /// with holes in window pools for the blocks out of the window at the new length.
    pub(super) fn take_cached_run(
        &mut self,
        seq: SeqId,
        hashes: &[BlockHash],
        from: usize,
        k: usize,
    ) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        for p in 0..self.pools.len() {
            let first = self.pools[p]
                .window
                .map_or(0, |w| first_needed(k * bs, w, bs));
            for (i, &hash) in hashes.iter().enumerate().take(k).skip(from) {
                let b = if i < PINNED_BLOCKS || i >= first {
                    let b = self.pools[p]
                        .prefix
                        .lookup(hash)
                        .expect("cached_run checked");
                    self.pools[p].retain(b);
                    b
                } else {
                    NO_BLOCK
                };
                self.table_mut(seq)?.blocks[p].push(b);
            }
        }
        let t = self.table_mut(seq)?;
        t.len = k * bs;
        t.offered = k;
        self.trim_window(seq)
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // a position indexes the cache and the tokens alike
mod tests {
    use super::*;
    use crate::kv_cache::{extend_block_hashes, KvConfig, KvType};
    use crate::tokenizer::TokenId;

    const BS: usize = 4;
    const WINDOW: usize = 10;

    /// Three layers, the middle one with a window of 10; blocks of 4.
    fn config(n_blocks: usize, window_blocks: usize) -> KvConfig {
        KvConfig {
            n_layers: 3,
            n_kv_heads: 1,
            head_dim_k: 4,
            head_dim_v: 4,
            block_size: BS,
            n_blocks,
            ty: KvType::F16,
            sliding: Some(SlidingWindow {
                window: WINDOW,
                layers: 0b010,
                n_blocks: window_blocks,
            }),
        }
    }

    /// Appends `tokens` to `seq` in chunks of `chunk`, every layer's key = the token, and
    /// offers its full blocks to the prefix cache after each chunk.
    fn append(c: &mut KvCache, seq: SeqId, tokens: &[TokenId], all: &[TokenId], chunk: usize) {
        let mut h = Vec::new();
        extend_block_hashes(all, |_| 0, BS, &mut h);
        for part in tokens.chunks(chunk) {
            let start = c.seq_len(seq).unwrap();
            c.reserve(seq, part.len()).unwrap();
            for (i, &t) in part.iter().enumerate() {
                let at = c.position(seq, start + i).unwrap();
                for layer in 0..3 {
                    c.write_at(layer, &at, &[t as f32; 4], &[t as f32; 4]);
                }
            }
            c.commit(seq, part.len()).unwrap();
            c.offer_blocks(seq, &h, all).unwrap();
        }
    }

    /// The key of `layer` at position `pos` of `seq`, or `None` where the layer's pool freed it.
    fn key(c: &KvCache, layer: usize, seq: SeqId, pos: usize) -> Option<f32> {
        let b = c.layer_blocks(layer, seq).unwrap()[pos / BS];
        (b != NO_BLOCK).then(|| c.block_keys(layer, b, 0)[pos % BS * 4].to_f32())
    }

    #[test]
    fn window_layers_keep_their_window_and_the_first_block() {
        let mut c = KvCache::new(config(16, 16));
        let s = c.new_seq();
        let toks: Vec<TokenId> = (100..150).collect();
        for (n, &t) in toks.iter().enumerate() {
            append(&mut c, s, &[t], &toks, 1);
            let len = n + 1;
            // The next query (at `len`) sees len+1-10 ..= len: every position it needs is there.
            for pos in (len + 1).saturating_sub(WINDOW)..len {
                assert_eq!(
                    key(&c, 1, s, pos),
                    Some(toks[pos] as f32),
                    "len {len} pos {pos}"
                );
            }
            // The full-context layers keep everything.
            for pos in 0..len {
                assert_eq!(key(&c, 0, s, pos), Some(toks[pos] as f32));
                assert_eq!(key(&c, 2, s, pos), Some(toks[pos] as f32));
            }
            assert!(c.window_used_blocks() <= window_blocks_per_seq(WINDOW, 1, BS));
        }
        // 50 tokens, the last reserved at 49 (whose query saw 40..=49): blocks 0 (pinned)
        // and 10..12 (positions 40..50) remain.
        let table = c.layer_blocks(1, s).unwrap();
        let held: Vec<usize> = (0..table.len()).filter(|&i| table[i] != NO_BLOCK).collect();
        assert_eq!(held, [0, 10, 11, 12]);
        assert_eq!(key(&c, 1, s, 1), Some(101.0), "the pinned block");
        assert_eq!(c.used_blocks(), 13);
        assert_eq!(c.window_used_blocks(), 4);
        c.free_seq(s).unwrap();
        assert_eq!((c.used_blocks(), c.window_used_blocks()), (0, 0));
    }

    #[test]
    fn a_pool_sized_for_its_sequences_never_runs_out_first() {
        // Random sequences, chunks up to 7 tokens, forks and frees, with the window pool as
        // small as `fit_window_pool` makes it for 3 sequences: only the full-context pool
        // ever refuses a reserve.
        let chunk = 7;
        let cfg = config(64, 64).fit_window_pool(3, chunk, 0);
        let per_seq = window_blocks_per_seq(WINDOW, chunk, BS);
        assert_eq!(cfg.sliding.unwrap().n_blocks, 3 * per_seq);
        let mut c = KvCache::new(cfg);
        c.set_prefix_caching(true);
        let mut rng = 12345u64;
        let mut next = |m: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % m as u64) as usize
        };
        let mut live: Vec<(SeqId, Vec<TokenId>)> = Vec::new();
        let mut refused = 0;
        for _ in 0..3000 {
            match next(10) {
                0 if !live.is_empty() => {
                    let (s, _) = live.swap_remove(next(live.len()));
                    c.free_seq(s).unwrap();
                }
                1 if live.len() < 3 && !live.is_empty() => {
                    let (s, toks) = live[next(live.len())].clone();
                    live.push((c.fork_seq(s).unwrap(), toks));
                }
                2 if live.len() < 3 => {
                    // A new prompt sharing a prefix with earlier ones (a few distinct tokens).
                    let s = c.new_seq();
                    let toks: Vec<TokenId> =
                        (0..next(40) + 1).map(|_| next(2) as TokenId).collect();
                    let mut h = Vec::new();
                    extend_block_hashes(&toks, |_| 0, BS, &mut h);
                    let got = c.attach_cached(s, &h[..(toks.len() - 1) / BS]).unwrap();
                    live.push((s, toks[..got].to_vec()));
                }
                _ if !live.is_empty() => {
                    let i = next(live.len());
                    let n = next(chunk) + 1;
                    let s = live[i].0;
                    match c.reserve(s, n) {
                        Ok(()) => {
                            let new: Vec<TokenId> = (0..n).map(|_| next(2) as TokenId).collect();
                            let start = c.seq_len(s).unwrap();
                            for (k, &t) in new.iter().enumerate() {
                                let at = c.position(s, start + k).unwrap();
                                for layer in 0..3 {
                                    c.write_at(layer, &at, &[t as f32; 4], &[t as f32; 4]);
                                }
                            }
                            c.commit(s, n).unwrap();
                            live[i].1.extend(new);
                        }
                        Err(KvError::OutOfBlocks { .. }) => {
                            // Only when the full-context pool is short.
                            assert!(c.blocks_needed(s, n).unwrap() > c.free_blocks());
                            refused += 1;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                _ => {}
            }
            for (s, toks) in &live {
                let len = c.seq_len(*s).unwrap();
                assert_eq!(len, toks.len());
                let held = c
                    .layer_blocks(1, *s)
                    .unwrap()
                    .iter()
                    .filter(|&&b| b != NO_BLOCK);
                assert!(held.count() <= per_seq);
                for pos in (len + 1).saturating_sub(WINDOW)..len {
                    assert_eq!(key(&c, 1, *s, pos), Some(toks[pos] as f32));
                }
            }
        }
        assert!(
            refused > 0,
            "the full-context pool was never the limit: a weak test"
        );
    }

    #[test]
    fn cached_prefixes_need_the_window_of_their_end() {
        let mut c = KvCache::new(config(32, 32));
        c.set_prefix_caching(true);
        let toks: Vec<TokenId> = (0..30).collect();
        let a = c.new_seq();
        append(&mut c, a, &toks, &toks, 3);
        c.free_seq(a).unwrap();
        let mut h = Vec::new();
        extend_block_hashes(&toks, |_| 0, BS, &mut h);
        // All 7 full blocks: the window pool freed 1..4 but kept (and cached) 0 and those of
        // the last window.
        assert_eq!(c.lookup_prefix(&h), (7, 7));
        // A prompt that ends after 4 blocks needs the window pool's blocks 1..4: they were
        // offered before they left the window, so they are parked in its cache.
        assert_eq!(c.lookup_prefix(&h[..4]).0, 4);
        let b = c.new_seq();
        assert_eq!(c.attach_cached(b, &h).unwrap(), 28);
        for pos in 19..28 {
            assert_eq!(key(&c, 1, b, pos), Some(pos as f32));
        }
        assert_eq!(c.layer_blocks(1, b).unwrap()[1], NO_BLOCK);
        // Rolling back into the freed part of the window is refused, whole.
        assert_eq!(
            c.truncate(b, 8),
            Err(KvError::WindowGone { seq: b, pos: 8 })
        );
        assert_eq!(c.seq_len(b).unwrap(), 28);
        c.truncate(b, 26).unwrap();
        c.free_seq(b).unwrap();
        // Once the window pool has lost a block the end needs, the hit is shorter.
        let evict = c.pools[1].prefix.lookup(h[5]).unwrap();
        c.pools[1].prefix.unregister(evict);
        c.pools[1].free.push(evict);
        let (found, _) = c.lookup_prefix(&h);
        assert!(found < 6, "{found}");
        let t = c.new_seq();
        assert_eq!(c.attach_cached(t, &h).unwrap(), found * BS);
        let len = found * BS;
        for pos in (len + 1).saturating_sub(WINDOW)..len {
            assert_eq!(key(&c, 1, t, pos), Some(pos as f32));
        }
    }

    #[test]
    fn a_rollback_slack_keeps_the_window_of_earlier_positions() {
        let mut c = KvCache::new(config(32, 32));
        c.set_rollback_slack(6);
        let s = c.new_seq();
        let toks: Vec<TokenId> = (0..60).collect();
        for n in (0..60).step_by(7) {
            let part = &toks[n..(n + 7).min(60)];
            append(&mut c, s, part, &toks, 7);
            // Cut back by the slack, then grow again: always allowed.
            let len = c.seq_len(s).unwrap();
            c.truncate(s, len - 6).unwrap();
            append(&mut c, s, &toks[len - 6..len], &toks, 7);
        }
        let mut tight = KvCache::new(config(32, 32));
        let t = tight.new_seq();
        append(&mut tight, t, &toks, &toks, 7);
        assert!(matches!(
            tight.truncate(t, 50),
            Err(KvError::WindowGone { .. })
        ));
    }

    #[test]
    fn evicting_the_middle_keeps_what_the_window_reads() {
        let mut c = KvCache::new(config(32, 32));
        let s = c.new_seq();
        let toks: Vec<TokenId> = (0..40).collect();
        append(&mut c, s, &toks, &toks, 5);
        // Drop blocks 1..7 (positions 4..28): 12 tokens stay after the sink, all of them in
        // the window pool too.
        c.evict_blocks(s, 1, 6).unwrap();
        assert_eq!(c.seq_len(s).unwrap(), 16);
        let kept: Vec<Option<f32>> = (0..16).map(|p| key(&c, 1, s, p)).collect();
        let want = [0, 1, 2, 3, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39];
        assert_eq!(
            kept[7..],
            want[7..]
                .iter()
                .map(|&t| Some(t as f32))
                .collect::<Vec<_>>()
        );
        assert_eq!(kept[0], Some(0.0), "the pinned sink block");
        // Evicting after the pinned blocks never brings a freed block back into the window
        // (the freed ones go first); evicting after more sinks than are pinned may, and is
        // refused.
        let u = c.new_seq();
        append(&mut c, u, &toks, &toks, 5);
        assert_eq!(
            c.evict_blocks(u, 2, 8),
            Err(KvError::WindowGone { seq: u, pos: 8 })
        );
        assert_eq!(c.seq_len(u).unwrap(), 40, "nothing changed");
    }
}
