//! The checkpoint as GGUF: tensors renamed as `convert_hf_to_gguf.py` renames them, each
//! checked against `config.json`, and either assembled into a GGUF image in memory (to run) or
//! handed tensor by tensor to the quantizer (to write a file, never held whole in memory).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use half::{bf16, f16};

use super::config::{Config, Family};
use super::safetensors::{DType, Shards, StoredTensor};
use super::tokenizer::tokenizer_metadata;
use super::HfError;
use crate::gguf::{gguf_header, GgufFile, HeaderTensor, MetaValue, Metadata, DEFAULT_ALIGNMENT};
use crate::quant::quantize::{QuantizeSource, TensorShape};
use crate::quant::GgmlType;

/// Where a converted tensor's values come from.
#[derive(Clone, Debug)]
enum Source {
    /// A checkpoint tensor; its rows permuted in groups of `heads` when set (llama's q/k).
    Stored {
        hf_name: String,
        permute_heads: Option<usize>,
    },
    /// Computed from the config (llama 3's RoPE factors).
    Computed(Vec<f32>),
}

/// One tensor of the converted model.
#[derive(Clone, Debug)]
pub struct CheckpointTensor {
    /// GGUF name (`blk.0.attn_q.weight`).
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    /// F32, F16 or BF16: matrices keep the checkpoint's type, vectors become F32 (as
    /// `convert_hf_to_gguf.py` writes them).
    pub ty: GgmlType,
    source: Source,
}

impl CheckpointTensor {
    /// Bytes of the converted data (its shape matched stored data, so this cannot overflow).
    pub fn byte_size(&self) -> usize {
        let n: u64 = self.dims.iter().product();
        self.ty
            .row_bytes(n as usize)
            .expect("F32, F16 and BF16 hold one value per block")
    }
}

/// A checkpoint directory read as a GGUF-like set of named tensors plus metadata; each
/// tensor's data is produced on demand ([`Checkpoint::tensor_data`]) from the mapped shards.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: Config,
    /// The model's and the tokenizer's GGUF metadata.
    pub metadata: Metadata,
    pub tensors: Vec<CheckpointTensor>,
    /// Why llama.cpp could not tokenize with the vocabulary in [`Checkpoint::metadata`], if it
    /// could not (nucleus reads it through `tokenizer.huggingface.json` either way).
    pub llama_cpp_vocab_problem: Option<String>,
    shards: Shards,
}

/// What a checkpoint tensor is, by its Hugging Face name: GGUF name (with `{i}` for the
/// layer), expected shape (PyTorch order) and the heads to permute by for llama's rotary
/// layout.
struct Role {
    gguf: String,
    shape: Vec<usize>,
    permute_heads: Option<usize>,
}

fn role(cfg: &Config, hf_name: &str) -> Option<Role> {
    let (e, v, ff) = (cfg.n_embd, cfg.n_vocab, cfg.n_ff);
    let q = cfg.n_head * cfg.head_dim;
    let kv = cfg.n_head_kv * cfg.head_dim;
    let llama = cfg.family == Family::Llama;
    let perm = |h: usize| llama.then_some(h);
    let r = |gguf: &str, shape: Vec<usize>, permute_heads| {
        Some(Role {
            gguf: gguf.to_string(),
            shape,
            permute_heads,
        })
    };
    match hf_name {
        "model.embed_tokens.weight" => return r("token_embd.weight", vec![v, e], None),
        "model.norm.weight" => return r("output_norm.weight", vec![e], None),
        "lm_head.weight" => return r("output.weight", vec![v, e], None),
        _ => {}
    }
    let rest = hf_name.strip_prefix("model.layers.")?;
    let (layer, what) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= cfg.n_layers || layer.to_string() != rest[..rest.find('.')?] {
        return None;
    }
    let b = |s: &str| format!("blk.{layer}.{s}");
    let (gguf, shape, heads) = match what {
        "input_layernorm.weight" => (b("attn_norm.weight"), vec![e], None),
        "post_attention_layernorm.weight" => (b("ffn_norm.weight"), vec![e], None),
        "self_attn.q_proj.weight" => (b("attn_q.weight"), vec![q, e], perm(cfg.n_head)),
        "self_attn.k_proj.weight" => (b("attn_k.weight"), vec![kv, e], perm(cfg.n_head_kv)),
        "self_attn.v_proj.weight" => (b("attn_v.weight"), vec![kv, e], None),
        "self_attn.o_proj.weight" => (b("attn_output.weight"), vec![e, q], None),
        "self_attn.q_proj.bias" => (b("attn_q.bias"), vec![q], perm(cfg.n_head)),
        "self_attn.k_proj.bias" => (b("attn_k.bias"), vec![kv], perm(cfg.n_head_kv)),
        "self_attn.v_proj.bias" => (b("attn_v.bias"), vec![kv], None),
        "mlp.gate_proj.weight" => (b("ffn_gate.weight"), vec![ff, e], None),
        "mlp.up_proj.weight" => (b("ffn_up.weight"), vec![ff, e], None),
        "mlp.down_proj.weight" => (b("ffn_down.weight"), vec![e, ff], None),
        _ => return None,
    };
    r(&gguf, shape, heads)
}

