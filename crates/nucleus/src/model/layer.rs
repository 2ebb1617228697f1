//! A layer's two blocks, the steps the forward pass repeats: attention (norm → q/k/v with their
//! biases → q/k norms → RoPE → cache → attention → output projection → post-norm → residual)
//! and the feed-forward network (norm → dense gated FFN or mixture of experts → post-norm →
//! residual). What differs between families is the layer's data (`weights::Layer`), not code.

use crate::kernels::matmul::PromptSlot;
use crate::kernels::{ops, rope};
use crate::kv_cache::KvCache;

use super::forward::{dump, Batch, ForwardState};
use super::project::ActsCache;
use super::weights::{Ffn, Layer};
use super::{Activation, Model, ModelError};

impl Model {
    /// Layer `il`'s attention block over the batch's `n` rows of `st.x`, in place.
    pub(super) fn attention_block(
        &self,
        il: usize,
        layer: &Layer,
        batch: &Batch,
        kv: &mut KvCache,
        st: &mut ForwardState,
    ) -> Result<(), ModelError> {
        let (hp, n) = (&self.hp, batch.len());
        let (e, hd, hdv) = (hp.n_embd, hp.head_dim, hp.head_dim_v);
        let (q_dim, k_dim, v_dim) = (hp.n_head * hd, hp.n_head_kv * hd, hp.n_head_kv * hdv);
        let att_dim = hp.n_head * hdv;
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
        self.rope_and_cache(il, batch, kv, st);
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
        if let Some(bo) = &layer.bo {
            st.proj[..n * e]
                .chunks_exact_mut(e)
                .for_each(|row| ops::add_in_place(row, bo));
        }
        if let Some(pn) = &layer.post_attn_norm {
            ops::rmsnorm_chunks_in(&self.pool, &mut st.proj[..n * e], pn, hp.rms_eps, e);
        }
        ops::add_in_place(&mut st.x[..n * e], &st.proj[..n * e]);
        dump("ffn_inp", il, &st.x[..n * e]);
        Ok(())
    }

    /// RoPE on the batch's queries and keys, then its keys and values into the cache.
    fn rope_and_cache(&self, il: usize, batch: &Batch, kv: &mut KvCache, st: &mut ForwardState) {
        let (hp, n) = (&self.hp, batch.len());
        let hd = hp.head_dim;
        let (q_dim, k_dim, v_dim) = (
            hp.n_head * hd,
            hp.n_head_kv * hd,
            hp.n_head_kv * hp.head_dim_v,
        );
        let base = hp.layer_rope_base(il);
        let ff = self.weights.rope_freqs.as_deref();
        let (dim, style, scale) = (hp.rope_dim, hp.rope_style, hp.rope_freq_scale);
        for t in 0..n {
            let pos = batch.positions[t];
            // One position's angles for its query and its key.
            match &hp.yarn {
                Some(y) => {
                    rope::rope_angles_yarn((dim, pos as i64, base, scale), ff, y, &mut st.cos_sin)
                }
                None => rope::rope_angles(dim, pos as i64, base, scale, ff, &mut st.cos_sin),
            }
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
    }

    /// Layer `il`'s feed-forward block over the first `m` rows of `st.x`, in place, row `r`
    /// computed with the kernels `slots[r]` calls for.
    pub(super) fn ffn_block(
        &self,
        il: usize,
        layer: &Layer,
        slots: &[PromptSlot],
        m: usize,
        st: &mut ForwardState,
    ) {
        let (hp, e) = (&self.hp, self.hp.n_embd);
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
}
