//! Beam search on the real model: [`BeamModel`] over the sequences of one paged [`KvCache`].
//!
//! Each beam is a KV-cache sequence. The prompt is evaluated once into a root sequence; forking
//! a beam copies only its block table ([`KvCache::fork_seq`]), so every beam shares the
//! prompt's blocks and only a shared partial last block is copied when a beam first writes to
//! it. A step appends one token to every live beam in ONE batched [`Model::forward`], so the
//! weights are read once per step whatever the width.

use crate::kv_cache::{KvCache, SeqId};
use crate::model::{Batch, ForwardState, Model, ModelError};
use crate::sampling::{BeamId, BeamModel, TokenId};

/// The beams of a search, as sequences of `kv`.
pub struct KvBeams<'a> {
    model: &'a Model,
    kv: &'a mut KvCache,
    state: &'a mut ForwardState,
    batch: Batch,
    peak_used_blocks: usize,
    steps: usize,
}

impl<'a> KvBeams<'a> {
    /// Beams over `kv`; the root beam is a sequence of `kv` whose prompt has been evaluated
    /// (fork the caller's sequence with [`KvCache::fork_seq`] to keep it).
    pub fn new(model: &'a Model, kv: &'a mut KvCache, state: &'a mut ForwardState) -> Self {
        let peak_used_blocks = kv.used_blocks();
        KvBeams {
            model,
            kv,
            state,
            batch: Batch::new(),
            peak_used_blocks,
            steps: 0,
        }
    }

    /// The most KV blocks in use at once during the search (after each step's forward).
    pub fn peak_used_blocks(&self) -> usize {
        self.peak_used_blocks
    }

    /// Batched forwards run so far.
    pub fn steps(&self) -> usize {
        self.steps
    }
}

impl BeamModel for KvBeams<'_> {
    type Error = ModelError;

    fn fork(&mut self, parent: BeamId) -> Result<BeamId, ModelError> {
        Ok(self.kv.fork_seq(parent as SeqId)? as BeamId)
    }

    fn drop_beam(&mut self, id: BeamId) {
        let _ = self.kv.free_seq(id as SeqId);
    }

    fn step(&mut self, beams: &[(BeamId, TokenId)]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.batch.clear();
        for &(id, tok) in beams {
            let seq = id as SeqId;
            self.batch.push(tok, self.kv.seq_len(seq)?, seq, true);
        }
        self.model.forward(&self.batch, self.kv, self.state)?;
        self.steps += 1;
        self.peak_used_blocks = self.peak_used_blocks.max(self.kv.used_blocks());
        let n_vocab = self.model.hp.n_vocab;
        Ok(self
            .state
            .logits()
            .chunks(n_vocab)
            .map(<[f32]>::to_vec)
            .collect())
    }
}
