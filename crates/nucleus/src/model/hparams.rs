//! Hyperparameters read from GGUF metadata, and the small set of per-architecture facts that
//! make llama, qwen2, qwen3, gemma2, gemma3 and phi3 differ. Architectures are data here, not
//! separate models; each one's facts follow its builder in llama.cpp (`src/models/ARCH.cpp`).

use crate::gguf::Metadata;

use super::ModelError;
pub use crate::kernels::rope::Yarn;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, Mistral, SmolLM, TinyLlama. (A sliding window in its metadata is ignored, as
    /// llama.cpp's llama architecture ignores it.)
    Llama,
    /// Llama with biases on q/k/v and NeoX-style RoPE.
    Qwen2,
    /// Qwen3: NeoX RoPE, per-head RMS norms of q and k, no q/k/v biases.
    Qwen3,
    /// Gemma 2: Gemma's scaled embeddings, post-norms and GELU FFN, soft-capped attention scores
    /// and logits, every other layer a sliding window.
    Gemma2,
    /// Gemma 3: scaled embeddings, q/k norms, post-norms, GELU FFN, interleaved sliding-window layers.
    Gemma3,
    /// Phi-3 and Phi-4: q/k/v in one matrix, gate and up in one, NeoX RoPE, scaled queries.
    Phi3,
    /// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder): Qwen3's attention, a mixture-of-experts FFN
    /// whose top-k weights are renormalised.
    Qwen3Moe,
    /// OLMoE: NeoX RoPE, RMS norms of q and k over all heads at once, a mixture-of-experts FFN
    /// whose top-k weights are not renormalised.
    Olmoe,
    /// gpt-oss (llama.cpp's `openai-moe`): attention sinks, a sliding window on every other
    /// layer, YaRN, biases on q/k/v/o, a biased router whose top-k logits are softmaxed, biased
    /// experts with a clamped SwiGLU, MXFP4 experts.
    GptOss,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "gemma2" => Some(Arch::Gemma2),
            "gemma3" => Some(Arch::Gemma3),
            "phi3" => Some(Arch::Phi3),
            "qwen3moe" => Some(Arch::Qwen3Moe),
            "olmoe" => Some(Arch::Olmoe),
            "gpt-oss" => Some(Arch::GptOss),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Olmoe => "olmoe",
            Arch::GptOss => "gpt-oss",
        }
    }

    pub const SUPPORTED: &'static [&'static str] = &[
        "llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen3moe", "olmoe", "gpt-oss",
    ];
}

/// How RoPE pairs up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): llama.cpp's "normal" RoPE (GGUF llama weights are
    /// permuted for it).
    Interleaved,
    /// Halves (x[i], x[i + d/2]): GPT-NeoX style, used by Qwen2 and Gemma.
    Neox,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: silu(gate) * up.
    Silu,
    /// GeGLU with the tanh approximation of GELU.
    Gelu,
}

/// Which RMS norms q and k get before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// One norm per head, its weight `head_dim` long (Qwen3, Gemma 3).
    PerHead,
    /// One norm over all heads of a token, its weight as long as q (or k) (OLMoE).
    AllHeads,
}

/// How a router's logits choose the experts and weigh them (llama.cpp's
/// `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts, the top k chosen by probability (Qwen3-MoE, Mixtral, OLMoE).
    Softmax,
    /// The top k chosen by logit, their weights the softmax of their k logits (gpt-oss).
    SoftmaxWeight,
}

/// An expert's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertAct {
    /// silu(gate) ⊙ up.
    Silu,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`, α 1.702, limit 7):
    /// g = min(gate, 7), u = clamp(up, −7, 7), g·σ(1.702·g)·(u + 1).
    SwigluOai,
}

/// The mixture-of-experts FFN of a model whose layers route each token to a few experts
/// (llama.cpp's `build_moe_ffn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeParams {
    /// `{arch}.expert_count`.
    pub n_expert: usize,
    /// `{arch}.expert_used_count`: the experts each token runs through.
    pub n_expert_used: usize,
    /// The hidden size of one expert (`{arch}.expert_feed_forward_length`, or the
    /// architecture's default).
    pub n_ff_exp: usize,
    /// Whether the chosen experts' softmax weights are divided by their sum (Qwen3-MoE,
    /// Mixtral), or used as they are (OLMoE).
    pub norm_weights: bool,
    pub gating: Gating,
    pub act: ExpertAct,
}

