//! `config.json`: the hyperparameters of a checkpoint, checked, and written as the GGUF
//! metadata `convert_hf_to_gguf.py` writes for the same model.

use serde_json::Value;

use super::HfError;
use crate::gguf::{MetaValue, Metadata};

/// The checkpoint families nucleus runs, by their `architectures` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM` (Llama 2/3, SmolLM2, TinyLlama, Mistral-style without windows).
    Llama,
    /// `Qwen2ForCausalLM`.
    Qwen2,
}

impl Family {
    /// The GGUF `general.architecture` of the family.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
        }
    }
}

/// How positions are scaled before RoPE.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by the factor.
    Linear(f32),
    /// Llama 3.1's per-frequency factors (written as the `rope_freqs.weight` tensor).
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context: f32,
    },
}

/// The hyperparameters nucleus needs, read from `config.json`.
#[derive(Clone, Debug)]
pub struct Config {
    pub family: Family,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Whether `head_dim` was given explicitly (then written as key/value lengths).
    pub explicit_head_dim: bool,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub tie_embeddings: bool,
    /// Ids from `config.json`, used when `tokenizer_config.json` names no such token.
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

fn bad(msg: impl Into<String>) -> HfError {
    HfError::Config(msg.into())
}

/// A positive integer under 2^24 at `key`.
fn dim(v: &Value, key: &str) -> Result<usize, HfError> {
    let x = v
        .get(key)
        .ok_or_else(|| bad(format!("missing {key:?}")))?
        .as_u64()
        .ok_or_else(|| bad(format!("{key:?} is not a non-negative integer")))?;
    if x == 0 || x >= 1 << 24 {
        return Err(bad(format!("{key:?} = {x} is out of range")));
    }
    Ok(x as usize)
}

fn opt_dim(v: &Value, key: &str) -> Result<Option<usize>, HfError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => dim(v, key).map(Some),
    }
}

fn opt_f32(v: &Value, key: &str) -> Result<Option<f32>, HfError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .filter(|x| x.is_finite())
            .map(|x| Some(x as f32))
            .ok_or_else(|| bad(format!("{key:?} is not a number"))),
    }
}

fn opt_bool(v: &Value, key: &str) -> Option<bool> {
    v.get(key).and_then(Value::as_bool)
}

/// A token id or a list of them (`eos_token_id` is either).
fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect(),
        Some(x) => x
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .into_iter()
            .collect(),
        None => Vec::new(),
    }
}

/// The model family of `architectures`, with the options nucleus does not support refused.
fn family(v: &Value) -> Result<Family, HfError> {
    let arch = v
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no \"architectures\" entry"))?;
    let family = match arch {
        "LlamaForCausalLM" => Family::Llama,
        "Qwen2ForCausalLM" => Family::Qwen2,
        other => return Err(HfError::UnknownArchitecture(other.to_string())),
    };
    if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
        if act != "silu" {
            return Err(bad(format!(
                "hidden_act {act:?} is not supported (only \"silu\")"
            )));
        }
    }
    if opt_bool(v, "mlp_bias") == Some(true) {
        return Err(bad("mlp_bias = true is not supported"));
    }
    if family == Family::Qwen2 && opt_bool(v, "use_sliding_window") == Some(true) {
        return Err(bad("use_sliding_window = true is not supported"));
    }
    Ok(family)
}

