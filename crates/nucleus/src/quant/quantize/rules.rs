//! llama-quantize's per-tensor rules (`src/llama-quant.cpp`): which tensors are quantized,
//! which type each gets under a mix (the attn_v and ffn_down bumps of the `_M` mixes, the
//! output tensor's Q6_K, ...), and the fallbacks for rows that are not a whole number of
//! blocks. Only the branches of the mixes in [`MIXES`](super::MIXES) are kept.

use super::mixes::Mix;
use crate::gguf::Metadata;
use crate::quant::GgmlType;

/// What the rules need to know about the model (llama.cpp reads them as hyperparameters).
#[derive(Clone, Debug, Default)]
pub struct ModelFacts {
    pub arch: String,
    pub n_layer: i64,
    pub n_head: i64,
    pub n_head_kv: i64,
    pub n_expert: i64,
}

impl ModelFacts {
    pub fn from_metadata(meta: &Metadata) -> Self {
        let arch = meta
            .get_str("general.architecture")
            .unwrap_or("")
            .to_string();
        // A per-layer array counts as its first layer's value, as llama.cpp's n_head(0).
        let int = |key: &str| -> Option<i64> {
            let v = meta.get(&format!("{arch}.{key}"))?;
            v.as_i64().or_else(|| v.as_array()?.first()?.as_i64())
        };
        let n_head = int("attention.head_count").unwrap_or(0);
        ModelFacts {
            n_layer: int("block_count").unwrap_or(0),
            n_head,
            n_head_kv: int("attention.head_count_kv").unwrap_or(n_head),
            n_expert: int("expert_count").unwrap_or(0),
            arch,
        }
    }

    fn n_gqa(&self) -> i64 {
        if self.n_head_kv == 0 {
            0
        } else {
            self.n_head / self.n_head_kv
        }
    }

    fn is_falcon(&self) -> bool {
        self.arch == "falcon"
    }

    /// llama.cpp's LLM_TYPE_70B: 80 llama layers with grouped-query attention.
    fn is_70b(&self) -> bool {
        self.arch == "llama" && self.n_layer == 80 && self.n_head != self.n_head_kv
    }
}

/// The layer number of a `blk.N.` tensor name (as `sscanf("blk.%d.")` reads it).
pub fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let end = rest
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
        .map_or(rest.len(), |(i, _)| i);
    rest[..end].parse().ok()
}

/// The order llama-quantize writes tensors in (its loader's map): by layer, tensors outside
/// any layer first, then by name.
pub fn output_order(names: &[&str]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |i: usize| (layer_of(names[i]).unwrap_or(-1), names[i]);
        key(a).cmp(&key(b))
    });
    order
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        Output
    } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        TokenEmbd
    } else if name.contains("attn_qkv.weight")
        || name.contains("attn_kv_b.weight")
        || name.contains("attn_v.weight")
    {
        // llama.cpp treats the fused projections like attn_v (category_is_attn_v).
        AttnV
    } else if name.contains("attn_k.weight") {
        AttnK
    } else if name.contains("attn_q.weight") {
        AttnQ
    } else if name.contains("attn_output.weight") {
        AttnOutput
    } else if name.contains("ffn_up") {
        FfnUp
    } else if name.contains("ffn_gate") {
        FfnGate
    } else if name.contains("ffn_down") {
        FfnDown
    } else {
        Other
    }
}

/// Substrings of the 2-D weights llama-quantize never quantizes (`tensor_allows_quantization`).
const NEVER_QUANTIZED: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// Whether llama-quantize converts this tensor at all (2-D or more, a `weight`, not a norm,
/// not one of the small tables it keeps as they are).
pub fn allows_quantization(name: &str, n_dims: usize) -> bool {
    n_dims >= 2
        && name.ends_with("weight")
        && name != "position_embd.weight"
        && name != "token_types.weight"
        && !NEVER_QUANTIZED.iter().any(|s| name.contains(s))
}

/// One tensor as the planner sees it.
pub struct TensorShape<'a> {
    pub name: &'a str,
    pub dims: &'a [u64],
    pub ty: GgmlType,
}

/// The type each tensor gets, in the order given (which must be [`output_order`]'s: the
/// layer counters of the rules advance in it), and how many needed a row-length fallback.
pub fn plan_types(
    mix: &Mix,
    facts: &ModelFacts,
    tensors: &[TensorShape],
) -> Result<(Vec<GgmlType>, usize), String> {
    let mut state = State {
        mix: *mix,
        facts,
        tied_embeddings: !tensors.iter().any(|t| category(t.name) == Category::Output),
        n_attention_wv: tensors
            .iter()
            .filter(|t| category(t.name) == Category::AttnV)
            .count() as i64,
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
        n_fallback: 0,
    };
    let types = tensors
        .iter()
        .map(|t| state.tensor_type(t))
        .collect::<Result<_, _>>()?;
    Ok((types, state.n_fallback))
}