/// The most experts a layer may have (llama.cpp's `LLAMA_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 512;

#[derive(Clone, Debug)]
pub struct HParams {
    pub arch: Arch,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Dimension of each query/key head.
    pub head_dim: usize,
    /// Dimension of each value head.
    pub head_dim_v: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_style: RopeStyle,
    /// Dimensions of each head that RoPE rotates (the rest pass through).
    pub rope_dim: usize,
    pub rope_base: f32,
    /// RoPE base of sliding-window layers (Gemma 3 uses 10 000 there).
    pub rope_base_swa: f32,
    /// Linear RoPE scaling: positions are multiplied by this.
    pub rope_freq_scale: f32,
    /// YaRN RoPE scaling (with `rope_freq_scale` as its interpolation factor), if the file
    /// asks for it.
    pub yarn: Option<Yarn>,
    pub activation: Activation,
    /// Multiplies the token embeddings (Gemma: sqrt(n_embd)).
    pub embd_scale: f32,
    /// Multiplies q·k.
    pub attn_scale: f32,
    /// Whether `attn_scale` multiplies the queries before attention (Gemma 3, as llama.cpp
    /// computes it: the scaled queries are then rounded to f16) rather than the scores.
    pub scale_queries: bool,
    /// Sliding-window size of the local layers, if any.
    pub sliding_window: Option<usize>,
    /// With a sliding window: layer `il` is local unless `(il + 1) % swa_period == 0`.
    pub swa_period: usize,
    /// RMS norms of q and k before RoPE.
    pub qk_norm: QkNorm,
    /// Gemma's post-attention / post-FFN norms.
    pub post_norms: bool,
    pub qkv_bias: bool,
    /// Attention scores become `cap · tanh(score / cap)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Logits become `cap · tanh(logit / cap)` (Gemma 2).
    pub final_softcap: Option<f32>,
    /// The mixture-of-experts FFN, for models that have one (in every layer).
    pub moe: Option<MoeParams>,
}

