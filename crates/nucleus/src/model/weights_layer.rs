//! A layer's tensors by role: attention's projections, biases and norms, and its FFN, dense or
//! a mixture of experts, each checked against the shape the hyperparameters give it.

use super::super::{Arch, HParams, ModelError, QkNorm};
use super::{Expert, ExpertBiases, Ffn, Layer, Loader, Matrix, MoeFfn};

/// Widths of a layer's attention projections.
struct AttnDims {
    q: usize,
    k: usize,
    v: usize,
    o: usize,
}

impl Loader<'_> {
    /// Layer `i`'s tensors, each checked against the shape `hp` gives it.
    pub(super) fn layer(&self, i: usize, hp: &HParams) -> Result<Layer, ModelError> {
        let (l, e) = (self, hp.n_embd);
        let d = AttnDims {
            q: hp.n_head * hp.head_dim,
            k: hp.n_head_kv * hp.head_dim,
            v: hp.n_head_kv * hp.head_dim_v,
            o: hp.n_head * hp.head_dim_v,
        };
        let n = |s: &str| format!("blk.{i}.{s}");
        let (wq, wk, wv) = l.qkv(i, e, &d)?;
        let (bq, bk, bv) = if hp.qkv_bias {
            (
                Some(l.vector(&n("attn_q.bias"), d.q)?),
                Some(l.vector(&n("attn_k.bias"), d.k)?),
                Some(l.vector(&n("attn_v.bias"), d.v)?),
            )
        } else {
            (
                l.opt_vector(&n("attn_q.bias"), d.q)?,
                l.opt_vector(&n("attn_k.bias"), d.k)?,
                l.opt_vector(&n("attn_v.bias"), d.v)?,
            )
        };
        let has_qk_norm = hp.qk_norm != QkNorm::None;
        let qk_norm_len = match hp.qk_norm {
            QkNorm::AllHeads => (d.q, d.k),
            _ => (hp.head_dim, hp.head_dim),
        };
        let gpt_oss = hp.arch == Arch::GptOss;
        let norm = |s: &str, len: usize, required: bool| -> Result<Option<Vec<f32>>, ModelError> {
            if required {
                l.vector(&n(s), len).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(Layer {
            attn_norm: l.vector(&n("attn_norm.weight"), e)?,
            wq,
            wk,
            wv,
            wo: l.matrix(&n("attn_output.weight"), d.o, e)?,
            bq,
            bk,
            bv,
            bo: norm("attn_output.bias", e, gpt_oss)?,
            attn_sinks: norm("attn_sinks.weight", hp.n_head, gpt_oss)?,
            q_norm: norm("attn_q_norm.weight", qk_norm_len.0, has_qk_norm)?,
            k_norm: norm("attn_k_norm.weight", qk_norm_len.1, has_qk_norm)?,
            post_attn_norm: norm("post_attention_norm.weight", e, hp.post_norms)?,
            // gpt-oss's norm before its FFN is named for where it sits, after attention.
            ffn_norm: l.vector(
                &n(if gpt_oss {
                    "post_attention_norm.weight"
                } else {
                    "ffn_norm.weight"
                }),
                e,
            )?,
            ffn: l.ffn(i, hp)?,
            post_ffn_norm: norm("post_ffw_norm.weight", e, hp.post_norms)?,
        })
    }

    /// Layer `i`'s q, k and v: one matrix (Phi-3) cut in three, or three.
    fn qkv(
        &self,
        i: usize,
        e: usize,
        d: &AttnDims,
    ) -> Result<(Matrix, Matrix, Matrix), ModelError> {
        let n = |s: &str| format!("blk.{i}.{s}");
        Ok(if self.file.tensor(&n("attn_qkv.weight")).is_some() {
            let qkv = self.matrix(&n("attn_qkv.weight"), e, d.q + d.k + d.v)?;
            (
                qkv.row_slice(0, d.q),
                qkv.row_slice(d.q, d.k),
                qkv.row_slice(d.q + d.k, d.v),
            )
        } else {
            (
                self.matrix(&n("attn_q.weight"), e, d.q)?,
                self.matrix(&n("attn_k.weight"), e, d.k)?,
                self.matrix(&n("attn_v.weight"), e, d.v)?,
            )
        })
    }
}

impl Loader<'_> {
    /// Layer `i`'s FFN: dense, or the mixture of experts the hyperparameters call for.
    fn ffn(&self, i: usize, hp: &HParams) -> Result<Ffn, ModelError> {
        let n = |s: &str| format!("blk.{i}.{s}");
        let e = hp.n_embd;
        let arch = hp.arch.name();
        let Some(moe) = hp.moe else {
            let router = n("ffn_gate_inp.weight");
            if self.file.tensor(&router).is_some() {
                return Err(ModelError::Invalid(format!(
                    "missing metadata {arch}.expert_count (the file has expert tensors: {router})"
                )));
            }
            // Phi-3's ffn_up holds the gate's rows, then the up projection's.
            let (gate, up) = if hp.arch == Arch::Phi3 {
                let gate_up = self.matrix(&n("ffn_up.weight"), e, 2 * hp.n_ff)?;
                (
                    gate_up.row_slice(0, hp.n_ff),
                    gate_up.row_slice(hp.n_ff, hp.n_ff),
                )
            } else {
                (
                    self.matrix(&n("ffn_gate.weight"), e, hp.n_ff)?,
                    self.matrix(&n("ffn_up.weight"), e, hp.n_ff)?,
                )
            };
            let down = self.matrix(&n("ffn_down.weight"), hp.n_ff, e)?;
            return Ok(Ffn::Dense { gate, up, down });
        };
        let (x, f) = (moe.n_expert, moe.n_ff_exp);
        let count = format!("{arch}.expert_count = {x}");
        let router_name = n("ffn_gate_inp.weight");
        let router = self.matrix(&router_name, e, x).map_err(|err| match err {
            ModelError::Invalid(m) if self.file.tensor(&router_name).is_some() => {
                ModelError::Invalid(format!("{m} ({count})"))
            }
            other => other,
        })?;
        let ff_key = if matches!(hp.arch, Arch::Qwen3Moe | Arch::GptOss) {
            format!("{arch}.expert_feed_forward_length = {f}")
        } else {
            format!("{arch}.feed_forward_length = {f}")
        };
        let why = format!("{count}, {ff_key}");
        let gate = self.experts(&n("ffn_gate_exps.weight"), (e, f, x), &why)?;
        let up = self.experts(&n("ffn_up_exps.weight"), (e, f, x), &why)?;
        let down = self.experts(&n("ffn_down_exps.weight"), (f, e, x), &why)?;
        let experts = gate
            .into_iter()
            .zip(up)
            .zip(down)
            .map(|((gate, up), down)| Expert { gate, up, down })
            .collect();
        // gpt-oss: the router and every expert matrix have biases, all required.
        let (router_bias, biases) = if hp.arch == Arch::GptOss {
            let bias = |s: &str, len: usize| self.vector(&n(s), len);
            let biases = ExpertBiases {
                gate: bias("ffn_gate_exps.bias", f * x)?,
                up: bias("ffn_up_exps.bias", f * x)?,
                down: bias("ffn_down_exps.bias", e * x)?,
            };
            (Some(bias("ffn_gate_inp.bias", x)?), Some(biases))
        } else {
            (None, None)
        };
        Ok(Ffn::Moe(MoeFfn {
            params: moe,
            router,
            router_bias,
            biases,
            experts,
        }))
    }
}
