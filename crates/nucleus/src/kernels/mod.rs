//! Compute kernels: a persistent thread pool, matrix products over quantized weights, and the
//! element-wise operations of the forward pass.

pub mod expf_libm;
pub mod f16;
pub mod interleaved;
pub mod matmul;
mod norm;
pub mod ops;
#[cfg(target_arch = "x86_64")]
mod ops_avx512;
pub mod pool;
pub mod rope;
#[cfg(test)]
pub(crate) mod test_rng;
pub mod tile;
#[cfg(target_arch = "x86_64")]
mod tile_avx512;

pub use matmul::{matmul, matmul_f32, PromptSlot, QMatrix, QuantizedActs};
pub use pool::ThreadPool;