/// The tensors every checkpoint of the family must hold, besides `lm_head.weight`.
fn required(cfg: &Config) -> Vec<String> {
    let mut names = vec![
        "model.embed_tokens.weight".to_string(),
        "model.norm.weight".to_string(),
    ];
    if !cfg.tie_embeddings {
        names.push("lm_head.weight".to_string());
    }
    for i in 0..cfg.n_layers {
        let mut per = vec![
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ];
        if cfg.family == Family::Qwen2 {
            per.extend([
                "self_attn.q_proj.bias",
                "self_attn.k_proj.bias",
                "self_attn.v_proj.bias",
            ]);
        }
        names.extend(per.iter().map(|s| format!("model.layers.{i}.{s}")));
    }
    names
}

impl Checkpoint {
    /// Reads `config.json`, the tokenizer files and the safetensors headers of `dir`, and
    /// checks every tensor against the config. No tensor data is read yet.
    pub fn open(dir: &Path) -> Result<Checkpoint, HfError> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(HfError::Missing {
                path: config_path.display().to_string(),
                what: "config.json",
            });
        }
        let config = Config::parse(&super::read_to_string(&config_path)?)?;
        let shards = Shards::open(dir)?;
        let name = dir
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "checkpoint".into());
        let mut metadata = Metadata::default();
        config.gguf_metadata(&name, &mut metadata);
        let llama_cpp_vocab_problem = tokenizer_metadata(dir, &config, &mut metadata)?;

        let mut tensors = Vec::with_capacity(shards.tensors.len() + 1);
        for (hf_name, stored) in &shards.tensors {
            // Older checkpoints store the RoPE frequencies, which nucleus computes.
            if hf_name.ends_with("rotary_emb.inv_freq") {
                continue;
            }
            if hf_name == "lm_head.weight" && config.tie_embeddings {
                // Tied: Hugging Face multiplies by the embedding, whatever is stored here.
                continue;
            }
            let role = role(&config, hf_name).ok_or_else(|| HfError::BadTensor {
                name: hf_name.clone(),
                problem: format!(
                    "not part of a {} checkpoint of the shape config.json describes ({} layers)",
                    config.family.gguf_arch(),
                    config.n_layers
                ),
            })?;
            if stored.shape != role.shape {
                return Err(HfError::BadTensor {
                    name: hf_name.clone(),
                    problem: format!(
                        "shape {:?} contradicts config.json, which implies {:?}",
                        stored.shape, role.shape
                    ),
                });
            }
            let ty = if role.shape.len() == 1 {
                GgmlType::F32
            } else {
                match stored.dtype {
                    DType::F32 => GgmlType::F32,
                    DType::F16 => GgmlType::F16,
                    DType::BF16 => GgmlType::BF16,
                }
            };
            tensors.push(CheckpointTensor {
                name: role.gguf,
                dims: role.shape.iter().rev().map(|&d| d as u64).collect(),
                ty,
                source: Source::Stored {
                    hf_name: hf_name.clone(),
                    permute_heads: role.permute_heads,
                },
            });
        }
        if let Some(missing) = required(&config)
            .into_iter()
            .find(|n| !shards.tensors.contains_key(n))
        {
            let why = if missing == "lm_head.weight" {
                " (config.json says tie_word_embeddings is false)"
            } else {
                ""
            };
            return Err(HfError::BadTensor {
                name: missing,
                problem: format!("missing from the checkpoint{why}"),
            });
        }
        if let Some(factors) = config.rope_factors() {
            tensors.push(CheckpointTensor {
                name: "rope_freqs.weight".into(),
                dims: vec![factors.len() as u64],
                ty: GgmlType::F32,
                source: Source::Computed(factors),
            });
        }
        tensors.sort_by_key(|t| gguf_order(&t.name));
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            metadata,
            tensors,
            llama_cpp_vocab_problem,
            shards,
        })
    }

    /// The tensor's data in its [`CheckpointTensor::ty`], little-endian: borrowed from the
    /// map when stored so, else converted (permuted rows, vectors widened to F32).
    pub fn tensor_data(&self, t: &CheckpointTensor) -> Cow<'_, [u8]> {
        match &t.source {
            Source::Computed(values) => {
                Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect())
            }
            Source::Stored {
                hf_name,
                permute_heads,
            } => {
                let stored = &self.shards.tensors[hf_name];
                let bytes = self.shards.data(stored);
                let bytes = match permute_heads {
                    Some(heads) => Cow::Owned(permute_rows(bytes, stored, *heads)),
                    None => Cow::Borrowed(bytes),
                };
                if t.ty == GgmlType::F32 && stored.dtype != DType::F32 {
                    Cow::Owned(to_f32(&bytes, stored.dtype))
                } else {
                    bytes
                }
            }
        }
    }

    /// Drops the mapped pages of `t`'s stored data once its converted copy is written.
    fn release(&self, t: &CheckpointTensor) {
        if let Source::Stored { hf_name, .. } = &t.source {
            self.shards.release(&self.shards.tensors[hf_name]);
        }
    }

    /// Refuses a vocabulary llama.cpp would tokenize differently from tokenizer.json, before
    /// the checkpoint is written to a GGUF file (as convert_hf_to_gguf.py refuses one).
    pub fn check_llama_cpp_vocab(&self) -> Result<(), HfError> {
        match &self.llama_cpp_vocab_problem {
            None => Ok(()),
            Some(why) => Err(HfError::Tokenizer(format!(
                "not written as GGUF, since llama.cpp could not tokenize it as tokenizer.json \
                 does: {why}"
            ))),
        }
    }

    /// The model as a GGUF file held in memory: the header, then each tensor converted
    /// straight into its place (one copy of the weights, no second buffer).
    pub fn to_gguf(&self) -> Result<GgufFile, HfError> {
        let metadata: Vec<(String, MetaValue)> = self
            .metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let sizes: Vec<usize> = self
            .tensors
            .iter()
            .map(CheckpointTensor::byte_size)
            .collect();
        let entries: Vec<HeaderTensor> = self
            .tensors
            .iter()
            .zip(&sizes)
            .map(|(t, &size)| HeaderTensor {
                name: &t.name,
                dims: &t.dims,
                ty: t.ty,
                size,
            })
            .collect();
        let (mut bytes, offsets) = gguf_header(&metadata, &entries, DEFAULT_ALIGNMENT);
        let data_start = bytes.len();
        let total = offsets.last().zip(sizes.last()).map_or(0, |(o, s)| o + s);
        bytes.reserve_exact(total);
        for ((t, &offset), &size) in self.tensors.iter().zip(&offsets).zip(&sizes) {
            bytes.resize(data_start + offset, 0);
            let data = self.tensor_data(t);
            debug_assert_eq!(data.len(), size);
            bytes.extend_from_slice(&data);
            drop(data);
            self.release(t);
        }
        GgufFile::from_bytes(bytes).map_err(|e| HfError::BadFile {
            path: self.dir.display().to_string(),
            problem: format!("converted model is not valid GGUF: {e}"),
        })
    }
}

