//! The forward pass. It reads top to bottom like the math: embed, then for each layer its
//! attention block and its feed-forward block (`layer.rs`), then the final norm and the output
//! projection for the positions that want logits.
//!
//! All tokens of a batch go through each matrix product together (prefill chunks and the
//! decode steps of many sequences alike), so every weight row read serves the whole batch.

use crate::kernels::matmul::PromptSlot;
use crate::kernels::ops;
use crate::kv_cache::{KvCache, KvSlot, SeqId};
use crate::quant::dequantize_row;
use crate::tokenizer::TokenId;

use super::moe::MoeState;
use super::project::ActsCache;
use super::{Model, ModelError};

/// Tokens to evaluate: each with its position, its sequence, and whether its logits are wanted.
/// A sequence's tokens must continue it: positions `len, len+1, …` in batch order.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<TokenId>,
    pub positions: Vec<usize>,
    pub seqs: Vec<SeqId>,
    pub logits: Vec<bool>,
    /// Where the token sits in its prompt; [`PromptSlot::GENERATED`] for a generated token
    /// (see [`Batch::push_prompt`]).
    pub prompt: Vec<PromptSlot>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Adds a token computed as llama.cpp computes a generated token (one at a time).
    pub fn push(&mut self, token: TokenId, pos: usize, seq: SeqId, logits: bool) {
        self.push_with(token, pos, seq, logits, PromptSlot::GENERATED);
    }

    /// Adds token `slot.index` of a prompt of `slot.len` tokens. llama.cpp takes a prompt as one
    /// batch and computes it with batched kernels whose sums round differently from its
    /// one-token ones, chosen by the batch's size (and for some by the row's place in it); a
    /// token pushed here gets the arithmetic its place in its prompt calls for, however the
    /// prompt is chunked or batched here, so its results match the reference's and never
    /// depend on the batching.
    pub fn push_prompt(
        &mut self,
        token: TokenId,
        pos: usize,
        seq: SeqId,
        logits: bool,
        slot: PromptSlot,
    ) {
        self.push_with(token, pos, seq, logits, slot);
    }

    fn push_with(
        &mut self,
        token: TokenId,
        pos: usize,
        seq: SeqId,
        logits: bool,
        slot: PromptSlot,
    ) {
        self.tokens.push(token);
        self.positions.push(pos);
        self.seqs.push(seq);
        self.logits.push(logits);
        self.prompt.push(slot);
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.seqs.clear();
        self.logits.clear();
        self.prompt.clear();
    }

    /// Number of tokens that want logits (rows of the output).
    pub fn n_outputs(&self) -> usize {
        self.logits.iter().filter(|&&l| l).count()
    }
}

/// Scratch buffers of the forward pass, sized for the largest batch seen so far.
#[derive(Default)]
pub struct ForwardState {
    pub(super) x: Vec<f32>,
    pub(super) xb: Vec<f32>,
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) att: Vec<f32>,
    pub(super) proj: Vec<f32>,
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    pub(super) out_in: Vec<f32>,
    pub(super) out_prompt: Vec<PromptSlot>,
    pub(super) logits: Vec<f32>,
    pub(super) slots: Vec<KvSlot>,
    pub(super) cos_sin: Vec<(f32, f32)>,
    pub(super) acts: ActsCache,
    pub(super) moe: MoeState,
    pub(super) seq_counts: Vec<(SeqId, usize)>,
    /// Stop after the output norm: no logits, [`hidden`](ForwardState::hidden) holds the rows.
    pub(super) hidden_only: bool,
}

impl ForwardState {
    pub fn new() -> ForwardState {
        ForwardState::default()
    }

    /// Logits of the last forward: one row of `n_vocab` per token that wanted logits, in batch
    /// order.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// With `on`, a forward stops after the final norm: it computes no logits (the output
    /// projection, the largest matrix, is skipped) and leaves the normed hidden states of the
    /// tokens that asked for outputs in [`hidden`](Self::hidden). For embeddings.
    pub fn set_hidden_only(&mut self, on: bool) {
        self.hidden_only = on;
    }

