//! The mixture-of-experts FFN, as llama.cpp's `build_moe_ffn` computes it:
//!
//! 1. router logits = `ffn_gate_inp` · x (+ its bias: gpt-oss), one per expert;
//! 2. with softmax gating (Qwen3-MoE, Mixtral, OLMoE), probabilities = softmax over all
//!    experts ([`softmax_ggml`]); with gpt-oss's, the logits as they are;
//! 3. the `n_expert_used` largest ([`top_k`]: `ggml_argsort_top_k`, ties to the lower index);
//! 4. their weights: the chosen probabilities, divided by their sum where the architecture
//!    renormalises ([`expert_weights`]); with gpt-oss's gating, the softmax of the chosen
//!    logits;
//! 5. each chosen expert's gated FFN, down(act(gate·x) ⊙ up·x) (each product plus the
//!    expert's bias: gpt-oss, whose act is its clamped SwiGLU), times its weight, summed in
//!    the order of choice.
//!
//! The experts' products are grouped by expert: the tokens of a batch that chose an expert go
//! through its matrices together, so each expert's rows are read once per batch (and a decode
//! step reads only the experts its tokens chose). Every product here computes each row alone
//! (nucleus's tiled kernels, or llama.cpp's one-row kernels, which its `mul_mat_id` uses for
//! every row), so a token's result does not depend on which other tokens share its experts.

use crate::kernels::interleaved::PackedActs;
use crate::kernels::matmul::{PromptSlot, QuantizedActs};
use crate::kernels::ops;
use crate::quant::GgmlType;

use super::forward::dump;
use super::project::ActsCache;
use super::weights::MoeFfn;
use super::{ExpertAct, Gating, Model};

/// Scratch buffers of the MoE FFN.
#[derive(Default)]
pub(super) struct MoeState {
    /// Router logits, then probabilities: one row of `n_expert` per token.
    probs: Vec<f32>,
    /// The chosen experts of each token (`n_expert_used` per token, in order of choice).
    chosen: Vec<usize>,
    /// Their weights, in the same order.
    weights: Vec<f32>,
    /// For the expert being computed: (token, place in the token's choice) of its tokens.
    members: Vec<(usize, usize)>,
    /// The inputs of the expert's tokens, gathered; its gate, up and down outputs.
    x: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    /// Each chosen expert's output: `n_expert_used` rows of `n_embd` per token.
    out: Vec<f32>,
    /// A decode step's down products' inputs, quantized (one per chosen expert).
    down_acts: Vec<(QuantizedActs, PackedActs)>,
    /// A batch's inputs quantized once for every expert's gate and up products.
    xq: QuantizedActs,
}

