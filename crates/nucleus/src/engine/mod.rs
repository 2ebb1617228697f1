//! Requests, the generation loop and (later) the scheduler. Everything here works on token ids
//! and logits; it knows nothing of tensors.

pub mod scheduler;
mod session;

pub use session::{argmax, FinishReason, Generation, GenerationConfig, Session, Timings};
