//! The forward pass. It reads top to bottom like the math: embed, then for each layer
//! norm → q/k/v → RoPE → cache → attention → output projection → residual → norm → gated FFN →
//! residual, then the final norm and the output projection for the positions that want logits.
//!
//! All tokens of a batch go through each matrix product together (prefill chunks and the
//! decode steps of many sequences alike), so every weight row read serves the whole batch.

use crate::kernels::matmul::PromptSlot;
use crate::kernels::{ops, rope};
use crate::kv_cache::{KvCache, KvSlot, SeqId};
use crate::quant::dequantize_row;
use crate::tokenizer::TokenId;

use super::moe::MoeState;
use super::project::ActsCache;
use super::weights::Ffn;
use super::{Activation, Model, ModelError};

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
    x: Vec<f32>,
    xb: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    out_in: Vec<f32>,
    out_prompt: Vec<PromptSlot>,
    logits: Vec<f32>,
    slots: Vec<KvSlot>,
    cos_sin: Vec<(f32, f32)>,
    acts: ActsCache,
    moe: MoeState,
    seq_counts: Vec<(SeqId, usize)>,
    /// Stop after the output norm: no logits, [`hidden`](ForwardState::hidden) holds the rows.
    hidden_only: bool,
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
    pub fn forward(
        &self,
        batch: &Batch,
        kv: &mut KvCache,
        state: &mut ForwardState,
    ) -> Result<(), ModelError> {
        let hp = &self.hp;
        let n = batch.len();
        self.check_batch(batch, kv, state)?;
        if n == 0 {
            state.logits.clear();
            return Ok(());
        }
        let w = &self.weights;
        let (e, hd, hdv) = (hp.n_embd, hp.head_dim, hp.head_dim_v);
        let (q_dim, k_dim, v_dim) = (hp.n_head * hd, hp.n_head_kv * hd, hp.n_head_kv * hdv);
        let att_dim = hp.n_head * hdv;
        let st = state;
        for (buf, len) in [
            (&mut st.x, n * e),
            (&mut st.xb, n * e),
            (&mut st.q, n * q_dim),
            (&mut st.k, n * k_dim),
            (&mut st.v, n * v_dim),
            (&mut st.att, n * att_dim),
            (&mut st.proj, n * e),
            (&mut st.gate, n * hp.n_ff),
            (&mut st.up, n * hp.n_ff),
        ] {
            resize(buf, len);
        }

        // Token embeddings.
        let embd = w.token_embd.q(&self.file);
        let row_bytes = embd.ty.row_bytes(e).expect("checked at load");
        for (t, &tok) in batch.tokens.iter().enumerate() {
            let row = &embd.data[tok as usize * row_bytes..(tok as usize + 1) * row_bytes];
            let x = &mut st.x[t * e..(t + 1) * e];
            dequantize_row(embd.ty, row, x);
            if hp.embd_scale != 1.0 {
                x.iter_mut().for_each(|v| *v *= hp.embd_scale);
            }
        }

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

        for (il, layer) in w.layers.iter().enumerate() {
            // Attention block.
            ops::rmsnorm_rows_in(
                &self.pool,
                &mut st.xb[..n * e],
                &st.x[..n * e],
                &layer.attn_norm,
                hp.rms_eps,
                e,
            );
            dump("attn_norm", il, &st.xb[..n * e]);
            st.acts.invalidate();
            self.project_many(
                &mut st.acts,
                [
                    (&layer.wq, &mut st.q[..]),
                    (&layer.wk, &mut st.k[..]),
                    (&layer.wv, &mut st.v[..]),
                ],
                (&st.xb, &batch.prompt),
                n,
            );
            for (buf, bias, dim) in [
                (&mut st.q, &layer.bq, q_dim),
                (&mut st.k, &layer.bk, k_dim),
                (&mut st.v, &layer.bv, v_dim),
            ] {
                if let Some(b) = bias {
                    buf.chunks_exact_mut(dim)
                        .for_each(|row| ops::add_in_place(row, b));
                }
            }
            // Per head, or over all heads (OLMoE): each norm is as long as what it normalizes.
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                ops::rmsnorm_chunks_in(&self.pool, &mut st.q, qn, hp.rms_eps, qn.len());
                ops::rmsnorm_chunks_in(&self.pool, &mut st.k, kn, hp.rms_eps, kn.len());
            }
            let base = hp.layer_rope_base(il);
            let ff = w.rope_freqs.as_deref();
            let (dim, style, scale) = (hp.rope_dim, hp.rope_style, hp.rope_freq_scale);
            for t in 0..n {
                let pos = batch.positions[t];
                // One position's angles for its query and its key.
                rope::rope_angles(dim, pos as i64, base, scale, ff, &mut st.cos_sin);
                let q = &mut st.q[t * q_dim..(t + 1) * q_dim];
                rope::rope_apply(q, hp.n_head, hd, dim, style, &st.cos_sin);
                let k = &mut st.k[t * k_dim..(t + 1) * k_dim];
                rope::rope_apply(k, hp.n_head_kv, hd, dim, style, &st.cos_sin);
            }
            for t in 0..n {
                kv.write_at(
                    il,
                    &st.slots[t],
                    &st.k[t * k_dim..(t + 1) * k_dim],
                    &st.v[t * v_dim..(t + 1) * v_dim],
                );
            }
            dump("Qcur", il, &st.q[..n * q_dim]);
            dump("Kcur", il, &st.k[..n * k_dim]);
            dump("Vcur", il, &st.v[..n * v_dim]);
            if hp.scale_queries {
                st.q[..n * q_dim]
                    .iter_mut()
                    .for_each(|v| *v *= hp.attn_scale);
            }
            self.attention(il, batch, kv, &st.q, &mut st.att)?;
            dump("kqv_out", il, &st.att[..n * att_dim]);
            st.acts.invalidate();
            self.project(
                &mut st.acts,
                &layer.wo,
                (&st.att, &batch.prompt),
                n,
                &mut st.proj,
            );
            if let Some(pn) = &layer.post_attn_norm {
                ops::rmsnorm_chunks_in(&self.pool, &mut st.proj[..n * e], pn, hp.rms_eps, e);
            }
            ops::add_in_place(&mut st.x[..n * e], &st.proj[..n * e]);
            dump("ffn_inp", il, &st.x[..n * e]);

            // As llama.cpp does, the last layer goes on with the rows that want logits only,
            // computed as llama.cpp computes them there (`PromptSlot::for_outputs`).
            let last = il + 1 == w.layers.len();
            let m = if last { n_out } else { n };
            if last {
                for (r, t) in (0..n).filter(|&t| batch.logits[t]).enumerate() {
                    if r != t {
                        st.x.copy_within(t * e..(t + 1) * e, r * e);
                    }
                }
            }
            let slots = if last { &st.out_prompt } else { &batch.prompt };

            // Feed-forward block.
            ops::rmsnorm_rows_in(
                &self.pool,
                &mut st.xb[..m * e],
                &st.x[..m * e],
                &layer.ffn_norm,
                hp.rms_eps,
                e,
            );
            match &layer.ffn {
                Ffn::Dense { gate, up, down } => self.dense_ffn(
                    [gate, up, down],
                    &mut st.acts,
                    (&mut st.gate, &mut st.up),
                    (&st.xb, slots),
                    m,
                    &mut st.proj,
                    il,
                ),
                Ffn::Moe(moe) => self.moe_ffn(
                    moe,
                    &mut st.acts,
                    &mut st.moe,
                    (&st.xb, slots),
                    m,
                    &mut st.proj,
                    il,
                ),
            }
            if let Some(pn) = &layer.post_ffn_norm {
                ops::rmsnorm_chunks_in(&self.pool, &mut st.proj[..m * e], pn, hp.rms_eps, e);
            }
            dump("ffn_out", il, &st.proj[..m * e]);
            ops::add_in_place(&mut st.x[..m * e], &st.proj[..m * e]);
            dump("l_out", il, &st.x[..m * e]);
        }

        for &(seq, count) in &st.seq_counts {
            kv.commit(seq, count)?;
        }

        // Final norm and output projection: the last layer left the rows that want logits.
        resize(&mut st.out_in, n_out * e);
        ops::rmsnorm_rows_in(
            &self.pool,
            &mut st.out_in[..n_out * e],
            &st.x[..n_out * e],
            &w.output_norm,
            hp.rms_eps,
            e,
        );
        if st.hidden_only {
            st.logits.clear();
            return Ok(());
        }
        resize(&mut st.logits, n_out * hp.n_vocab);
        if n_out > 0 {
            st.acts.invalidate();
            self.project(
                &mut st.acts,
                &w.output,
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
        Ok(())
    }

    /// y = down(act(gate·x) ⊙ up·x) for the `m` rows of x: the gated FFN of a dense layer.
    #[allow(clippy::too_many_arguments)]
    fn dense_ffn(
        &self,
        [w_gate, w_up, w_down]: [&super::weights::Matrix; 3],
        acts: &mut ActsCache,
        (gate, up): (&mut Vec<f32>, &mut Vec<f32>),
        (x, slots): (&[f32], &[PromptSlot]),
        m: usize,
        y: &mut [f32],
        il: usize,
    ) {
        let n_ff = self.hp.n_ff;
        acts.invalidate();
        self.project_many(
            acts,
            [(w_gate, &mut gate[..]), (w_up, &mut up[..])],
            (x, slots),
            m,
        );
        dump("ffn_norm", il, &x[..m * self.hp.n_embd]);
        dump("ffn_gate", il, &gate[..m * n_ff]);
        dump("ffn_up", il, &up[..m * n_ff]);
        let (gate, up) = (&mut gate[..m * n_ff], &up[..m * n_ff]);
        let act = match self.hp.activation {
            Activation::Silu => ops::swiglu,
            Activation::Gelu => ops::geglu,
        };
        ops::gated_in(&self.pool, act, gate, up);
        dump("ffn_act", il, gate);
        acts.invalidate();
        self.project(acts, w_down, (gate, slots), m, y);
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