impl HParams {
    pub fn from_metadata(meta: &Metadata, n_vocab: usize) -> Result<HParams, ModelError> {
        let arch_name = meta
            .get_str("general.architecture")
            .ok_or_else(|| ModelError::Invalid("no general.architecture in metadata".into()))?;
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ModelError::UnsupportedArch(arch_name.to_string()))?;
        let keys = ArchKeys { meta, arch_name };
        let shape = Shape::read(&keys, arch)?;
        let (rope_base, rope_freq_scale, yarn) = read_rope(&keys)?;
        let mut hp = HParams {
            arch,
            n_layers: shape.n_layers,
            n_embd: shape.n_embd,
            n_ff: shape.n_ff,
            n_head: shape.n_head,
            n_head_kv: shape.n_head_kv,
            head_dim: shape.head_dim,
            head_dim_v: shape.head_dim_v,
            n_vocab,
            n_ctx_train: keys.opt("context_length").unwrap_or(2048),
            rms_eps: keys.f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            rope_style: RopeStyle::Interleaved,
            rope_dim: shape.rope_dim,
            rope_base,
            rope_base_swa: rope_base,
            rope_freq_scale,
            yarn,
            activation: Activation::Silu,
            embd_scale: 1.0,
            attn_scale: 1.0 / (shape.head_dim as f32).sqrt(),
            scale_queries: false,
            sliding_window: None,
            swa_period: 0,
            qk_norm: QkNorm::None,
            post_norms: false,
            qkv_bias: false,
            attn_softcap: None,
            final_softcap: None,
            moe: None,
        };
        hp.apply_family(&keys)?;
        hp.moe = moe_params(meta, arch_name, arch, hp.n_ff)?;
        Ok(hp)
    }

    /// What makes each family differ from llama (llama.cpp's `src/models/ARCH.cpp`).
    fn apply_family(&mut self, keys: &ArchKeys) -> Result<(), ModelError> {
        match self.arch {
            Arch::Llama => {}
            Arch::Qwen2 => {
                self.rope_style = RopeStyle::Neox;
                self.qkv_bias = true;
            }
            Arch::Qwen3 => {
                self.rope_style = RopeStyle::Neox;
                self.qk_norm = QkNorm::PerHead;
            }
            Arch::Qwen3Moe => {
                self.rope_style = RopeStyle::Neox;
                self.qk_norm = QkNorm::PerHead;
            }
            Arch::Olmoe => {
                self.rope_style = RopeStyle::Neox;
                self.qk_norm = QkNorm::AllHeads;
            }
            Arch::Gemma2 => self.apply_gemma2(keys)?,
            Arch::Phi3 => {
                self.rope_style = RopeStyle::Neox;
                self.scale_queries = true;
                // Its sliding window is ignored, as llama.cpp ignores it ("Phi SWA is currently
                // disabled").
            }
            Arch::Gemma3 => self.apply_gemma3(keys),
            Arch::GptOss => self.apply_gpt_oss(keys)?,
        }
        Ok(())
    }

    /// Gemma 2: soft caps, and every other layer a sliding window.
    fn apply_gemma2(&mut self, keys: &ArchKeys) -> Result<(), ModelError> {
        self.rope_style = RopeStyle::Neox;
        self.activation = Activation::Gelu;
        self.embd_scale = (self.n_embd as f32).sqrt();
        self.post_norms = true;
        // Local layers alternate with global ones (llama.cpp's default window is 4096);
        // they keep the model's RoPE base unless the file names another.
        self.sliding_window =
            Some(keys.opt("attention.sliding_window").unwrap_or(4096)).filter(|&w| w > 0);
        self.swa_period = gemma2_swa_period(keys)?;
        self.rope_base_swa = keys.f32("rope.freq_base_swa").unwrap_or(self.rope_base);
        // query_pre_attn_scalar: the head dimension, but n_embd / n_head for the 27B
        // (46 layers), as llama.cpp decides it.
        let scalar = if self.n_layers == 46 {
            self.n_embd / self.n_head
        } else {
            self.head_dim
        };
        self.attn_scale = 1.0 / (scalar as f32).sqrt();
        self.scale_queries = true;
        self.attn_softcap = Some(keys.softcap("attn_logit_softcapping", 50.0)?);
        self.final_softcap = Some(keys.softcap("final_logit_softcapping", 30.0)?);
        Ok(())
    }

    /// Gemma 3: q/k norms, and five sliding-window layers for every global one.
    fn apply_gemma3(&mut self, keys: &ArchKeys) {
        self.rope_style = RopeStyle::Neox;
        self.activation = Activation::Gelu;
        self.embd_scale = (self.n_embd as f32).sqrt();
        self.qk_norm = QkNorm::PerHead;
        self.post_norms = true;
        // Five local (sliding-window) layers for every global one; the local layers keep
        // the classic RoPE base.
        self.sliding_window = keys.opt("attention.sliding_window").filter(|&w| w > 0);
        self.swa_period = 6;
        self.rope_base_swa = keys.f32("rope.freq_base_swa").unwrap_or(10_000.0);
        // query_pre_attn_scalar is the head dimension for every size but 27B.
        self.attn_scale = 1.0 / (self.head_dim as f32).sqrt();
        self.scale_queries = true;
    }

    /// gpt-oss: NeoX RoPE, q/k/v/o biases, and every other layer (the even ones) a sliding
    /// window (`attention.sliding_window`, required, as llama.cpp requires it).
    fn apply_gpt_oss(&mut self, keys: &ArchKeys) -> Result<(), ModelError> {
        self.rope_style = RopeStyle::Neox;
        self.qkv_bias = true;
        self.sliding_window = Some(keys.req("attention.sliding_window")?);
        self.swa_period = gemma2_swa_period(keys)?;
        self.rope_base_swa = keys.f32("rope.freq_base_swa").unwrap_or(self.rope_base);
        Ok(())
    }

    /// The sliding window of layer `il`, or `None` when it attends to the whole context.
    pub fn layer_window(&self, il: usize) -> Option<usize> {
        let w = self.sliding_window?;
        if self.swa_period == 0 || !(il + 1).is_multiple_of(self.swa_period) {
            Some(w)
        } else {
            None
        }
    }

    pub fn layer_rope_base(&self, il: usize) -> f32 {
        if self.layer_window(il).is_some() {
            self.rope_base_swa
        } else {
            self.rope_base
        }
    }
}

/// The metadata keys of one architecture (`{arch}.{key}`).
struct ArchKeys<'a> {
    meta: &'a Metadata,
    arch_name: &'a str,
}