fn fit(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

impl Model {
    /// y = the mixture-of-experts FFN of the `m` rows of `x` (the normed FFN inputs). `slots`
    /// are the rows' places for the router's product (llama.cpp computes it as any matrix
    /// product of the batch); the experts' products take every row alike.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_ffn(
        &self,
        ffn: &MoeFfn,
        acts: &mut ActsCache,
        st: &mut MoeState,
        (x, slots): (&[f32], &[PromptSlot]),
        m: usize,
        y: &mut [f32],
        il: usize,
    ) {
        let (e, k) = (self.hp.n_embd, ffn.params.n_expert_used);
        self.route(ffn, acts, st, (x, slots), m, il);
        fit(&mut st.out, m * k * e);
        if m == 1 {
            // One token (a decode step): its experts' products in one pass each.
            self.experts_of_one_token(ffn, acts, st, &x[..e]);
        } else {
            self.experts_of_batch(ffn, acts, st, x, m);
        }
        combine(&st.out[..m * k * e], &st.weights, (k, e), &mut y[..m * e]);
        dump("ffn_moe_out", il, &y[..m * e]);
    }

    /// Steps 1–4: each row's chosen experts (`st.chosen`) and their weights (`st.weights`).
    fn route(
        &self,
        ffn: &MoeFfn,
        acts: &mut ActsCache,
        st: &mut MoeState,
        (x, slots): (&[f32], &[PromptSlot]),
        m: usize,
        il: usize,
    ) {
        let p = &ffn.params;
        let (nx, k) = (p.n_expert, p.n_expert_used);
        fit(&mut st.probs, m * nx);
        acts.invalidate();
        self.project(acts, &ffn.router, (x, slots), m, &mut st.probs);
        if let Some(b) = &ffn.router_bias {
            st.probs[..m * nx]
                .chunks_exact_mut(nx)
                .for_each(|row| ops::add_in_place(row, b));
        }
        dump("ffn_moe_logits", il, &st.probs[..m * nx]);
        st.chosen.clear();
        st.weights.clear();
        for probs in st.probs[..m * nx].chunks_exact_mut(nx) {
            let first = st.chosen.len();
            match p.gating {
                Gating::Softmax => {
                    softmax_ggml(probs);
                    top_k(probs, k, &mut st.chosen);
                    expert_weights(probs, &st.chosen[first..], p.norm_weights, &mut st.weights);
                }
                Gating::SoftmaxWeight => {
                    top_k(probs, k, &mut st.chosen);
                    st.weights
                        .extend(st.chosen[first..].iter().map(|&c| probs[c]));
                    softmax_ggml(&mut st.weights[first..]);
                }
            }
        }
        dump("ffn_moe_probs", il, &st.probs[..m * nx]);
        dump("ffn_moe_weights", il, &st.weights);
    }

    /// The chosen experts' outputs for a batch of `m` rows, into `st.out`: expert by expert,
    /// each over the tokens that chose it.
    fn experts_of_batch(
        &self,
        ffn: &MoeFfn,
        acts: &mut ActsCache,
        st: &mut MoeState,
        x: &[f32],
        m: usize,
    ) {
        let (e, k) = (self.hp.n_embd, ffn.params.n_expert_used);
        // Where every expert's gate and up read one activation type, the batch's rows are
        // quantized once and each expert gathers its tokens' (each row is quantized alone:
        // the same bytes as quantizing the gathered rows).
        let shared = self.shared_act_type(ffn.experts.iter().flat_map(|x| [&x.gate, &x.up]), 1);
        if let Some(ty) = shared {
            st.xq.quantize_in(&self.pool, &x[..m * e], m, e, ty);
        }
        for expert in 0..ffn.experts.len() {
            st.members.clear();
            st.members.extend(
                st.chosen
                    .iter()
                    .enumerate()
                    .filter(|&(_, &c)| c == expert)
                    .map(|(i, _)| (i / k, i % k)),
            );
            if !st.members.is_empty() {
                self.one_expert(ffn, expert, acts, st, (x, shared));
            }
        }
    }

    /// Expert `expert`'s outputs for its tokens (`st.members`), into their places in `st.out`;
    /// `shared`: the activation type of the batch's rows quantized once (`st.xq`), if any.
    fn one_expert(
        &self,
        ffn: &MoeFfn,
        expert: usize,
        acts: &mut ActsCache,
        st: &mut MoeState,
        (x, shared): (&[f32], Option<GgmlType>),
    ) {
        let mats = &ffn.experts[expert];
        let (e, k, f) = (
            self.hp.n_embd,
            ffn.params.n_expert_used,
            ffn.params.n_ff_exp,
        );
        let n = st.members.len();
        for buf in [&mut st.gate, &mut st.up] {
            fit(buf, n * f);
        }
        fit(&mut st.down, n * e);
        acts.invalidate();
        let gate_up = vec![(&mats.gate, &mut st.gate[..]), (&mats.up, &mut st.up[..])];
        if let Some(ty) = shared {
            acts.gathered(&st.xq, st.members.iter().map(|&(t, _)| t));
            self.project_gathered(acts, ty, gate_up, n);
        } else {
            fit(&mut st.x, n * e);
            for (r, &(t, _)) in st.members.iter().enumerate() {
                st.x[r * e..(r + 1) * e].copy_from_slice(&x[t * e..(t + 1) * e]);
            }
            self.project_list(acts, gate_up, (&st.x, &[]), n);
        }
        for (g, u) in st.gate[..n * f]
            .chunks_exact_mut(f)
            .zip(st.up[..n * f].chunks_exact_mut(f))
        {
            expert_act(ffn, expert, g, u);
        }
        acts.invalidate();
        self.project(acts, &mats.down, (&st.gate, &[]), n, &mut st.down);
        for row in st.down[..n * e].chunks_exact_mut(e) {
            down_bias(ffn, expert, row);
        }
        for (r, &(t, j)) in st.members.iter().enumerate() {
            let at = (t * k + j) * e;
            st.out[at..at + e].copy_from_slice(&st.down[r * e..(r + 1) * e]);
        }
    }
}