/// RoPE's base and scaling (Transformers 5 moved both into `rope_parameters`).
fn rope(v: &Value) -> Result<(f32, RopeScaling), HfError> {
    let rope_params = v.get("rope_parameters").filter(|p| p.is_object());
    let rope_theta = match opt_f32(v, "rope_theta")? {
        Some(t) => t,
        None => match rope_params {
            Some(p) => opt_f32(p, "rope_theta")?.unwrap_or(10_000.0),
            None => 10_000.0,
        },
    };
    if rope_theta <= 0.0 {
        return Err(bad(format!("rope_theta {rope_theta} is not positive")));
    }
    let scaling = v
        .get("rope_scaling")
        .filter(|s| s.is_object())
        .or(rope_params);
    let Some(s) = scaling else {
        return Ok((rope_theta, RopeScaling::None));
    };
    let ty = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = opt_f32(s, "factor")?;
    let scaling = match ty {
        "default" => RopeScaling::None,
        "linear" => {
            let f = factor.ok_or_else(|| bad("linear rope_scaling has no factor"))?;
            if f <= 0.0 {
                return Err(bad(format!("rope_scaling factor {f} is not positive")));
            }
            RopeScaling::Linear(f)
        }
        "llama3" => RopeScaling::Llama3 {
            factor: factor.unwrap_or(8.0),
            low_freq_factor: opt_f32(s, "low_freq_factor")?.unwrap_or(1.0),
            high_freq_factor: opt_f32(s, "high_freq_factor")?.unwrap_or(4.0),
            original_context: opt_f32(s, "original_max_position_embeddings")?.unwrap_or(8192.0),
        },
        other => {
            return Err(bad(format!(
                "rope_scaling type {other:?} is not supported (linear, llama3)"
            )))
        }
    };
    Ok((rope_theta, scaling))
}

impl Config {
    /// Parses and checks `config.json`.
    pub fn parse(text: &str) -> Result<Config, HfError> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let family = family(&v)?;
        let n_embd = dim(&v, "hidden_size")?;
        let n_head = dim(&v, "num_attention_heads")?;
        let n_head_kv = opt_dim(&v, "num_key_value_heads")?.unwrap_or(n_head);
        if n_head % n_head_kv != 0 {
            return Err(bad(format!(
                "num_attention_heads {n_head} is not a multiple of num_key_value_heads {n_head_kv}"
            )));
        }
        let explicit = opt_dim(&v, "head_dim")?;
        if explicit.is_none() && n_embd % n_head != 0 {
            return Err(bad(format!(
                "hidden_size {n_embd} is not a multiple of num_attention_heads {n_head}"
            )));
        }
        let head_dim = explicit.unwrap_or(n_embd / n_head);
        if head_dim % 2 != 0 || head_dim > 512 {
            return Err(bad(format!(
                "head dimension {head_dim} is not supported (even, at most 512)"
            )));
        }

        let (rope_theta, rope_scaling) = rope(&v)?;
        Ok(Config {
            family,
            n_layers: dim(&v, "num_hidden_layers")?,
            n_embd,
            n_ff: dim(&v, "intermediate_size")?,
            n_head,
            n_head_kv,
            head_dim,
            explicit_head_dim: explicit.is_some(),
            n_vocab: dim(&v, "vocab_size")?,
            n_ctx_train: opt_dim(&v, "max_position_embeddings")?.unwrap_or(2048),
            rms_eps: opt_f32(&v, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_embeddings: opt_bool(&v, "tie_word_embeddings").unwrap_or(false),
            bos_token_id: token_ids(v.get("bos_token_id")).first().copied(),
            eos_token_ids: token_ids(v.get("eos_token_id")),
        })
    }

