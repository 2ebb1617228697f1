//! Measuring a model's quality on a text: perplexity (llama.cpp's `llama-perplexity` method,
//! fresh windows or one stream through a sliding window) and the KL divergence of one run's
//! distributions from a saved base run (how far an arithmetic or a cache format moves them).

pub mod kl;
pub mod llama_kld;
pub mod perplexity;

pub use perplexity::{evaluate, EvalError, Mode, NllStats, Scored};