/// The checkpoint as the quantizer's input, read tensor by tensor from the mapped shards.
impl QuantizeSource for Checkpoint {
    fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn alignment(&self) -> usize {
        DEFAULT_ALIGNMENT
    }

    fn tensor_shapes(&self) -> Vec<TensorShape<'_>> {
        self.tensors
            .iter()
            .map(|t| TensorShape {
                name: &t.name,
                dims: &t.dims,
                ty: t.ty,
            })
            .collect()
    }

    fn tensor_data(&self, index: usize) -> Cow<'_, [u8]> {
        Checkpoint::tensor_data(self, &self.tensors[index])
    }

    fn release(&self, index: usize) {
        Checkpoint::release(self, &self.tensors[index]);
    }

    /// The converted tensors' bytes (what the unquantized GGUF would hold).
    fn input_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.byte_size() as u64).sum()
    }
}

/// Tensors in the order `convert_hf_to_gguf.py` writes them: embedding, layers in order,
/// then the rest.
fn gguf_order(name: &str) -> (usize, usize, String) {
    if name == "token_embd.weight" || name == "rope_freqs.weight" {
        return (0, 0, name.to_string());
    }
    match name
        .strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(l, _)| l.parse::<usize>().ok())
    {
        Some(layer) => (1, layer, name.to_string()),
        None => (2, 0, name.to_string()),
    }
}

/// Llama's q/k rows from Hugging Face's rotary layout (each head's first half pairs with its
/// second half) to GGUF's (adjacent pairs): within each head, row `j * d/2 + i` moves to
/// `2 * i + j` (`LlamaModel.permute` in llama.cpp's conversion/llama.py).
fn permute_rows(bytes: &[u8], stored: &StoredTensor, heads: usize) -> Vec<u8> {
    let rows = stored.shape[0];
    let row_bytes = bytes.len() / rows;
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                let from = h * head_dim + j * half + i;
                let to = h * head_dim + 2 * i + j;
                out[to * row_bytes..(to + 1) * row_bytes]
                    .copy_from_slice(&bytes[from * row_bytes..(from + 1) * row_bytes]);
            }
        }
    }
    out
}

fn to_f32(bytes: &[u8], dtype: DType) -> Vec<u8> {
    bytes
        .chunks_exact(dtype.size())
        .flat_map(|c| {
            let v = match dtype {
                DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                DType::F16 => f16::from_le_bytes([c[0], c[1]]).to_f32(),
                DType::BF16 => bf16::from_le_bytes([c[0], c[1]]).to_f32(),
            };
            v.to_le_bytes()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_pairs_each_heads_halves() {
        // Two heads of dimension 4, one byte per row: rows [a0 a1 b0 b1] become [a0 b0 a1 b1].
        let stored = StoredTensor {
            shard: 0,
            dtype: DType::F16,
            shape: vec![8],
            start: 0,
            end: 8,
        };
        let rows = [0u8, 1, 2, 3, 10, 11, 12, 13];
        assert_eq!(
            permute_rows(&rows, &stored, 2),
            vec![0, 2, 1, 3, 10, 12, 11, 13]
        );
    }
}