    /// The last forward's final hidden states (after the output norm, before the output
    /// projection): one row of `n_embd` per token that wanted outputs, in batch order.
    pub fn hidden(&self) -> &[f32] {
        &self.out_in
    }
}

fn resize(v: &mut Vec<f32>, n: usize) {
    if v.len() != n {
        v.resize(n, 0.0);
    }
}

/// Debugging aid: with `NUCLEUS_DUMP_DIR` set, intermediate tensors are written there as raw
/// little-endian f32 (`NAME-LAYER.bin`, llama.cpp's callback names), to compare with llama.cpp's.
pub(super) fn dump(name: &str, il: usize, data: &[f32]) {
    static DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    if let Some(dir) = DIR.get_or_init(|| std::env::var_os("NUCLEUS_DUMP_DIR").map(Into::into)) {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        let _ = std::fs::write(dir.join(format!("{name}-{il}.bin")), bytes);
    }
}

impl Model {
    /// Evaluates a batch, appending its tokens to their sequences in `kv`. The logits of the
    /// tokens that asked for them are in `state.logits()` afterwards.
    ///
    /// The recipe every family shares: embed, then per layer its attention block and its FFN
    /// block (`layer.rs`; what differs between families is data of the layer: biases, q/k
    /// norms, post-norms, a sliding window, a dense or mixture-of-experts FFN), then the final
    /// norm and the output projection.
    pub fn forward(
        &self,
        batch: &Batch,
        kv: &mut KvCache,
        state: &mut ForwardState,
    ) -> Result<(), ModelError> {
        let n = batch.len();
        self.check_batch(batch, kv, state)?;
        if n == 0 {
            state.logits.clear();
            return Ok(());
        }
        self.pass_begins(n);
        let st = state;
        self.size_buffers(st, n);
        self.embed_tokens(batch, st);
        // Where each token's keys and values go.
        st.slots.clear();
        for t in 0..n {
            st.slots
                .push(kv.position(batch.seqs[t], batch.positions[t])?);
        }
        // The rows that want logits, and their slots in llama.cpp's last layer.
        let n_out = batch.n_outputs();
        st.out_prompt.clear();
        st.out_prompt.extend(
            (0..n)
                .filter(|&t| batch.logits[t])
                .map(|t| batch.prompt[t].for_outputs()),
        );
        let layers = &self.weights.layers;
        for (il, layer) in layers.iter().enumerate() {
            self.attention_block(il, layer, batch, kv, st)?;
            // As llama.cpp does, the last layer goes on with the rows that want logits only,
            // computed as llama.cpp computes them there (`PromptSlot::for_outputs`).
            if il + 1 == layers.len() {
                let e = self.hp.n_embd;
                for (r, t) in (0..n).filter(|&t| batch.logits[t]).enumerate() {
                    if r != t {
                        st.x.copy_within(t * e..(t + 1) * e, r * e);
                    }
                }
                let slots = std::mem::take(&mut st.out_prompt);
                self.ffn_block(il, layer, &slots, n_out, st);
                st.out_prompt = slots;
            } else {
                self.ffn_block(il, layer, &batch.prompt, n, st);
            }
        }
        for &(seq, count) in &st.seq_counts {
            kv.commit(seq, count)?;
        }
        self.output(n_out, st);
        Ok(())
    }

    /// Sizes the scratch buffers for a batch of `n` tokens.
    fn size_buffers(&self, st: &mut ForwardState, n: usize) {
        let hp = &self.hp;
        let (e, hd, hdv) = (hp.n_embd, hp.head_dim, hp.head_dim_v);
        for (buf, len) in [
            (&mut st.x, n * e),
            (&mut st.xb, n * e),
            (&mut st.q, n * hp.n_head * hd),
            (&mut st.k, n * hp.n_head_kv * hd),
            (&mut st.v, n * hp.n_head_kv * hdv),
            (&mut st.att, n * hp.n_head * hdv),
            (&mut st.proj, n * e),
            (&mut st.gate, n * hp.n_ff),
            (&mut st.up, n * hp.n_ff),
        ] {
            resize(buf, len);
        }
    }

