//! Requests, the generation loop and the scheduler. Everything here works on token ids
//! and logits; it knows nothing of tensors.
//!
//! - [`Sequence`]: one sequence's decoding state (sampler, context, detokenizer, stop
//!   conditions): logits in, token + safe text + finish out. Independent of the model, so that
//!   a scheduler can drive many.
//! - [`Session`]: one model, one KV cache, one sequence at a time; [`Session::generate`] runs a
//!   [`GenerateRequest`] (sampling or beam search) to a [`Generation`].
//! - [`KvBeams`]: beam search's [`BeamModel`](crate::sampling::BeamModel) over the paged KV
//!   cache (forks share blocks, one batched forward per step).
//! - [`context`]: what happens when a sequence outgrows its window (error, truncate, stream).
//! - [`speculate`]: speculative decoding (prompt lookup, a draft model), output unchanged.
//! - [`scheduler`]: the serving engine: a request queue and continuous batching of many
//!   sequences (decode tokens plus chunked prefill in one forward per step), admission and
//!   preemption by KV blocks, cancellation.

mod beams;
pub mod context;
pub mod scheduler;
mod sequence;
mod session;
pub mod speculate;

pub use crate::sampling::FinishReason;
pub use beams::{BeamChoice, KvBeams};
pub use context::ContextPolicy;
pub use sequence::{GenerateRequest, Sequence, SequenceStep, TokenLogprob, TopLogprob};
pub use session::{argmax, EngineError, Generation, Session, Timings, BLOCK_SIZE, MAX_CHUNK};
