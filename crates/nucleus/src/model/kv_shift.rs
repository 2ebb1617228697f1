//! Moving cached keys to new positions: when a streamed sequence's window slides, the keys
//! after the evicted blocks move down, and RoPE's rotation is relative, so rotating a key by
//! the position difference puts it where it would have been computed (llama.cpp's "K-shift",
//! StreamingLLM's positions inside the cache). Values carry no position.

use super::{Model, ModelError};
use crate::kernels::rope;
use crate::kv_cache::{KvCache, SeqId, NO_BLOCK};

impl Model {
    /// Rotates the keys of `seq` from block `first_block` on by `delta` positions (negative:
    /// towards the start), in every layer with that layer's RoPE. The blocks must be private to
    /// `seq` ([`KvCache::make_private`]).
    pub fn shift_keys(
        &self,
        kv: &mut KvCache,
        seq: SeqId,
        first_block: usize,
        delta: i64,
    ) -> Result<(), ModelError> {
        let hp = &self.hp;
        let bs = kv.config().block_size;
        let len = kv.seq_len(seq)?;
        let ff = self.weights.rope_freqs.as_deref();
        let mut cos_sin = Vec::new();
        for layer in 0..hp.n_layers {
            // Every key of the layer turns by the same angles (those of `delta`).
            let base = hp.layer_rope_base(layer);
            let (dim, scale) = (hp.rope_dim, hp.rope_freq_scale);
            match &hp.yarn {
                // YaRN's angles are linear in the position too; its magnitude scale is
                // already in the cached keys, so the turn is by unit vectors.
                Some(y) => {
                    let unit = rope::Yarn {
                        attn_factor: 1.0,
                        ..*y
                    };
                    rope::rope_angles_yarn((dim, delta, base, scale), ff, &unit, &mut cos_sin);
                    let m = cos_sin.first().map_or(1.0, |&(c, s)| c.hypot(s));
                    cos_sin
                        .iter_mut()
                        .for_each(|(c, s)| (*c, *s) = (*c / m, *s / m));
                }
                None => rope::rope_angles(dim, delta, base, scale, ff, &mut cos_sin),
            }
            // (A sliding-window layer has no blocks out of its window: nothing to rotate.)
            let blocks = kv.layer_blocks(layer, seq)?.to_vec();
            for (i, &b) in blocks.iter().enumerate().skip(first_block) {
                if b == NO_BLOCK {
                    continue;
                }
                let slots = 0..bs.min(len - i * bs);
                kv.update_keys(layer, b, slots, |_, key| {
                    rope::rope_apply(key, 1, hp.head_dim, dim, hp.rope_style, &cos_sin)
                });
            }
        }
        Ok(())
    }
}