struct State<'a> {
    mix: Mix,
    facts: &'a ModelFacts,
    tied_embeddings: bool,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
    n_fallback: usize,
}

fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

impl State<'_> {
    fn tensor_type(&mut self, t: &TensorShape) -> Result<GgmlType, String> {
        if !allows_quantization(t.name, t.dims.len()) {
            return Ok(t.ty);
        }
        if !self.mix.is_quantized() {
            return Ok(self.mix.default_type);
        }
        let cat = category(t.name);
        let chosen = self.rule(t, cat)?;
        Ok(self.fallback(t, chosen))
    }

    /// The layer of a tensor for the layer-dependent rules: the running count, or (for
    /// mixture-of-experts models, whose expert tensors are not in layer order) its name's.
    fn layer_info(&self, counter: i64, name: &str) -> Result<(i64, i64), String> {
        let n = self.facts.n_layer;
        if self.facts.n_expert > 1 {
            let i = layer_of(name)
                .ok_or_else(|| format!("cannot tell the layer of tensor {name:?}"))?;
            if i < 0 || i >= n {
                return Err(format!("tensor {name:?}: layer {i} is not in [0, {n})"));
            }
            return Ok((i, n));
        }
        Ok((counter, n))
    }

    fn rule(&mut self, t: &TensorShape, cat: Category) -> Result<GgmlType, String> {
        use GgmlType::*;
        let f = self.facts;
        let mix = self.mix.name;
        let mut ty = self.mix.default_type;
        let falcon = f.is_falcon();
        if mix == "MXFP4_MOE" {
            // The expert tensors (3-D) to MXFP4, every other matrix (the output's too) to
            // Q8_0; no other rule.
            let experts = t.dims.get(2).is_some_and(|&n| n > 1);
            return Ok(if experts { MXFP4 } else { Q8_0 });
        }
        match cat {
            // With tied embeddings token_embd is also the output matrix.
            Category::Output | Category::TokenEmbd
                if cat == Category::Output || self.tied_embeddings =>
            {
                let nx = t.dims[0] as usize;
                if falcon || !nx.is_multiple_of(ty.block_size()) {
                    ty = Q8_0;
                } else if ty != Q8_0 {
                    ty = Q6_K;
                }
            }
            Category::Output | Category::TokenEmbd => {}
            Category::AttnV => ty = self.attn_v_type(ty),
            Category::AttnK => {
                if f.n_expert == 8 {
                    ty = Q8_0;
                }
            }
            Category::AttnQ | Category::Other => {}
            Category::FfnDown => ty = self.ffn_down_type(t, ty)?,
            Category::AttnOutput => ty = self.attn_output_type(ty),
            Category::FfnGate => {
                self.layer_info(self.i_ffn_gate, t.name)?;
                self.i_ffn_gate += 1;
            }
            Category::FfnUp => {
                self.layer_info(self.i_ffn_up, t.name)?;
                self.i_ffn_up += 1;
            }
        }
        Ok(ty)
    }

    /// `attn_v`: more bits in the first layers of some mixes and for GQA, Q8_0 with 8 experts.
    fn attn_v_type(&mut self, mut ty: GgmlType) -> GgmlType {
        use GgmlType::*;
        let (f, mix) = (self.facts, self.mix.name);
        let (i, n) = (self.i_attention_wv, self.n_attention_wv);
        match mix {
            "Q2_K" => ty = if f.n_gqa() >= 4 { Q4_K } else { Q3_K },
            "Q3_K_M" => ty = if i < 2 { Q5_K } else { Q4_K },
            "Q3_K_L" => ty = Q5_K,
            "IQ4_NL" | "IQ4_XS" if f.n_gqa() >= 4 => ty = Q5_K,
            "Q4_K_M" | "Q5_K_M" if use_more_bits(i, n) => ty = Q6_K,
            "Q4_K_S" if i < 4 => ty = Q5_K,
            _ => {}
        }
        if f.is_70b() && matches!(ty, Q3_K | Q4_K) {
            ty = Q5_K;
        }
        if f.n_expert == 8 {
            ty = Q8_0;
        }
        self.i_attention_wv += 1;
        ty
    }

    /// `ffn_down`: more bits in the first and in every third layer of the middle, by mix.
    fn ffn_down_type(&mut self, t: &TensorShape, mut ty: GgmlType) -> Result<GgmlType, String> {
        use GgmlType::*;
        let (falcon, mix) = (self.facts.is_falcon(), self.mix.name);
        let (i, n) = self.layer_info(self.i_ffn_down, t.name)?;
        match mix {
            "Q2_K" => ty = Q3_K,
            "Q3_K_M" => {
                ty = if i < n / 16 {
                    Q5_K
                } else if !falcon || use_more_bits(i, n) {
                    Q4_K
                } else {
                    Q3_K
                }
            }
            "Q3_K_L" => ty = if falcon { Q4_K } else { Q5_K },
            "Q4_K_M" if falcon => {
                ty = if i < n / 16 {
                    Q6_K
                } else if use_more_bits(i, n) {
                    Q5_K
                } else {
                    Q4_K
                }
            }
            "Q4_K_M" if use_more_bits(i, n) => ty = Q6_K,
            "Q4_K_M" => {}
            "IQ4_NL" | "IQ4_XS" if i < n / 8 => ty = Q5_K,
            "Q5_K_M" if use_more_bits(i, n) => ty = Q6_K,
            "Q4_K_S" if !falcon && i < n / 8 => ty = Q5_K,
            _ => {}
        }
        self.i_ffn_down += 1;
        Ok(ty)
    }

    /// `attn_output`: more bits for the low mixes, Q5_K with 8 experts.
    fn attn_output_type(&self, mut ty: GgmlType) -> GgmlType {
        use GgmlType::*;
        let (f, mix) = (self.facts, self.mix.name);
        if !f.is_falcon() {
            if f.n_expert == 8 {
                let bumped = [
                    "Q2_K", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ4_XS",
                ];
                if bumped.contains(&mix) {
                    ty = Q5_K;
                }
            } else {
                match mix {
                    "Q2_K" => ty = Q3_K,
                    "Q3_K_M" => ty = Q4_K,
                    "Q3_K_L" => ty = Q5_K,
                    _ => {}
                }
            }
        } else if mix == "Q3_K_L" {
            ty = Q4_K;
        }
        ty
    }

    /// A type whose block does not divide the row length falls back to a 32-block type of
    /// about the same size, and to F16 when even that does not fit (`tensor_type_fallback`).
    fn fallback(&mut self, t: &TensorShape, ty: GgmlType) -> GgmlType {
        use GgmlType::*;
        let ncols = t.dims[0] as usize;
        if ncols.is_multiple_of(ty.block_size()) {
            return ty;
        }
        self.n_fallback += 1;
        let to = match ty {
            IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
            Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
            Q4_K => Q5_0,
            Q5_K => Q5_1,
            Q6_K => Q8_0,
            other => other,
        };
        if ncols.is_multiple_of(to.block_size()) {
            to
        } else {
            F16
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(mix: &str, facts: &ModelFacts, tensors: &[(&str, &[u64])]) -> Vec<GgmlType> {
        let shapes: Vec<TensorShape> = tensors
            .iter()
            .map(|&(name, dims)| TensorShape {
                name,
                dims,
                ty: GgmlType::F16,
            })
            .collect();
        plan_types(&Mix::parse(mix).unwrap(), facts, &shapes)
            .unwrap()
            .0
    }

    #[test]
    fn order_is_by_layer_then_name() {
        let names = [
            "blk.10.a",
            "output.weight",
            "blk.2.b",
            "blk.2.a",
            "token_embd.weight",
        ];
        let order: Vec<&str> = output_order(&names).iter().map(|&i| names[i]).collect();
        assert_eq!(
            order,
            [
                "output.weight",
                "token_embd.weight",
                "blk.2.a",
                "blk.2.b",
                "blk.10.a"
            ]
        );
    }

    #[test]
    fn q4_k_m_bumps_and_fallbacks() {
        use GgmlType::*;
        let facts = ModelFacts {
            arch: "llama".into(),
            n_layer: 8,
            n_head: 8,
            n_head_kv: 2,
            n_expert: 0,
        };
        let d = |a: u64| -> &'static [u64] { Box::leak(vec![a, 4].into_boxed_slice()) };
        let mut tensors = vec![
            ("token_embd.weight", d(512)),
            ("output_norm.weight", &[512u64][..]),
        ];
        let names: Vec<String> = (0..8).map(|i| format!("blk.{i}.ffn_down.weight")).collect();
        for n in &names {
            tensors.push((n.as_str(), d(512)));
        }
        tensors.push(("blk.0.attn_v.weight", d(96)));
        tensors.push(("blk.1.attn_q.weight", d(80)));
        let types = plan("Q4_K_M", &facts, &tensors);
        // Tied embeddings: token_embd takes the output rule.
        assert_eq!(types[0], Q6_K);
        assert_eq!(types[1], F16, "1-D tensors keep their type");
        // use_more_bits(i, 8): the first and last eighth, and every third from 3.
        let down: Vec<GgmlType> = types[2..10].to_vec();
        assert_eq!(down, [Q6_K, Q4_K, Q4_K, Q6_K, Q4_K, Q4_K, Q6_K, Q6_K]);
        // attn_v: Q6_K by use_more_bits, 96 columns: Q8_0.
        assert_eq!(types[10], Q8_0);
        // 80 columns fit no block: F16.
        assert_eq!(types[11], F16);
    }
}
