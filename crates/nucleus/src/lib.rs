//! nucleus: an LLM inference engine.
//!
//! The path of one request: text → [`tokenizer`] → [`engine`] (scheduler, generation loop) →
//! [`model`] forward over a batch with [`kv_cache`] block tables → logits → [`sampling`] → stop
//! checks → streaming detokenizer. Only `model` and `kernels` know about tensors.

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