    /// The GGUF metadata of the model (not the tokenizer's), as `convert_hf_to_gguf.py` writes
    /// it.
    pub fn gguf_metadata(&self, name: &str, meta: &mut Metadata) {
        let arch = self.family.gguf_arch();
        let mut put = |k: &str, v: MetaValue| {
            meta.insert(k.to_string(), v);
        };
        let u = |x: usize| MetaValue::U32(x as u32);
        put("general.architecture", MetaValue::String(arch.into()));
        put("general.name", MetaValue::String(name.into()));
        let k = |s: &str| format!("{arch}.{s}");
        put(&k("block_count"), u(self.n_layers));
        put(&k("context_length"), u(self.n_ctx_train));
        put(&k("embedding_length"), u(self.n_embd));
        put(&k("feed_forward_length"), u(self.n_ff));
        put(&k("attention.head_count"), u(self.n_head));
        put(&k("attention.head_count_kv"), u(self.n_head_kv));
        put(&k("rope.freq_base"), MetaValue::F32(self.rope_theta));
        put(
            &k("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(self.rms_eps),
        );
        put(&k("vocab_size"), u(self.n_vocab));
        if self.family == Family::Llama {
            put(&k("rope.dimension_count"), u(self.head_dim));
        }
        if self.explicit_head_dim {
            put(&k("attention.key_length"), u(self.head_dim));
            put(&k("attention.value_length"), u(self.head_dim));
        }
        if let RopeScaling::Linear(f) = self.rope_scaling {
            put(&k("rope.scaling.type"), MetaValue::String("linear".into()));
            put(&k("rope.scaling.factor"), MetaValue::F32(f));
        }
    }

    /// Llama 3.1's RoPE factors, one per rotated pair (`generate_extra_tensors` in
    /// llama.cpp's `conversion/llama.py`), or `None` without that scaling.
    pub fn rope_factors(&self) -> Option<Vec<f32>> {
        let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context,
        } = self.rope_scaling
        else {
            return None;
        };
        let dim = self.head_dim;
        let low_wavelen = original_context / low_freq_factor;
        let high_wavelen = original_context / high_freq_factor;
        let factors = (0..dim / 2)
            .map(|i| {
                let freq = 1.0 / self.rope_theta.powf((2 * i) as f32 / dim as f32);
                let wavelen = 2.0 * std::f32::consts::PI / freq;
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    factor
                } else {
                    let smooth = (original_context / wavelen - low_freq_factor)
                        / (high_freq_factor - low_freq_factor);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                }
            })
            .collect();
        Some(factors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<Config, HfError> {
        Config::parse(&format!(
            r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 100{extra}}}"#
        ))
    }

    fn error(extra: &str) -> String {
        parse(extra).unwrap_err().to_string()
    }

    #[test]
    fn rope_from_either_place_and_its_errors() {
        let c = parse("").unwrap();
        assert_eq!(
            (c.rope_theta, c.rope_scaling),
            (10_000.0, RopeScaling::None)
        );
        assert_eq!((c.head_dim, c.n_head_kv), (16, 2));
        let c =
            parse(r#", "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}"#)
                .unwrap();
        assert_eq!(
            (c.rope_theta, c.rope_scaling),
            (500_000.0, RopeScaling::Linear(2.0))
        );
        // Transformers 5: both in rope_parameters.
        let c = parse(
            r#", "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}"#,
        )
        .unwrap();
        assert_eq!(c.rope_theta, 500_000.0);
        assert_eq!(
            c.rope_scaling,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_context: 8192.0
            }
        );
        let c =
            parse(r#", "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}"#).unwrap();
        assert_eq!((c.rope_theta, c.rope_scaling), (1e6, RopeScaling::None));
        assert!(error(r#", "rope_theta": 0"#).contains("rope_theta 0 is not positive"));
        assert!(error(r#", "rope_scaling": {"type": "linear"}"#).contains("has no factor"));
        assert!(error(r#", "rope_scaling": {"type": "yarn", "factor": 4}"#)
            .contains("rope_scaling type \"yarn\" is not supported"));
    }

    #[test]
    fn unsupported_options_are_named() {
        assert!(error(r#", "hidden_act": "gelu""#).contains("hidden_act \"gelu\" is not supported"));
        assert!(error(r#", "mlp_bias": true"#).contains("mlp_bias = true"));
        assert!(error(r#", "num_key_value_heads": 3"#).contains("not a multiple of"));
        let qwen =
            Config::parse(r#"{"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true}"#);
        assert!(qwen.unwrap_err().to_string().contains("use_sliding_window"));
        let other = Config::parse(r#"{"architectures": ["GPT2LMHeadModel"]}"#);
        assert!(matches!(other, Err(HfError::UnknownArchitecture(a)) if a == "GPT2LMHeadModel"));
    }
}
