//! x86-64 SIMD dot kernels (AVX2 and AVX-512): the 32-element block formats ([`block32`]), the
//! K-quants ([`k_quants`]), Q2_K/Q3_K/IQ4_NL/IQ4_XS ([`low_bit`]) and the float types
//! ([`float`]), on small shared helpers ([`helpers`]),
//! and below, their entry points per level.
//!
//! Each kernel body is an `#[inline(always)]` generic function that is instantiated inside
//! `#[target_feature]` entry points, once per level (AVX2; AVX-512 F/BW/VL; AVX-512 + VNNI). The
//! 8-bit products use `vpmaddubsw` + `vpmaddwd` (AVX2) or `vpdpbusd` (VNNI). Each kernel takes up
//! to four activation rows (`NX`) and unpacks the weight block once for all of them.
//!
//! Safety: every function here is `unsafe` and relies on the [`DotFn`] contract: the pointers
//! cover whole rows, and the CPU has the features of the entry point (the dispatch table for a
//! level is only used after `is_x86_feature_detected!` confirmed them).

#![allow(clippy::missing_safety_doc, clippy::needless_range_loop)]

use super::dispatch::{DotFn, Kernels, SimdLevel};

/// Kernel functions with the `entry!` table's signature, one per arithmetic `MODE` of a shared
/// body (`name = body::<MODE>;`): the K-quants' and the low-bit formats' (defined before the
/// modules so both see it).
macro_rules! mode_kernels {
    ($($(#[$doc:meta])* $name:ident = $body:ident::<$mode:tt>;)*) => {$(
        $(#[$doc])*
        #[inline(always)]
        pub(super) unsafe fn $name<const VNNI: bool, const NX: usize>(
            n: usize,
            w: *const u8,
            x: *const u8,
            s: usize,
            out: *mut f32,
        ) {
            unsafe { $body::<NX, $mode>(n, w, x, s, out) }
        }
    )*};
}

mod block32;
mod float;
mod helpers;
mod k_quants;
mod low_bit;
mod q8_0_biased;
mod q8_k_act;

use block32::*;
pub(crate) use block32::{dot_q8_0_xs, unpack_to_q8_0};
use float::*;
use k_quants::*;
use low_bit::*;
pub(crate) use q8_0_biased::{act_bias, rows_biased, unpack_biased};
pub(crate) use q8_k_act::quantize_block_q8_k;

// ---------------------------------------------------------------------------------------------
// Entry points per level.

macro_rules! level {
    ($modname:ident, $features:literal, $vnni:literal, $level:expr, $table:ident) => {
        mod $modname {
            use super::*;

            macro_rules! entry {
                ($name:ident, $body:ident) => {
                    /// # Safety
                    /// [`DotFn`] contract; the CPU has this module's features.
                    #[target_feature(enable = $features)]
                    pub(super) unsafe fn $name(
                        n: usize,
                        w: *const u8,
                        x: *const u8,
                        s: usize,
                        nx: usize,
                        out: *mut f32,
                    ) {
                        // SAFETY: forwarded DotFn contract; `nx` selects the instantiation.
                        unsafe {
                            match nx {
                                1 => $body::<$vnni, 1>(n, w, x, s, out),
                                2 => $body::<$vnni, 2>(n, w, x, s, out),
                                3 => $body::<$vnni, 3>(n, w, x, s, out),
                                _ => $body::<$vnni, 4>(n, w, x, s, out),
                            }
                        }
                    }
                };
            }

            entry!(k_f32, f32_);
            entry!(k_f16, f16_);
            entry!(k_bf16, bf16_);
            entry!(k_q4_0, q4_0);
            entry!(k_q4_1, q4_1);
            entry!(k_q5_0, q5_0);
            entry!(k_q5_1, q5_1);
            entry!(k_q8_0, q8_0);
            entry!(k_q4_k, q4_k);
            entry!(k_q5_k, q5_k);
            entry!(k_q6_k, q6_k);
            entry!(k_q6_k_batched, q6_k_batched);
            entry!(k_q4_0_block_sums, q4_0_block_sums);
            entry!(k_q4_k_gemm, q4_k_gemm);
            entry!(k_f16_sgemm, f16_sgemm);
            entry!(k_bf16_sgemm, bf16_sgemm);
            entry!(k_f32_sgemm, f32_sgemm);
            entry!(k_q4_k_vec_dot, q4_k_vec_dot);
            entry!(k_q4_k_tiled, q4_k_tiled);
            entry!(k_q5_k_tiled, q5_k_tiled);
            entry!(k_q2_k, q2_k);
            entry!(k_q3_k, q3_k);
            entry!(k_iq4_nl, iq4_nl);
            entry!(k_iq4_xs, iq4_xs);
            entry!(k_q2_k_block_sums, q2_k_block_sums);
            entry!(k_q2_k_gemm, q2_k_gemm);
            entry!(k_q2_k_tiled, q2_k_tiled);
            entry!(k_q3_k_tiled, q3_k_tiled);
            entry!(k_iq4_xs_tiled, iq4_xs_tiled);
            entry!(k_iq4_nl_block_sums, iq4_nl_block_sums);
            entry!(k_mxfp4, mxfp4);
            entry!(k_mxfp4_block_sums, mxfp4_block_sums);

            pub(super) const DOTS: [DotFn; 16] = [
                k_f32 as DotFn,
                k_f16,
                k_bf16,
                k_q4_0,
                k_q4_1,
                k_q5_0,
                k_q5_1,
                k_q8_0,
                k_q4_k,
                k_q5_k,
                k_q6_k,
                k_q2_k,
                k_q3_k,
                k_iq4_nl,
                k_iq4_xs,
                k_mxfp4,
            ];
        }

        pub(crate) static $table: Kernels = Kernels {
            level: $level,
            dots: $modname::DOTS,
            q6_k_batched: $modname::k_q6_k_batched,
            q4_0_block_sums: $modname::k_q4_0_block_sums,
            q4_k_gemm: $modname::k_q4_k_gemm,
            f16_sgemm: $modname::k_f16_sgemm,
            bf16_sgemm: $modname::k_bf16_sgemm,
            f32_sgemm: $modname::k_f32_sgemm,
            q4_k_vec_dot: $modname::k_q4_k_vec_dot,
            q4_k_tiled: $modname::k_q4_k_tiled,
            q5_k_tiled: $modname::k_q5_k_tiled,
            q2_k_block_sums: $modname::k_q2_k_block_sums,
            q2_k_gemm: $modname::k_q2_k_gemm,
            q2_k_tiled: $modname::k_q2_k_tiled,
            q3_k_tiled: $modname::k_q3_k_tiled,
            iq4_xs_tiled: $modname::k_iq4_xs_tiled,
            iq4_nl_block_sums: $modname::k_iq4_nl_block_sums,
            mxfp4_block_sums: $modname::k_mxfp4_block_sums,
        };
    };
}

level!(avx2, "avx2,fma,f16c", false, SimdLevel::Avx2, AVX2);
level!(
    avx512,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl",
    false,
    SimdLevel::Avx512,
    AVX512
);
level!(
    avx512vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    true,
    SimdLevel::Avx512Vnni,
    AVX512VNNI
);
