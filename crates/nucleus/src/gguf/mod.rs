//! GGUF files: reading over mmap (versions 2 and 3) and writing.
//!
//! The reader checks everything it is told before trusting it: every count is bounded by the
//! bytes that remain, every tensor's offset and size must lie inside the data section, and no
//! allocation is sized by an unchecked number. A malformed file gives a [`GgufError`] naming the
//! problem, never a panic.

mod metadata;
mod reader;
mod writer;

pub use metadata::{MetaType, MetaValue, Metadata};
pub use reader::{GgufError, GgufFile, Source, TensorInfo};
pub use writer::{gguf_header, GgufWriter, HeaderTensor};

/// `GGUF` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml supports tensors of at most four dimensions.
pub const MAX_DIMS: usize = 4;