impl ArchKeys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch_name)
    }

    /// A required count, positive and under 2^24.
    fn req(&self, k: &str) -> Result<usize, ModelError> {
        let key = self.key(k);
        let v = self
            .meta
            .get_u64(&key)
            .ok_or_else(|| ModelError::Invalid(format!("missing metadata {key}")))?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v > 0 && v < (1 << 24))
            .ok_or_else(|| ModelError::Invalid(format!("{key} = {v} is out of range")))
    }

    fn opt(&self, k: &str) -> Option<usize> {
        self.meta.get_u64(&self.key(k)).map(|v| v as usize)
    }

    fn f32(&self, k: &str) -> Option<f32> {
        self.meta.get_f32(&self.key(k))
    }

    /// A positive, finite cap, or the architecture's default when the key is absent.
    fn softcap(&self, k: &str, default: f32) -> Result<f32, ModelError> {
        let cap = self.f32(k).unwrap_or(default);
        if cap.is_finite() && cap > 0.0 {
            Ok(cap)
        } else {
            Err(ModelError::Invalid(format!(
                "{} = {cap} is not a positive number",
                self.key(k)
            )))
        }
    }
}

/// The layer and head sizes.
struct Shape {
    n_layers: usize,
    n_embd: usize,
    n_ff: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    head_dim_v: usize,
    rope_dim: usize,
}

impl Shape {
    fn read(keys: &ArchKeys, arch: Arch) -> Result<Shape, ModelError> {
        let n_layers = keys.req("block_count")?;
        let n_embd = keys.req("embedding_length")?;
        // A mixture of experts may give only its experts' size (Qwen3-MoE).
        let n_ff = match arch {
            Arch::Qwen3Moe | Arch::GptOss => keys.opt("feed_forward_length").unwrap_or(0),
            _ => keys.req("feed_forward_length")?,
        };
        let n_head = keys.req("attention.head_count")?;
        let n_head_kv = keys.opt("attention.head_count_kv").unwrap_or(n_head);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::Invalid(format!(
                "{n_head} query heads cannot be shared among {n_head_kv} KV heads"
            )));
        }
        let head_dim = keys.opt("attention.key_length").unwrap_or(n_embd / n_head);
        let head_dim_v = keys.opt("attention.value_length").unwrap_or(head_dim);
        if head_dim == 0
            || head_dim > 512
            || !head_dim.is_multiple_of(2)
            || head_dim_v == 0
            || head_dim_v > 512
        {
            return Err(ModelError::Invalid(format!(
                "head dimensions {head_dim}/{head_dim_v} are not supported (even, at most 512)"
            )));
        }
        let rope_dim = keys.opt("rope.dimension_count").unwrap_or(head_dim);
        if rope_dim > head_dim || !rope_dim.is_multiple_of(2) {
            return Err(ModelError::Invalid(format!(
                "rope dimension {rope_dim} with head dimension {head_dim}"
            )));
        }
        Ok(Shape {
            n_layers,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            rope_dim,
        })
    }
}

/// The RoPE base, the scaling factor (positions are multiplied by it) and YaRN's parameters
/// (llama.cpp's `llama_context` defaults: ext_factor 1, β 32 and 1, its attention factor).
fn read_rope(keys: &ArchKeys) -> Result<(f32, f32, Option<Yarn>), ModelError> {
    let rope_base = keys.f32("rope.freq_base").unwrap_or(10_000.0);
    let factor_key = keys.key("rope.scaling.factor");
    let factor = keys.f32("rope.scaling.factor").unwrap_or(0.0);
    if !factor.is_finite() || factor < 0.0 {
        return Err(ModelError::Invalid(format!(
            "{factor_key} = {factor} is not a positive number"
        )));
    }
    let freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
    match keys.meta.get_str(&keys.key("rope.scaling.type")) {
        None | Some("none") => Ok((rope_base, 1.0, None)),
        Some("linear") => Ok((rope_base, freq_scale, None)),
        Some("yarn") => {
            let n_ctx_orig = keys
                .opt("rope.scaling.original_context_length")
                .filter(|&n| n > 0)
                .or(keys.opt("context_length"))
                .unwrap_or(2048);
            // llama_context: get_mscale(factor) = 0.1·ln(factor) + 1 above 1, cancelled by
            // 1 / (1 + 0.1·ln(factor)) (ggml's rope applies it again), times
            // rope.scaling.attn_factor. (libllama is built without FMA: each step rounded.)
            let f = 1.0 / freq_scale;
            let mut attn = if f <= 1.0 {
                1.0
            } else {
                0.1f32 * 1.0 * f.ln() + 1.0
            };
            attn *= 1.0 / (1.0 + 0.1f32 * f.ln());
            attn *= keys.f32("rope.scaling.attn_factor").unwrap_or(1.0);
            let yarn = Yarn {
                ext_factor: 1.0,
                attn_factor: attn,
                beta_fast: 32.0,
                beta_slow: 1.0,
                n_ctx_orig,
            };
            Ok((rope_base, freq_scale, Some(yarn)))
        }
        Some(other) => Err(ModelError::Invalid(format!(
            "rope scaling {other:?} is not supported yet"
        ))),
    }
}