    /// The batch's token embeddings into `st.x` (scaled where the family scales them).
    fn embed_tokens(&self, batch: &Batch, st: &mut ForwardState) {
        let e = self.hp.n_embd;
        let embd = self.weights.token_embd.q(&self.file);
        let row_bytes = embd.ty.row_bytes(e).expect("checked at load");
        for (t, &tok) in batch.tokens.iter().enumerate() {
            let row = &embd.data[tok as usize * row_bytes..(tok as usize + 1) * row_bytes];
            let x = &mut st.x[t * e..(t + 1) * e];
            dequantize_row(embd.ty, row, x);
            if self.hp.embd_scale != 1.0 {
                x.iter_mut().for_each(|v| *v *= self.hp.embd_scale);
            }
        }
    }

    /// Final norm and output projection of the `n_out` rows the last layer left (the ones
    /// that want logits); only the norm when the state asks for hidden states.
    fn output(&self, n_out: usize, st: &mut ForwardState) {
        let (hp, e) = (&self.hp, self.hp.n_embd);
        resize(&mut st.out_in, n_out * e);
        ops::rmsnorm_rows_in(
            &self.pool,
            &mut st.out_in[..n_out * e],
            &st.x[..n_out * e],
            &self.weights.output_norm,
            hp.rms_eps,
            e,
        );
        if st.hidden_only {
            st.logits.clear();
            return;
        }
        resize(&mut st.logits, n_out * hp.n_vocab);
        if n_out == 0 {
            return;
        }
        st.acts.invalidate();
        self.project(
            &mut st.acts,
            &self.weights.output,
            (&st.out_in, &st.out_prompt),
            n_out,
            &mut st.logits,
        );
        if let Some(cap) = hp.final_softcap {
            // As llama.cpp's graph computes it: scale by 1/cap, tanh, scale by cap.
            let inv = 1.0 / cap;
            st.logits[..n_out * hp.n_vocab]
                .iter_mut()
                .for_each(|l| *l = (*l * inv).tanh() * cap);
        }
    }

    /// Checks a batch against the model and the cache, and reserves cache blocks for it. On
    /// error nothing has been reserved.
    fn check_batch(
        &self,
        batch: &Batch,
        kv: &mut KvCache,
        st: &mut ForwardState,
    ) -> Result<(), ModelError> {
        let n = batch.len();
        if batch.positions.len() != n
            || batch.seqs.len() != n
            || batch.logits.len() != n
            || batch.prompt.len() != n
        {
            return Err(ModelError::BadBatch(
                "tokens, positions, sequences and logits flags differ in length".into(),
            ));
        }
        if let Some(&tok) = batch
            .tokens
            .iter()
            .find(|&&t| t as usize >= self.hp.n_vocab)
        {
            return Err(ModelError::BadBatch(format!(
                "token id {tok} is outside the vocabulary of {}",
                self.hp.n_vocab
            )));
        }
        st.seq_counts.clear();
        for t in 0..n {
            let seq = batch.seqs[t];
            let done = match st.seq_counts.iter_mut().find(|(s, _)| *s == seq) {
                Some((_, c)) => {
                    *c += 1;
                    *c - 1
                }
                None => {
                    st.seq_counts.push((seq, 1));
                    0
                }
            };
            let want = kv.seq_len(seq)? + done;
            if batch.positions[t] != want {
                return Err(ModelError::BadBatch(format!(
                    "token {t} of sequence {seq} has position {}, expected {want}",
                    batch.positions[t]
                )));
            }
        }
        kv.reserve_batch(&st.seq_counts)?;
        Ok(())
    }
}
