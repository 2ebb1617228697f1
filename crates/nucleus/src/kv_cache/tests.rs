//! Tests of the block pool: allocation, forks and copy-on-write, the prefix cache, eviction of
//! a window's middle, and the exact accounting of its bytes.

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
        sliding: None,
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
            sliding: None,
        });
        assert_eq!(c.config().bytes_per_token(), 3 * 2 * 2 * row, "{ty}");
        assert_eq!(c.total_bytes(), c.config().bytes_per_token() * 16 * 5);
        let real: usize = c.pools.iter().map(Pool::allocated_bytes).sum();
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
    c.offer_blocks(s, &h, tokens).unwrap();
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

/// Replays `events` into `set` as a router would.
fn replay(set: &mut std::collections::HashSet<BlockHash>, events: Vec<KvEvent>) {
    for e in events {
        match e {
            KvEvent::Stored { hash, .. } => assert!(set.insert(hash), "stored twice"),
            KvEvent::Removed { hash } => assert!(set.remove(&hash), "removed, never stored"),
        }
    }
}

#[test]
fn events_replay_into_exactly_the_cached_blocks() {
    let mut c = cache(6);
    c.set_prefix_caching(true);
    c.set_events(true);
    let mut seen = std::collections::HashSet::new();
    let check = |seen: &mut std::collections::HashSet<BlockHash>, c: &mut KvCache| {
        replay(seen, c.take_events());
        let mut want = c.cached_hashes();
        want.sort_unstable();
        let mut got: Vec<BlockHash> = seen.iter().copied().collect();
        got.sort_unstable();
        assert_eq!(got, want);
    };
    // Two prompts sharing a block; the second's own blocks are stored with their tokens and
    // parents.
    let a: Vec<TokenId> = (0..9).collect();
    let b: Vec<TokenId> = (0..4).chain(50..58).collect();
    let sa = filled(&mut c, &a);
    let events = c.take_events();
    let h = hashes(&a);
    assert_eq!(
        events,
        vec![
            KvEvent::Stored {
                hash: h[0],
                parent: None,
                tokens: vec![0, 1, 2, 3]
            },
            KvEvent::Stored {
                hash: h[1],
                parent: Some(h[0]),
                tokens: vec![4, 5, 6, 7]
            },
        ]
    );
    replay(&mut seen, events);
    let sb = filled(&mut c, &b);
    check(&mut seen, &mut c);
    c.free_seq(sa).unwrap();
    c.free_seq(sb).unwrap();
    check(&mut seen, &mut c);
    // New prompts evict the least recently used blocks: removals.
    let d: Vec<TokenId> = (200..220).collect();
    let sd = filled(&mut c, &d);
    let events = c.take_events();
    assert!(events.iter().any(|e| matches!(e, KvEvent::Removed { .. })));
    replay(&mut seen, events);
    check(&mut seen, &mut c);
    // Cut back into a cached block: it leaves the cache.
    c.truncate(sd, 6).unwrap();
    check(&mut seen, &mut c);
    c.free_seq(sd).unwrap();
    c.set_prefix_caching(false);
    check(&mut seen, &mut c);
    assert!(seen.is_empty());
}
