//! Hugging Face checkpoints: a directory with `config.json`, `*.safetensors` (one file, or
//! shards listed in `model.safetensors.index.json`) and `tokenizer.json` (+
//! `tokenizer_config.json`), for the `LlamaForCausalLM` and `Qwen2ForCausalLM` families.
//!
//! The checkpoint is presented to the rest of nucleus as what llama.cpp's
//! `convert_hf_to_gguf.py` would have written: GGUF metadata read from `config.json`, tensors
//! renamed to GGUF's names (llama's q/k rows permuted for its rotary layout), the vocabulary
//! as llama.cpp reads it (`vocab.rs`), and the tokenizer carried as
//! `tokenizer.huggingface.json`, which [`crate::tokenizer::Tokenizer`] encodes through Hugging
//! Face's own `tokenizers` crate. [`Checkpoint`] is that set of named F32/F16/BF16 tensors plus
//! metadata, read tensor by tensor from the memory-mapped shards: the quantizer takes it as it
//! is (a [`crate::quant::quantize::QuantizeSource`]), and [`Checkpoint::to_gguf`] assembles it
//! into one GGUF image in memory to run (the GGUF reader needs one contiguous buffer; each
//! tensor is copied into it once and its shard pages dropped).

mod config;
mod convert;
mod safetensors;
mod tokenizer;
mod vocab;

pub use config::{Config, Family};
pub use convert::{Checkpoint, CheckpointTensor};
pub use vocab::CHECK_TEXTS;

use std::path::Path;

/// Why a checkpoint directory could not be read; each names the file, tensor or key at fault.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is missing: a Hugging Face checkpoint needs {what}")]
    Missing { path: String, what: &'static str },
    #[error("{path}: {problem}")]
    BadFile { path: String, problem: String },
    #[error("config.json: {0}")]
    Config(String),
    #[error(
        "unknown architecture {0:?} in config.json (supported: LlamaForCausalLM, Qwen2ForCausalLM)"
    )]
    UnknownArchitecture(String),
    #[error("tensor {name:?} has dtype {dtype}, which nucleus cannot read (F32, F16, BF16)")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("tensor {name:?}: {problem}")]
    BadTensor { name: String, problem: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// Whether `path` looks like a checkpoint directory (it holds a `config.json`).
pub fn is_checkpoint_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

fn read_to_string(path: &Path) -> Result<String, HfError> {
    std::fs::read_to_string(path).map_err(|source| HfError::Io {
        path: path.display().to_string(),
        source,
    })
}
