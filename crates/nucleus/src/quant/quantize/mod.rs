//! Making quantized files: float rows to blocks with ggml's reference quantizers (the legacy
//! 32-element formats in `quant/blocks.rs`, the K-quants in [`k_quants`], IQ4_NL and IQ4_XS in
//! [`iq4`], MXFP4 in [`mxfp4`]), llama-quantize's per-tensor rules ([`rules`]) and the file-to-file driver
//! ([`file`]) behind `nucleus quantize`. Without an importance matrix the output tensors are
//! byte for byte llama-quantize's from the same input (`scripts/quantize_vs_llama_cpp.sh`).

mod file;
mod iq4;
mod k_quants;
mod mixes;
mod mxfp4;
mod rules;
mod search;

pub use file::{
    quantize_file, quantize_gguf, quantize_source, QuantizeError, QuantizeProgress, QuantizeSource,
    QuantizeSummary,
};
pub use mixes::{Mix, MIXES};
pub use rules::{allows_quantization, output_order, plan_types, ModelFacts, TensorShape};

use super::blocks::quantize_row;
use super::GgmlType;

/// Whether [`quantize_rows`] can write this type: every type nucleus computes has its
/// quantizer.
pub fn can_quantize(ty: GgmlType) -> bool {
    ty.is_computable()
}

/// Quantizes `src` (whole rows of `n_per_row` elements) into `dst` as llama-quantize does
/// without an importance matrix. Errors when the type cannot be written, a row is not a whole
/// number of blocks, or the lengths disagree.
pub fn quantize_rows(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    dst: &mut [u8],
) -> Result<(), String> {
    if !can_quantize(ty) {
        return Err(format!("nucleus cannot quantize to {ty}"));
    }
    let row_bytes = ty.row_bytes(n_per_row).ok_or_else(|| {
        format!(
            "a row of {n_per_row} elements is not a whole number of {ty} blocks ({})",
            ty.block_size()
        )
    })?;
    if n_per_row == 0 || !src.len().is_multiple_of(n_per_row) {
        return Err(format!(
            "{} values are not whole rows of {n_per_row}",
            src.len()
        ));
    }
    if dst.len() != src.len() / n_per_row * row_bytes {
        return Err(format!(
            "{} rows of {ty} need {} bytes, got {}",
            src.len() / n_per_row,
            src.len() / n_per_row * row_bytes,
            dst.len()
        ));
    }
    let (block, block_bytes) = ty.block_layout();
    let per_block: fn(&[f32], &mut [u8]) = match ty {
        GgmlType::Q2_K => k_quants::quantize_block_q2_k,
        GgmlType::Q3_K => k_quants::quantize_block_q3_k,
        GgmlType::Q4_K => k_quants::quantize_block_q4_k,
        GgmlType::Q5_K => k_quants::quantize_block_q5_k,
        GgmlType::Q6_K => k_quants::quantize_block_q6_k,
        GgmlType::IQ4_NL => iq4::quantize_block_iq4_nl,
        GgmlType::IQ4_XS => iq4::quantize_block_iq4_xs,
        GgmlType::MXFP4 => mxfp4::quantize_block_mxfp4,
        _ => {
            quantize_row(ty, src, dst);
            return Ok(());
        }
    };
    for (x, b) in src
        .chunks_exact(block)
        .zip(dst.chunks_exact_mut(block_bytes))
    {
        per_block(x, b);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
