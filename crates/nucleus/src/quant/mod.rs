//! Block formats of quantized weights (GGML's layouts): sizes, dequantization, and the dot
//! products of quantized weight rows with 8-bit-quantized activations.

mod types;
pub use types::GgmlType;
