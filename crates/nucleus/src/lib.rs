//! nucleus: an LLM inference engine.
//!
//! The path of one request: text → [`tokenizer`] → [`engine`] (scheduler, generation loop) →
//! [`model`] forward over a batch with [`kv_cache`] block tables → logits → [`sampling`] → stop
//! checks → streaming detokenizer. Only `model` and `kernels` know about tensors.

// Off x86-64 only the scalar kernels build: the constants, fields and helpers that serve the
// SIMD and AMX paths go unused there (`cargo check --target aarch64-unknown-linux-gnu`).
#![cfg_attr(
    not(target_arch = "x86_64"),
    allow(dead_code, unused_imports, unused_variables, unused_mut)
)]

pub mod chat;
pub mod engine;
pub mod eval;
pub mod gguf;
pub mod hf;
pub mod kernels;
pub mod kv_cache;
pub mod model;
pub mod quant;
pub mod sampling;
pub mod tokenizer;