/// Gemma 2's `attention.sliding_window_pattern`: a period of layers (2 when absent).
fn gemma2_swa_period(keys: &ArchKeys) -> Result<usize, ModelError> {
    let pattern = keys.key("attention.sliding_window_pattern");
    match keys.meta.get(&pattern) {
        None => Ok(2),
        Some(v) => v
            .as_i64()
            .and_then(|p| usize::try_from(p).ok())
            .ok_or_else(|| {
                ModelError::Invalid(format!(
                    "{pattern}: only a period of layers is supported, not {}",
                    v.display_short(40)
                ))
            }),
    }
}

/// The mixture-of-experts hyperparameters, as llama.cpp reads them: `expert_count` and
/// `expert_used_count` (required by qwen3moe and olmoe; a llama file without them is dense),
/// and the experts' size.
fn moe_params(
    meta: &Metadata,
    arch_name: &str,
    arch: Arch,
    n_ff: usize,
) -> Result<Option<MoeParams>, ModelError> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let get = |k: &str| meta.get_u64(&key(k));
    let always = matches!(arch, Arch::Qwen3Moe | Arch::Olmoe | Arch::GptOss);
    // The dense architectures read no experts (llama.cpp builds their dense FFN whatever
    // the metadata says).
    if !always && arch != Arch::Llama {
        return Ok(None);
    }
    let n_expert = match get("expert_count") {
        Some(0) | None if !always => return Ok(None),
        None => {
            return Err(ModelError::Invalid(format!(
                "missing metadata {}",
                key("expert_count")
            )))
        }
        Some(n) => n as usize,
    };
    if !(2..=MAX_EXPERTS).contains(&n_expert) {
        return Err(ModelError::Invalid(format!(
            "{} = {n_expert} is out of range (2 to {MAX_EXPERTS})",
            key("expert_count")
        )));
    }
    let n_expert_used = get("expert_used_count").ok_or_else(|| {
        ModelError::Invalid(format!("missing metadata {}", key("expert_used_count")))
    })? as usize;
    if n_expert_used == 0 || n_expert_used > n_expert {
        return Err(ModelError::Invalid(format!(
            "{} = {n_expert_used} must be between 1 and {} = {n_expert}",
            key("expert_used_count"),
            key("expert_count")
        )));
    }
    // Qwen3-MoE's experts are `expert_feed_forward_length` wide, or n_ff / n_expert_used
    // without it (llama_model_qwen3moe::load_arch_tensors); the others' are n_ff wide.
    let n_ff_exp = match (arch, get("expert_feed_forward_length")) {
        (Arch::Qwen3Moe | Arch::GptOss, Some(n)) => n as usize,
        (Arch::Qwen3Moe, None) => n_ff / n_expert_used,
        (Arch::GptOss, None) => {
            return Err(ModelError::Invalid(format!(
                "missing metadata {}",
                key("expert_feed_forward_length")
            )))
        }
        _ => n_ff,
    };
    if n_ff_exp == 0 || n_ff_exp >= 1 << 24 {
        return Err(ModelError::Invalid(format!(
            "{} = {n_ff_exp} is out of range",
            key("expert_feed_forward_length")
        )));
    }
    Ok(Some(MoeParams {
        n_expert,
        n_expert_used,
        n_ff_exp,
        norm_weights: !matches!(arch, Arch::Olmoe | Arch::GptOss),
        gating: if arch == Arch::GptOss {
            Gating::SoftmaxWeight
        } else {
            Gating::Softmax
        },
        act: if arch == Arch::GptOss {
            ExpertAct::SwigluOai
        } else {
            ExpertAct::Silu
        },
    }))
}

#[cfg(test)]
mod tests;
