//! Transformer models read from GGUF: hyperparameters, weights, and one forward pass over a
//! batch of tokens from one or more sequences (like llama.cpp's `llama_batch`).

mod attention;
mod embed;
mod forward;
mod hparams;
mod kv_shift;
mod layer;
mod memory;
mod moe;
mod pack_cache;
mod project;
mod weights;

pub use attention::{arithmetic_class, TILED_MIN_BATCH};
pub use embed::EMBED_CHUNK;
pub use forward::{Batch, ForwardState};
pub use hparams::{Activation, Arch, ExpertAct, Gating, HParams, MoeParams, QkNorm, RopeStyle};
pub use memory::{available_memory, human_bytes, resident_huge_bytes, MemoryPlan, MAX_CONTEXT};

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::gguf::{GgufError, GgufFile};
pub use crate::kernels::interleaved::Arithmetic;
use crate::kernels::pool::ThreadPool;
use crate::kv_cache::{KvCache, KvConfig, KvType, SlidingWindow};
use weights::Weights;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Checkpoint(#[from] crate::hf::HfError),
    #[error("architecture {0:?} is not supported (supported: llama, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, olmoe, gpt-oss)")]
    UnsupportedArch(String),
    #[error("invalid model: {0}")]
    Invalid(String),
    #[error("tensor {name:?} has type {ty}, which nucleus cannot compute with yet")]
    UnsupportedTensorType {
        name: String,
        ty: crate::quant::GgmlType,
    },
    #[error(transparent)]
    Kv(#[from] crate::kv_cache::KvError),
    #[error("bad batch: {0}")]
    BadBatch(String),
    /// A size beyond a limit: the memory available, the longest context supported.
    #[error("{0}")]
    Limit(String),
}

/// A loaded model: its file (memory-mapped), hyperparameters, weight index and thread pool.
pub struct Model {
    pub file: Arc<GgufFile>,
    pub hp: HParams,
    weights: Weights,
    pool: ThreadPool,
    arithmetic: Arithmetic,
    /// Forward passes begun while matrices wait to be packed ([`Model::finish_packing`]).
    passes: AtomicUsize,
    /// Whether every repacked matrix is packed.
    packed: AtomicBool,
}

impl Model {
    /// Loads a GGUF model, or a Hugging Face checkpoint directory ([`crate::hf`]). `n_threads`
    /// = 0 uses every available core. The arithmetic is nucleus's own unless `NUCLEUS_EXACT`
    /// asks for llama.cpp's ([`Arithmetic::from_env`]).
    pub fn load(path: impl AsRef<Path>, n_threads: usize) -> Result<Model, ModelError> {
        Self::load_with(path, n_threads, Arithmetic::from_env())
    }

    /// [`Model::load`] with the given arithmetic.
    pub fn load_with(
        path: impl AsRef<Path>,
        n_threads: usize,
        arithmetic: Arithmetic,
    ) -> Result<Model, ModelError> {
        let path = path.as_ref();
        // A directory can only be a checkpoint; its errors name what it lacks.
        let file = if path.is_dir() {
            Arc::new(crate::hf::Checkpoint::open(path)?.to_gguf()?)
        } else {
            Arc::new(GgufFile::open(path)?)
        };
        Self::from_file_with(file, n_threads, arithmetic)
    }

    pub fn from_file(file: Arc<GgufFile>, n_threads: usize) -> Result<Model, ModelError> {
        Self::from_file_with(file, n_threads, Arithmetic::from_env())
    }

    pub fn from_file_with(
        file: Arc<GgufFile>,
        n_threads: usize,
        arithmetic: Arithmetic,
    ) -> Result<Model, ModelError> {
        let arch = file
            .architecture()
            .ok_or_else(|| ModelError::Invalid("no general.architecture in metadata".into()))?;
        if Arch::from_name(arch).is_none() {
            return Err(ModelError::UnsupportedArch(arch.to_string()));
        }
        let n_vocab = file
            .tensor("token_embd.weight")
            .map(|t| t.dims.get(1).copied().unwrap_or(0) as usize)
            .ok_or_else(|| ModelError::Invalid("missing tensor token_embd.weight".into()))?;
        let hp = HParams::from_metadata(&file.metadata, n_vocab)?;
        let weights = Weights::load(&file, &hp, arithmetic)?;
        let n_threads = if n_threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            n_threads
        };
        Ok(Model {
            file,
            hp,
            packed: AtomicBool::new(!weights.packing_left()),
            weights,
            pool: ThreadPool::new(n_threads),
            arithmetic,
            passes: AtomicUsize::new(0),
        })
    }

    /// Packs the matrices that wait to be packed. A model loads with its repacked matrices
    /// waiting (but those mapped from a file of packed weights): its first forward pass packs
    /// each work item's groups into a buffer that stays in cache as it goes (or, for a few
    /// tokens, reads some types from the file: `project.rs`, `from_file`), which brings a
    /// one-shot command to its first token without the cost of packing the whole model into
    /// fresh memory (a 7B file's 2–3 s), and its second pass packs them for good (a pass of a
    /// few tokens all but the types it decodes faster from the file: [`Self::pass_begins`]).
    /// A server or a benchmark calls it at load. The bits are the same either way: the same
    /// packed bytes go through the same kernels, or the file's through kernels of their chain.
    pub fn finish_packing(&self) {
        if !self.packed.load(Ordering::Acquire) {
            self.weights.finish_packing();
            self.packed.store(true, Ordering::Release);
        }
    }

    /// Whether some repacked matrix still waits to be packed (until a forward pass after the
    /// first packs them all, or [`Self::finish_packing`]).
    pub fn packing_left(&self) -> bool {
        !self.packed.load(Ordering::Acquire)
    }

    /// Called as a forward pass of `n` tokens begins: the second one and every later one packs
    /// what waits, but a pass of a few tokens leaves the types that decode faster from the file
    /// (`project.rs`, `decodes_from_file`): a one-shot command's decoding never packs them.
    fn pass_begins(&self, n: usize) {
        if self.packed.load(Ordering::Acquire) || self.passes.fetch_add(1, Ordering::AcqRel) == 0 {
            return;
        }
        if n > project::FILE_PASS_TOKENS {
            self.finish_packing();
        } else {
            let left = self
                .weights
                .finish_packing_where(|p| !project::decodes_from_file(p.ty()));
            if !left {
                self.packed.store(true, Ordering::Release);
            }
        }
    }

    /// The arithmetic of the matrix products.
    pub fn arithmetic(&self) -> Arithmetic {
        self.arithmetic
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// An f16 KV cache for this model holding `n_tokens` tokens in blocks of `block_size`.
    pub fn new_kv_cache(&self, n_tokens: usize, block_size: usize) -> KvCache {
        KvCache::new(self.kv_config(n_tokens, block_size, KvType::F16))
    }

    /// A KV cache storing keys and values as `ty`; an error when the model's head dimension
    /// does not fit the type.
    pub fn new_kv_cache_of(
        &self,
        n_tokens: usize,
        block_size: usize,
        ty: KvType,
    ) -> Result<KvCache, ModelError> {
        let cfg = self.kv_config(n_tokens, block_size, ty);
        cfg.check().map_err(ModelError::Invalid)?;
        Ok(KvCache::new(cfg))
    }

    /// The cache for `n_tokens` tokens. Its sliding-window pool (for models with such layers)
    /// is as large as the full-context one until [`KvConfig::fit_window_pool`] sizes it for
    /// the sequences that will run.
    pub fn kv_config(&self, n_tokens: usize, block_size: usize, ty: KvType) -> KvConfig {
        let n_blocks = n_tokens.div_ceil(block_size).max(1);
        let hp = &self.hp;
        let layers = (0..hp.n_layers.min(128))
            .filter(|&l| hp.layer_window(l).is_some())
            .fold(0u128, |m, l| m | 1 << l);
        KvConfig {
            ty,
            n_layers: hp.n_layers,
            n_kv_heads: hp.n_head_kv,
            head_dim_k: hp.head_dim,
            head_dim_v: hp.head_dim_v,
            block_size,
            n_blocks,
            sliding: hp
                .sliding_window
                .filter(|_| layers != 0)
                .map(|window| SlidingWindow {
                    window,
                    layers,
                    n_blocks,
                }),
        }
    }
}
