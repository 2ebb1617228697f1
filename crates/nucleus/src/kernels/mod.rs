//! CPU compute kernels: a persistent thread pool and quantized matrix products.

pub mod matmul;
pub mod pool;

pub use matmul::{matmul, matmul_f32, QMatrix, QuantizedActs};
pub use pool::ThreadPool;
