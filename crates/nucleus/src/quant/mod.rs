//! Block formats of quantized weights (GGML's layouts): sizes, dequantization, and the dot
//! products of quantized weight rows with 8-bit-quantized activations.
//!
//! The layouts and arithmetic follow ggml's CPU backend so that results match llama.cpp:
//! every weight type has a [`vec_dot_type`] to which the activations are quantized before the
//! dot product (Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants and
//! IQ4_XS, F16/BF16/F32 for the float types).
//!
//! The dot kernels exist as a portable scalar reference and as AVX2 and AVX-512 versions chosen
//! once at run time (see [`simd_level`]); `NUCLEUS_SIMD=scalar|avx2|avx512` caps the level.

mod blocks;
mod blocks_low_bit;
mod dispatch;
pub mod quantize;
mod scalar;
mod scalar_k;
mod scalar_low_bit;
mod types;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_low_bit;
#[cfg(test)]
mod tests_quantizers;

#[cfg(test)]
pub(crate) use blocks::scale_min_k4;
pub use blocks::{dequantize_row, quantize_row, quantize_row_act};
pub(crate) use blocks_low_bit::{iq4_xs_scales, q3_k_scales, KVALUES_IQ4NL, KVALUES_MXFP4};
pub(crate) use dispatch::DotFn;
pub use dispatch::{amx_status, available_levels, simd_level, SimdLevel};
pub use types::GgmlType;

/// The type activations are quantized to before a dot product with a row of weight type `ty`
/// (ggml's `vec_dot_type`). Panics for types that are not computable.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType::*;
    match ty {
        F32 => F32,
        F16 => F16,
        BF16 => BF16,
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS => Q8_K,
        _ => panic!("vec_dot_type: {ty} is not a computable weight type"),
    }
}

/// Rewrites a Q4_0/Q5_0 row as a Q8_0 row with the same scales and integers (a Q8_0 dot of it
/// is bit-identical to the original's). Returns false, writing nothing, for other types.
pub(crate) fn unpack_row_to_q8_0(ty: GgmlType, src: &[u8], dst: &mut [u8]) -> bool {
    let Some(nb) = ty.row_bytes(ty.block_size()).map(|bb| src.len() / bb) else {
        return false;
    };
    if !matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0) || dst.len() < nb * 34 {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx2 {
        // SAFETY: `src` holds `nb` whole blocks, `dst` at least `nb * 34` bytes (checked);
        // AVX2/FMA/F16C were detected (simd_level never exceeds the hardware).
        return unsafe { x86::unpack_to_q8_0(ty, nb, src.as_ptr(), dst.as_mut_ptr()) };
    }
    blocks::unpack_row_to_q8_0_scalar(ty, src, dst)
}

/// A Q8_0 × Q8_0 dot kernel taking the activation block scales as f32 (see
/// `x86::dot_q8_0_xs` for its contract), when this process uses AVX2 or better.
#[allow(clippy::type_complexity)]
pub(crate) fn dot_q8_0_xs_fn(
) -> Option<unsafe fn(usize, *const u8, *const u8, usize, *const f32, usize, usize, *mut f32)> {
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx2 {
        return Some(x86::dot_q8_0_xs);
    }
    None
}

/// Signature of [`BiasedQ8_0::rows`].
#[allow(clippy::type_complexity)]
pub(crate) type BiasedRowsFn = unsafe fn(
    usize,
    *const u8,
    usize,
    *const u8,
    usize,
    usize,
    *const f32,
    *const i32,
    *mut f32,
    usize,
);

/// Q8_0 rows (and Q4_0/Q5_0 rows unpacked to them) × many tokens with AVX-512 VNNI, on weights
/// stored biased: the same bits as the Q8_0 dot kernels (see `x86::q8_0_biased` for the
/// arithmetic and each function's contract).
#[derive(Clone, Copy)]
pub(crate) struct BiasedQ8_0 {
    /// A Q4_0/Q5_0/Q8_0 row of `nb` blocks → a biased Q8_0 row (`nb * 34` bytes).
    pub unpack: unsafe fn(GgmlType, usize, *const u8, *mut u8) -> bool,
    /// A Q8_0 activation row of `nb` blocks → its `nb * 8` lane starts.
    pub act_bias: unsafe fn(usize, *const u8, *mut i32),
    /// Biased rows × activation rows → outputs.
    pub rows: BiasedRowsFn,
}

/// [`BiasedQ8_0`], when this process uses AVX-512 VNNI.
pub(crate) fn biased_q8_0() -> Option<BiasedQ8_0> {
    #[cfg(target_arch = "x86_64")]
    if simd_level() >= SimdLevel::Avx512Vnni {
        return Some(BiasedQ8_0 {
            unpack: x86::unpack_biased,
            act_bias: x86::act_bias,
            rows: x86::rows_biased,
        });
    }
    None
}

/// The kernel table chosen for this process (for the matmul driver).
pub(crate) fn dispatch_kernels() -> &'static dispatch::Kernels {
    dispatch::kernels()
}

/// Dot product of one weight row (`n` elements of type `ty`) with one activation row already
/// quantized to `vec_dot_type(ty)`. Uses the best SIMD level of this machine.
pub fn vec_dot(ty: GgmlType, weight_row: &[u8], act_row: &[u8], n: usize) -> f32 {
    let mut out = [0f32; 1];
    vec_dot_nx(ty, weight_row, act_row, 0, n, &mut out);
    out[0]
}

/// Dot products of one weight row with `out.len()` (1..=4) activation rows that start
/// `x_stride` bytes apart in `acts`: `out[k] = dot(W, acts[k * x_stride ..])`. The weight row is
/// unpacked once for all activation rows (the prefill fast path).
pub fn vec_dot_nx(
    ty: GgmlType,
    weight_row: &[u8],
    acts: &[u8],
    x_stride: usize,
    n: usize,
    out: &mut [f32],
) {
    dispatch::kernels().vec_dot_nx(ty, weight_row, acts, x_stride, n, out);
}

/// Like [`vec_dot_nx`] but with the kernels of a given SIMD level (for tests and benchmarks);
/// `None` when this machine lacks that level.
pub fn vec_dot_nx_at(
    level: SimdLevel,
    ty: GgmlType,
    weight_row: &[u8],
    acts: &[u8],
    x_stride: usize,
    n: usize,
    out: &mut [f32],
) -> Option<()> {
    dispatch::kernels_for(level)?.vec_dot_nx(ty, weight_row, acts, x_stride, n, out);
    Some(())
}
