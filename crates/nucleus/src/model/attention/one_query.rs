//! llama.cpp's flash-attention decode path: one query per head, rounded to f16, keys visited
//! one at a time with an online softmax, the output accumulated in f16 (or, over a quantized
//! cache, the query quantized and an f32 accumulator).

use half::f16;

use super::{apply_sink, ScoreScale};
use crate::kernels::expf_libm::expf_libm_in_place;
use crate::kernels::f16 as f16k;
use crate::kernels::tile;
use crate::kv_cache::{BlockId, KvCache, KvType};
use crate::quant::{quantize_row_act, vec_dot, vec_dot_type};

/// out_h = softmax(scale · q_h·Kᵀ) · V over positions `[start, end)` of the sequence whose
/// blocks are `blocks`, for each query `qs[h]` of a head that reads KV head `kv_head` (into
/// `outs[h]`), without ever holding more than a few scores.
///
/// The arithmetic is llama.cpp's CPU flash-attention decode path, so that our logits agree with
/// the reference to the last bit where they can: each query is rounded to f16, keys are visited
/// one at a time, and the output accumulates in f16. Every generated token uses it, whatever
/// else is in its batch, so a sequence's results do not depend on how it was batched (llama.cpp
/// itself switches to an f32 tiled path at 64 queries per batch, which makes its own outputs
/// batch-dependent). Each head's arithmetic is its own: the heads only share the reading of the
/// keys and values (each widened once for all) and the calls to `expf`. Over a quantized cache,
/// one head at a time ([`attend_head_blocks`]). `sinks`: each query's attention sink
/// ([`apply_sink`]), when the model has them.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(
    kv: &KvCache,
    layer: usize,
    blocks: &[BlockId],
    kv_head: usize,
    qs: &[&[f32]],
    range: (usize, usize),
    (scale, sinks): (ScoreScale, Option<&[f32]>),
    outs: &mut [&mut [f32]],
) {
    assert_eq!(qs.len(), outs.len());
    assert!(sinks.is_none_or(|s| s.len() == qs.len()));
    let cfg = kv.config();
    if cfg.ty != KvType::F16 {
        for (h, (q, out)) in qs.iter().zip(outs.iter_mut()).enumerate() {
            let sink = sinks.map(|s| s[h]);
            attend_head_blocks(kv, layer, blocks, kv_head, q, range, (scale, sink), out);
        }
        return;
    }
    let (start, end) = range;
    let (bs, dk, dv) = (cfg.block_size, cfg.head_dim_k, cfg.head_dim_v);
    let nh = qs.len();
    // Each query rounded to f16 (as llama.cpp rounds it), then widened for the dots.
    let qw: Vec<Vec<f32>> = qs
        .iter()
        .map(|q| q[..dk].iter().map(|&x| f16::from_f32(x).to_f32()).collect())
        .collect();
    let mut accs = vec![f16::ZERO; nh * dv];
    let mut key = vec![0f32; dk];
    let mut soft = OnlineSoftmax::new(nh);
    let mut pos = start;
    while pos < end {
        let g = GROUP.min(end - pos);
        let mut values: [&[f16]; GROUP] = [&[]; GROUP];
        for i in 0..g {
            let (block, slot) = (blocks[(pos + i) / bs], (pos + i) % bs);
            let k = &kv.block_keys(layer, block, kv_head)[slot * dk..(slot + 1) * dk];
            tile::widen_f16(&mut key, k);
            for (h, q) in qw.iter().enumerate() {
                soft.scores[i * nh + h] = scale.score(f16k::dot_f16_widened(q, &key));
            }
            values[i] = &kv.block_values(layer, block, kv_head)[slot * dv..(slot + 1) * dv];
        }
        soft.weigh(g);
        f16k::acc_steps_f16_many(&mut accs, dv, &values[..g], &soft.steps);
        pos += g;
    }
    for h in 0..nh {
        let out = &mut outs[h][..dv];
        for (o, a) in out.iter_mut().zip(&accs[h * dv..(h + 1) * dv]) {
            *o = a.to_f32();
        }
        let mut sum = soft.sum[h];
        if let Some(s) = sinks {
            sum = apply_sink(s[h], soft.max[h], sum, out);
        }
        let inv = 1.0 / sum;
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

/// Keys scored a group at a time in [`attend_heads`].
const GROUP: usize = f16k::MANY_ROWS;

/// The online softmax of [`attend_heads`]' heads, a group of keys at a time: each head's
/// maximum and sum so far, and for the group being folded in the scores (key-major: key `i` of
/// head `h` at `i·nh + h`) and the steps they make of each head's accumulator.
struct OnlineSoftmax {
    nh: usize,
    max: Vec<f32>,
    sum: Vec<f32>,
    scores: Vec<f32>,
    /// Whether a key raises its head's maximum, and its exponent (in lanes of four: the
    /// padding computes e^0).
    grows: Vec<bool>,
    exps: Vec<f32>,
    run_max: Vec<f32>,
    steps: Vec<[f16k::AccStep; GROUP]>,
}

impl OnlineSoftmax {
    fn new(nh: usize) -> OnlineSoftmax {
        let none = f16k::AccStep {
            rescale: None,
            weight: 0.0,
        };
        OnlineSoftmax {
            nh,
            max: vec![f32::NEG_INFINITY; nh],
            sum: vec![0f32; nh],
            scores: vec![0f32; GROUP * nh],
            grows: vec![false; GROUP * nh],
            exps: vec![0f32; (GROUP * nh).div_ceil(4) * 4],
            run_max: vec![0f32; nh],
            steps: vec![[none; GROUP]; nh],
        }
    }

    /// Folds the first `g` keys' scores into the maxima and sums, and writes their steps.
    /// Key by key for each head: the exponent is of the old maximum less the score where the
    /// score is the new maximum, else of the score less the maximum (which depends on the
    /// scores alone); then every exponent of the group through the library's expf at once,
    /// and the updates in order.
    fn weigh(&mut self, g: usize) {
        let nh = self.nh;
        self.run_max.copy_from_slice(&self.max);
        for i in 0..g {
            for h in 0..nh {
                let (s, m) = (self.scores[i * nh + h], &mut self.run_max[h]);
                self.grows[i * nh + h] = s > *m;
                self.exps[i * nh + h] = if s > *m { *m - s } else { s - *m };
                if s > *m {
                    *m = s;
                }
            }
        }
        self.exps[g * nh..].fill(0.0);
        expf_libm_in_place(&mut self.exps);
        for i in 0..g {
            for h in 0..nh {
                let e = self.exps[i * nh + h];
                let step = &mut self.steps[h][i];
                let (ms, vs) = if self.grows[i * nh + h] {
                    self.max[h] = self.scores[i * nh + h];
                    step.rescale = Some(e);
                    (e, 1.0)
                } else {
                    step.rescale = None;
                    (1.0, e)
                };
                step.weight = vs;
                self.sum[h] = self.sum[h].mul_add(ms, vs);
            }
        }
    }
}

/// One head of [`attend_heads`] over a quantized cache (Q8_0/Q4_0 keys and values), with the arithmetic of
/// llama.cpp's flash-attention decode path for such a cache: the query quantized to Q8_0 once
/// and each key scored with the type's integer dot product, each value row converted to f32
/// and folded into an f32 accumulator (rescaled when the maximum grows). Keys and values are
/// read in their blocks, one row at a time: no dequantized copy of the cache.
#[allow(clippy::too_many_arguments)]
fn attend_head_blocks(
    kv: &KvCache,
    layer: usize,
    blocks: &[BlockId],
    kv_head: usize,
    q: &[f32],
    (start, end): (usize, usize),
    (scale, sink): (ScoreScale, Option<f32>),
    out: &mut [f32],
) {
    let cfg = kv.config();
    let (bs, dk, dv) = (cfg.block_size, cfg.head_dim_k, cfg.head_dim_v);
    debug_assert!(dk <= 512 && dv <= 512);
    let ty = cfg.ty.ggml();
    // Q8_0: 34 bytes per 32 values.
    let mut q8 = [0u8; 512 / 32 * 34];
    let q8 = &mut q8[..dk / 32 * 34];
    quantize_row_act(vec_dot_type(ty), &q[..dk], q8);
    let mut acc = [0f32; 512];
    let acc = &mut acc[..dv];
    let mut value = [0f32; 512];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    for pos in start..end {
        let (block, slot) = (blocks[pos / bs], pos % bs);
        let s = scale.score(vec_dot(
            ty,
            kv.key_blocks(layer, block, kv_head, slot),
            q8,
            dk,
        ));
        let (ms, vs) = if s > max {
            let ms = (max - s).exp();
            max = s;
            acc.iter_mut().for_each(|a| *a *= ms);
            (ms, 1.0)
        } else {
            (1.0, (s - max).exp())
        };
        kv.read_value(layer, block, kv_head, slot, &mut value);
        for (a, &v) in acc.iter_mut().zip(&value[..dv]) {
            *a = v.mul_add(vs, *a);
        }
        sum = sum.mul_add(ms, vs);
    }
    if let Some(s) = sink {
        sum = apply_sink(s, max, sum, acc);
    }
    let inv = 1.0 / sum;
    for (o, a) in out[..dv].iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
}
