//! Compute kernels: matrix products over quantized weights, the thread pool, and the element-
//! wise operations of the forward pass.

pub mod matmul;
pub mod ops;
pub mod pool;