/// Softmax in place, as ggml's AVX-512 `ggml_vec_soft_max_f32` computes it (its CPU
/// `soft_max` with scale 1): e^(x − max) through [`ops::expf_ggml`] in groups of 16, each
/// group summed as `_mm512_reduce_add_ps` sums it (halves added, four times) and the sums
/// accumulated in f64; the rest (n mod 16) through the C library's `expf`, each added in
/// f64; then every value times the f32 of 1/sum. The router's logits are few (8 to 128), but
/// the choice of experts hangs on these bits.
pub fn softmax_ggml(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    x.iter_mut().for_each(|v| *v -= max);
    let n16 = x.len() / 16 * 16;
    let mut sum = 0f64;
    ops::expf_ggml_in_place(&mut x[..n16]);
    for group in x[..n16].chunks_exact(16) {
        let mut lanes = [0f32; 16];
        lanes.copy_from_slice(group);
        for half in [8, 4, 2, 1] {
            for i in 0..half {
                lanes[i] += lanes[i + half];
            }
        }
        sum += lanes[0] as f64;
    }
    for v in &mut x[n16..] {
        *v = v.exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

impl Model {
    /// The chosen experts' outputs for a batch of one token (a decode step), into `st.out`:
    /// every expert reads the same input, so all their gate and up products go to the kernels
    /// in one pass, and then all their down products in another (each row computed as alone:
    /// the same bits as the general path).
    fn experts_of_one_token(
        &self,
        ffn: &MoeFfn,
        acts: &mut ActsCache,
        st: &mut MoeState,
        x: &[f32],
    ) {
        let p = &ffn.params;
        let (e, k, f) = (self.hp.n_embd, p.n_expert_used, p.n_ff_exp);
        for buf in [&mut st.gate, &mut st.up] {
            fit(buf, k * f);
        }
        let chosen = &st.chosen[..k];
        let mut list = Vec::with_capacity(2 * k);
        let gates = st.gate[..k * f].chunks_exact_mut(f);
        for ((&c, g), u) in chosen.iter().zip(gates).zip(st.up.chunks_exact_mut(f)) {
            list.push((&ffn.experts[c].gate, g));
            list.push((&ffn.experts[c].up, u));
        }
        acts.invalidate();
        self.project_list(acts, list, (x, &[]), 1);
        let gates = st.gate[..k * f].chunks_exact_mut(f);
        for ((&c, g), u) in chosen.iter().zip(gates).zip(st.up.chunks_exact_mut(f)) {
            expert_act(ffn, c, g, u);
        }
        let downs = chosen
            .iter()
            .zip(st.gate.chunks_exact(f))
            .zip(st.out[..k * e].chunks_exact_mut(e))
            .map(|((&c, g), y)| (&ffn.experts[c].down, g, y))
            .collect();
        self.project_each(acts, &mut st.down_acts, downs);
        for (&c, y) in chosen.iter().zip(st.out.chunks_exact_mut(e)) {
            down_bias(ffn, c, y);
        }
    }
}

/// Expert `expert`'s activation of one row, in place of `gate`: its gate and up biases added
/// (gpt-oss), then its gated activation (ggml's SwiGLU takes each row alone: groups of 16,
/// then the row's tail).
fn expert_act(ffn: &MoeFfn, expert: usize, gate: &mut [f32], up: &mut [f32]) {
    let f = ffn.params.n_ff_exp;
    if let Some(b) = &ffn.biases {
        ops::add_in_place(gate, &b.gate[expert * f..][..f]);
        ops::add_in_place(up, &b.up[expert * f..][..f]);
    }
    match ffn.params.act {
        ExpertAct::Silu => ops::swiglu(gate, up),
        ExpertAct::SwigluOai => swiglu_oai(gate, up),
    }
}

/// Expert `expert`'s down bias (gpt-oss) added to one output row.
fn down_bias(ffn: &MoeFfn, expert: usize, row: &mut [f32]) {
    if let Some(b) = &ffn.biases {
        let e = row.len();
        ops::add_in_place(row, &b.down[expert * e..][..e]);
    }
}

/// gpt-oss's clamped SwiGLU in place of `gate`, as ggml's `swiglu_oai` computes it (α 1.702,
/// limit 7): x = min(gate, 7), y = clamp(up, −7, 7), x / (1 + e^(α·(−x))) · (y + 1), with the C
/// library's `expf`.
pub fn swiglu_oai(gate: &mut [f32], up: &[f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(LIMIT);
        let y = u.clamp(-LIMIT, LIMIT);
        let out_glu = x / (1.0 + (ALPHA * (-x)).exp());
        *g = out_glu * (y + 1.0);
    }
}

/// Appends the indices of the `k` largest of `probs` to `out`, largest first; equal values in
/// the order of their indices. llama.cpp sorts a row of indices with `std::sort` and a
/// greater-than comparison (`ggml_argsort`, descending); libstdc++ sorts up to 16 elements by
/// insertion, which keeps equal values in index order, as this does for any count. (With more
/// than 16 experts its introsort may order exactly equal probabilities otherwise.)
pub fn top_k(probs: &[f32], k: usize, out: &mut Vec<usize>) {
    let mut idx: Vec<usize> = (0..probs.len()).collect();
    // A stable sort on "greater first" keeps ties in index order.
    idx.sort_by(|&a, &b| {
        probs[b]
            .partial_cmp(&probs[a])
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    out.extend_from_slice(&idx[..k]);
}

/// Appends the weights of the `chosen` experts to `out`: their probabilities, divided by their
/// sum when `normalise` (ggml's `sum_rows` in f64, clamped below at 2^-14, then `div`).
pub fn expert_weights(probs: &[f32], chosen: &[usize], normalise: bool, out: &mut Vec<f32>) {
    let first = out.len();
    out.extend(chosen.iter().map(|&c| probs[c]));
    if normalise {
        let sum = out[first..].iter().map(|&w| w as f64).sum::<f64>() as f32;
        let sum = sum.max(6.103_515_6e-5);
        out[first..].iter_mut().for_each(|w| *w /= sum);
    }
}

/// y row t = Σ_j weights[t, j] · out[t, j], each product rounded and the sum taken in the
/// order of choice (llama.cpp's `ggml_mul` by the weights, then one `ggml_add` per expert).
fn combine(out: &[f32], weights: &[f32], (k, e): (usize, usize), y: &mut [f32]) {
    for (t, yt) in y.chunks_exact_mut(e).enumerate() {
        for j in 0..k {
            let w = weights[t * k + j];
            let o = &out[(t * k + j) * e..(t * k + j + 1) * e];
            if j == 0 {
                yt.iter_mut().zip(o).for_each(|(y, &o)| *y = o * w);
            } else {
                yt.iter_mut().zip(o).for_each(|(y, &o)| *y += o * w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        for n in [8, 16, 60, 64] {
            let mut x: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32) * 0.3 - 1.0).collect();
            let orig = x.clone();
            softmax_ggml(&mut x);
            let s: f32 = x.iter().sum();
            assert!((s - 1.0).abs() < 1e-5, "{n}: {s}");
            for i in 0..n {
                for j in 0..n {
                    if orig[i] > orig[j] {
                        assert!(x[i] >= x[j]);
                    }
                }
            }
        }
    }

    #[test]
    fn top_k_breaks_ties_by_index() {
        let mut out = vec![];
        top_k(&[0.1, 0.3, 0.2, 0.3, 0.1], 3, &mut out);
        assert_eq!(out, [1, 3, 2]);
    }

    #[test]
    fn weights_renormalise_only_when_asked() {
        let probs = [0.1, 0.4, 0.2, 0.3];
        let mut w = vec![];
        expert_weights(&probs, &[1, 3], false, &mut w);
        assert_eq!(w, [0.4, 0.3]);
        w.clear();
        expert_weights(&probs, &[1, 3], true, &mut w);
        assert!((w[0] - 4.0 / 7.0).abs() < 1e-7 && (w[1] - 3.0 / 7.0).abs() < 1e-7);
    }
}
