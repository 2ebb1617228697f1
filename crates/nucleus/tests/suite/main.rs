//! The integration tests of `nucleus`, one test binary (a binary each cost its own compiling
//! and linking), one module per subject: real models against llama.cpp's outputs, the
//! tokenizers, the scheduler, speculation, the KV cache and its policies, grammars.
//! `cargo test --release -p nucleus --test suite [MODULE]`. (`pack_cache` and `huge_pages`,
//! which set environment variables every load reads, are binaries of their own.)

#[path = "../common/mod.rs"]
mod common;

mod arch_bad_input;
mod chat_prompt;
mod context_policy;
mod embeddings;
mod eval;
mod fuzz_regressions;
mod generate;
mod gguf_files;
mod golden_models;
mod grammar;
mod hf_checkpoint;
mod hf_gguf_vocab;
mod kv_types;
mod low_bit_formats;
mod moe;
mod prefix_cache;
mod quantize;
mod reasoning_templates;
mod scheduler;
mod scheduler_draft;
mod scheduler_speculation;
mod sliding_window;
mod speculation;
mod tokenizer_vectors;
