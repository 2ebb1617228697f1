//! Continuous batching: many requests share one model and one paged KV cache.
//!
//! A scheduler thread owns the model's KV cache. At every step it builds ONE batch from the next
//! token of every running sequence (decode) plus chunks of the prompts of newly admitted ones
//! (chunked prefill, bounded by a per-step token budget so a long prompt never stalls the running
//! streams), runs one forward, and hands each sequence's logits row to its own [`Sequence`]
//! (sampling, detokenization, stop conditions). Results are streamed to each request's [`Event`]
//! channel.
//!
//! A sequence is just its tokens (prompt + generated: [`Sequence::context`]) of which the first
//! `n_cached` are in the KV cache. A step feeds some of the uncached tokens; when it feeds the
//! last one, that position's logits are sampled. Decode (one uncached token) and prefill (many)
//! are the same thing, and so is recomputation after preemption (`n_cached = 0`, all tokens
//! uncached again, except what the prefix cache still holds).
//!
//! Admission is by KV blocks: the request at the head of the queue is admitted when its tokens,
//! plus a little headroom, fit in the free blocks not already promised to running sequences.
//! When the pool runs short anyway (sequences grow), the newest running sequence is preempted:
//! its blocks are freed and it goes back to the front of the waiting queue, to be recomputed
//! later. Its decoding state (its [`Sequence`]: sampler and RNG stream, detokenizer, stop
//! conditions) is kept, so its output does not change.
//!
//! Prefix caching: the full blocks of every prompt stay in the pool after their request ends,
//! under the hash of their prefix (see [`crate::kv_cache::prefix`]). An admitted request takes
//! every cached block its prompt starts with and computes only the rest; a request whose next
//! block is being computed right now by an older running request waits for it rather than
//! computing it twice (so `n` identical prompts compute their prefix once). Because a block's
//! hash includes the arithmetic of its tokens, a request's output never depends on what was
//! cached: it is the output of the same request on a fresh engine.
//!
//! Speculation ([`EngineConfig::speculation`]): each decoding sequence may add a few tokens
//! proposed by prompt lookup, or by a draft model ([`Engine::start_with_draft`]), after its
//! pending one; the step's forward computes them with the rest of the batch, each sequence's rows are sampled in order with its own sampler until one
//! differs from the proposal, and the rejected rows leave the cache. The sampled tokens are
//! those of plain decoding (see [`crate::engine::speculate`]); how many tokens to propose
//! follows each sequence's acceptance, what a row costs in the batch ([`StepCost`]), and what
//! a draft model's pass costs beside a step.
//!
//! Cancellation: a request whose event receiver is dropped is removed before the next step and
//! its blocks return to the pool. Every admitted request ends with [`Event::Done`] or
//! [`Event::Error`].

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::context::{
    check_stream_window, truncate_to_window, ContextError, ContextPolicy, SINK_TOKENS,
};
use super::sequence::GenerateRequest;
use super::speculate::{SpecStats, MAX_DRAFT};
use crate::kernels::interleaved::Arithmetic;
use crate::kernels::PromptSlot;
use crate::kv_cache::{extend_block_hashes, BlockHash, KvCache, KvConfig, KvEvent, KvType};
use crate::model::{arithmetic_class, Model};
use crate::sampling::{Explain, FinishReason, Sampler, SamplingError, SamplingParams};
use crate::tokenizer::{TokenId, Tokenizer};
use batching::{DraftRunner, Scheduler};
pub use draft::DraftModel;
use stats::Counters;
pub use stats::EngineStats;

mod batching;
mod draft;
mod stats;

/// Sizes and limits of an [`Engine`].
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences decoded together at most.
    pub max_running: usize,
    /// Requests waiting for admission at most; beyond that `submit` fails with
    /// [`SubmitError::QueueFull`].
    pub queue_capacity: usize,
    /// Tokens the KV cache holds in all (shared by every sequence).
    pub kv_tokens: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Tokens per forward at most (decode tokens first, then prefill chunks).
    pub step_token_budget: usize,
    /// Context window of one sequence (prompt + generated).
    pub n_ctx: usize,
    /// Extra free blocks a request needs beyond its tokens to be admitted.
    pub headroom_blocks: usize,
    /// How keys and values are stored (the model's head dimension must fit it: check with
    /// [`Model::kv_config`]`(..).check()` before [`Engine::start`]).
    pub kv_type: KvType,
    /// Keep the full blocks of prompts in the cache after their request ends and give them to
    /// later requests whose prompts start the same way (automatic prefix caching).
    pub prefix_caching: bool,
    /// Speculative decoding (`None`: off): by prompt lookup, or by the draft model given to
    /// [`Engine::start_with_draft`].
    pub speculation: Option<SpecConfig>,
    /// Keep an `n_ctx` above the model's training context (by default it is capped there):
    /// positions the model never saw in training, whose output degrades.
    pub allow_long_context: bool,
    /// Record the prefix cache's [`KvEvent`]s for [`EngineHandle::take_kv_events`] (for a
    /// router's precise prefix scoring).
    pub kv_events: bool,
}

/// Speculative decoding in the engine: prompt lookup ([`NgramProposer`](crate::engine::speculate::ngram::NgramProposer)),
/// or a draft model ([`DraftModel`]) when the engine has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecConfig {
    /// Tokens proposed after a sequence's pending one at most (1..=[`MAX_DRAFT`]).
    pub max_draft: usize,
}

impl EngineConfig {
    /// Drafts a sequence may add to a step at most (0 without speculation).
    pub fn max_draft(&self) -> usize {
        self.speculation
            .map_or(0, |s| s.max_draft.clamp(1, MAX_DRAFT))
    }
}

impl EngineConfig {
    /// The KV cache of an engine so configured for `model`: `kv_tokens` in the full-context
    /// pool, and a sliding-window pool (if the model has such layers) for `max_running`
    /// sequences' windows and a step's tokens each.
    pub fn kv_config(&self, model: &Model) -> KvConfig {
        let bs = self.block_size.max(1);
        model
            .kv_config(self.kv_tokens.max(bs), bs, self.kv_type)
            // (Drafts count in a step's tokens; the window is trimmed before a forward, and
            // their rollback goes back no further than that, so they need nothing more.)
            .fit_window_pool(self.max_running.max(1), self.step_token_budget, 0)
    }
}

impl EngineConfig {
    /// Errors, before anything is allocated, for a configuration [`Engine::start`] cannot run
    /// `model` with: a KV type the head dimension does not fit, a context beyond
    /// [`MAX_CONTEXT`](crate::model::MAX_CONTEXT), or a KV cache and scratch larger than the
    /// memory available.
    pub fn check(&self, model: &Model) -> Result<(), String> {
        let kv = self.kv_config(model);
        kv.check()?;
        let n_ctx = if self.allow_long_context {
            self.n_ctx
        } else {
            self.n_ctx.min(model.hp.n_ctx_train)
        };
        crate::engine::session::check_kv_memory(model, &kv, n_ctx, self.step_token_budget)
            .map_err(|e| e.to_string())
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_running: 16,
            queue_capacity: 64,
            kv_tokens: 32768,
            block_size: 16,
            step_token_budget: 256,
            n_ctx: 4096,
            headroom_blocks: 1,
            kv_type: KvType::F16,
            prefix_caching: true,
            speculation: None,
            allow_long_context: false,
            kv_events: false,
        }
    }
}

/// One generation request, already tokenized.
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub prompt_tokens: Vec<TokenId>,
    /// The sampler chain; `sampling.logprobs` asks for logprobs in the token events.
    pub sampling: SamplingParams,
    /// Stop strings (never part of the streamed text).
    pub stop: Vec<String>,
    /// New tokens at most; `None`: up to the end of the context window.
    pub max_tokens: Option<usize>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// What to do when the prompt and `max_tokens` do not fit the context window.
    pub context_policy: ContextPolicy,
    /// `truncate`: prompt tokens kept at the start (a chat's system message), when they leave
    /// room; otherwise the attention sinks.
    pub keep_tokens: usize,
    /// Attach an [`Explain`] record (candidates left after each stage, entropy, chosen
    /// probability) to each token event.
    pub explain: bool,
}

impl GenRequest {
    pub fn new(prompt_tokens: Vec<TokenId>, sampling: SamplingParams) -> GenRequest {
        GenRequest {
            prompt_tokens,
            sampling,
            stop: Vec::new(),
            max_tokens: None,
            ignore_eos: false,
            context_policy: ContextPolicy::Error,
            keep_tokens: SINK_TOKENS,
            explain: false,
        }
    }
}

/// One generated token and the text it made safe to show (may be empty: part of a UTF-8
/// character, or text held back as a possible start of a stop string).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    pub token: TokenId,
    pub text: String,
    /// ln p(token) under the model (with `sampling.logprobs`).
    pub logprob: Option<f32>,
    /// The most likely alternatives with their logprobs, most likely first.
    pub top_logprobs: Vec<(TokenId, f32)>,
    /// With [`GenRequest::explain`]: how the token was chosen.
    pub explain: Option<Explain>,
}

/// The end of a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    /// Text released at the end (held-back text after an end-of-generation token).
    pub text: String,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Tokens sampled, including a final end-of-generation token.
    pub completion_tokens: usize,
    /// How many times the request was preempted and recomputed.
    pub preemptions: usize,
    /// Prompt tokens whose keys and values came from the prefix cache instead of being
    /// computed (in the run that produced the output, if the request was preempted).
    pub cached_tokens: usize,
    /// Tokens removed from the context: the prompt's, by `truncate`; those the window evicted,
    /// by `stream`.
    pub dropped_tokens: usize,
    /// What speculation proposed and what of it was accepted.
    pub speculation: SpecStats,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Token(TokenEvent),
    Done(Finished),
    Error(String),
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("the request queue is full ({0} waiting); retry later")]
    QueueFull(usize),
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "the prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context window of {n_ctx} tokens"
    )]
    TooLong {
        prompt: usize,
        max_tokens: usize,
        n_ctx: usize,
    },
    #[error("the prompt ({prompt} tokens) does not fit in the KV cache ({capacity} tokens)")]
    KvTooSmall { prompt: usize, capacity: usize },
    #[error(transparent)]
    Context(#[from] ContextError),
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    BadToken { token: TokenId, vocab: usize },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
}

struct Pending {
    tx: UnboundedSender<Event>,
    prompt: Vec<TokenId>,
    /// Validated, with `max_tokens` resolved.
    req: GenerateRequest,
    /// Built from `req.sampling` at submission.
    sampler: Sampler,
    policy: ContextPolicy,
    /// Prompt tokens `truncate` dropped.
    dropped_tokens: usize,
    /// Hashes of the prompt's full blocks for the prefix cache (made here, on the caller's
    /// thread, not on the scheduler's).
    hashes: Vec<BlockHash>,
}

/// The arithmetic token `index` of a prompt of `len` tokens gets (see `Batch::push_prompt`).
fn prompt_slot(len: usize, index: usize) -> PromptSlot {
    PromptSlot {
        len,
        index,
        all_logits: false,
    }
}

#[derive(Default)]
struct Inbox {
    incoming: VecDeque<Pending>,
    shutdown: bool,
}

struct Shared {
    inbox: Mutex<Inbox>,
    wake: Condvar,
    counters: Counters,
    cfg: EngineConfig,
    n_vocab: usize,
    /// The model's arithmetic, for the prefix cache's block hashes.
    arithmetic: Arithmetic,
    /// For compiling grammars at submission.
    tokenizer: Arc<Tokenizer>,
    /// With `cfg.kv_events`: where the scheduler sends each step's [`KvEvent`]s, the receiving
    /// end until [`EngineHandle::take_kv_events`] takes it, and the cached hashes after the
    /// last events.
    kv_events: Option<UnboundedSender<Vec<KvEvent>>>,
    kv_events_rx: Mutex<Option<UnboundedReceiver<Vec<KvEvent>>>>,
    kv_cached_hashes: Mutex<Vec<BlockHash>>,
}

/// The engine: use [`Engine::start`] to get a handle.
pub struct Engine;

/// A handle to a running engine; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct EngineHandle {
    shared: Arc<Shared>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl Engine {
    /// Starts the scheduler thread. `cfg.n_ctx` is capped at the model's training context
    /// unless `cfg.allow_long_context`. Check `cfg` with [`EngineConfig::check`] first.
    /// Panics when the model's head dimension does not fit `cfg.kv_type` (a caller's check).
    pub fn start(model: Arc<Model>, tokenizer: Arc<Tokenizer>, cfg: EngineConfig) -> EngineHandle {
        Self::start_with_draft(model, tokenizer, cfg, None)
    }

    /// [`start`](Self::start) with a draft model: with `cfg.speculation`, it proposes the
    /// sequences' drafts instead of prompt lookup (check `cfg` with
    /// [`EngineConfig::check_with_draft`] first).
    pub fn start_with_draft(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        mut cfg: EngineConfig,
        draft: Option<DraftModel>,
    ) -> EngineHandle {
        cfg.max_running = cfg.max_running.max(1);
        cfg.block_size = cfg.block_size.max(1);
        cfg.step_token_budget = cfg.step_token_budget.max(cfg.max_running).max(1);
        if !cfg.allow_long_context {
            cfg.n_ctx = cfg.n_ctx.min(model.hp.n_ctx_train.max(1));
        }
        cfg.n_ctx = cfg.n_ctx.max(2);
        let kv_cfg = cfg.kv_config(&model);
        assert_eq!(
            kv_cfg.check(),
            Ok(()),
            "the caller checked the KV cache type against the model"
        );
        let mut kv = KvCache::new(kv_cfg);
        kv.set_prefix_caching(cfg.prefix_caching);
        kv.set_events(cfg.kv_events);
        let (kv_events, kv_events_rx) = match cfg.kv_events {
            true => {
                let (tx, rx) = unbounded_channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        // The draft's pool, when it will propose.
        let draft = draft.filter(|_| cfg.speculation.is_some()).map(|d| {
            let dcfg = cfg.draft_kv_config(&d.model);
            assert_eq!(
                dcfg.check(),
                Ok(()),
                "the caller checked the draft's KV type"
            );
            let mut dkv = KvCache::new(dcfg);
            // Its proposals are cut back by up to MAX_DRAFT tokens after their last forward.
            dkv.set_rollback_slack(MAX_DRAFT);
            (d.prior_cost(&model), d, dkv)
        });
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox::default()),
            wake: Condvar::new(),
            counters: Counters::default(),
            cfg,
            n_vocab: model.hp.n_vocab,
            arithmetic: model.arithmetic(),
            tokenizer: tokenizer.clone(),
            kv_events,
            kv_events_rx: Mutex::new(kv_events_rx),
            kv_cached_hashes: Mutex::new(Vec::new()),
        });
        shared
            .counters
            .kv_total
            .store(kv.config().n_blocks, Ordering::Relaxed);
        shared
            .counters
            .kv_free
            .store(kv.free_blocks(), Ordering::Relaxed);
        if let Some((_, _, dkv)) = &draft {
            let total = dkv.config().n_blocks;
            shared
                .counters
                .draft_kv_total
                .store(total, Ordering::Relaxed);
        }
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nucleus-scheduler".into())
            .spawn(move || {
                let (draft, draft_kv) = match draft {
                    Some((prior, d, dkv)) => (Some((prior, d)), Some(dkv)),
                    None => (None, None),
                };
                let budget = s.cfg.step_token_budget;
                let runner = draft.as_ref().zip(draft_kv).map(|((prior, d), dkv)| {
                    DraftRunner::new(&d.model, dkv, d.pass_cost, *prior, budget)
                });
                let mut sched = Scheduler::new(&s, &model, &tokenizer, kv, runner);
                sched.run();
            })
            .expect("spawn the scheduler thread");
        EngineHandle {
            shared,
            thread: Arc::new(Mutex::new(Some(thread))),
        }
    }
}

impl EngineHandle {
    pub fn config(&self) -> &EngineConfig {
        &self.shared.cfg
    }

    /// The prefix cache's events, a batch per scheduler step that had any, in order (with
    /// [`EngineConfig::kv_events`]; `None` without it, or when taken already).
    pub fn take_kv_events(&self) -> Option<UnboundedReceiver<Vec<KvEvent>>> {
        self.shared.kv_events_rx.lock().ok()?.take()
    }

    /// The hashes of the cached blocks as of the last batch of events (with
    /// [`EngineConfig::kv_events`]; empty without it): what replaying every batch gives.
    pub fn cached_block_hashes(&self) -> Vec<BlockHash> {
        self.shared
            .kv_cached_hashes
            .lock()
            .map(|h| h.clone())
            .unwrap_or_default()
    }

    /// Queues a request. Its events arrive on the returned receiver; dropping the receiver
    /// cancels the request.
    pub fn submit(&self, req: GenRequest) -> Result<UnboundedReceiver<Event>, SubmitError> {
        let cfg = &self.shared.cfg;
        let prompt = req.prompt_tokens.len();
        if prompt == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if let Some(&token) = req
            .prompt_tokens
            .iter()
            .find(|&&t| t as usize >= self.shared.n_vocab)
        {
            return Err(SubmitError::BadToken {
                token,
                vocab: self.shared.n_vocab,
            });
        }
        let mut prompt_tokens = req.prompt_tokens;
        let mut dropped_tokens = 0;
        let max_tokens = match req.context_policy {
            ContextPolicy::Stream => {
                check_stream_window(cfg.n_ctx, cfg.block_size)?;
                req.max_tokens.unwrap_or(usize::MAX)
            }
            policy => {
                if policy == ContextPolicy::Truncate {
                    let max_tokens = req.max_tokens.unwrap_or(0);
                    (prompt_tokens, dropped_tokens) =
                        truncate_to_window(&prompt_tokens, req.keep_tokens, cfg.n_ctx, max_tokens);
                }
                let prompt = prompt_tokens.len();
                let room = cfg.n_ctx.saturating_sub(prompt);
                let max_tokens = match policy {
                    // Truncate: the answer ends with the window.
                    ContextPolicy::Truncate => req.max_tokens.unwrap_or(room).min(room),
                    _ => req.max_tokens.unwrap_or(room),
                };
                if prompt + max_tokens.max(1) > cfg.n_ctx {
                    return Err(SubmitError::TooLong {
                        prompt,
                        max_tokens,
                        n_ctx: cfg.n_ctx,
                    });
                }
                max_tokens
            }
        };
        let prompt = prompt_tokens.len();
        let capacity = self.shared.counters.kv_total.load(Ordering::Relaxed) * cfg.block_size;
        let kv_need = (prompt + 1).min(cfg.n_ctx);
        if kv_need.div_ceil(cfg.block_size) + cfg.headroom_blocks > capacity / cfg.block_size {
            return Err(SubmitError::KvTooSmall { prompt, capacity });
        }
        let gen = GenerateRequest {
            sampling: req.sampling,
            stop: req.stop,
            max_tokens,
            ignore_eos: req.ignore_eos,
            explain: req.explain,
            ..GenerateRequest::default()
        };
        gen.validate()?;
        // (A grammar is compiled here, on the caller's thread: its errors come back at once.)
        let sampler = Sampler::for_tokenizer(gen.sampling.clone(), &self.shared.tokenizer)?;
        let mut hashes = Vec::new();
        if cfg.prefix_caching {
            let arithmetic = self.shared.arithmetic;
            let class = |i| arithmetic_class(arithmetic, prompt_slot(prompt, i));
            extend_block_hashes(&prompt_tokens, class, cfg.block_size, &mut hashes);
        }
        let (tx, rx) = unbounded_channel();
        let mut inbox = self.shared.inbox.lock().expect("inbox lock");
        if inbox.shutdown {
            return Err(SubmitError::ShuttingDown);
        }
        let queued = self.shared.counters.waiting.load(Ordering::Relaxed);
        if inbox.incoming.len() + queued >= cfg.queue_capacity {
            // Requests abandoned before the scheduler took them (a client gone, or the earlier
            // choices of a request refused here) hold no place in the queue.
            inbox.incoming.retain(|p| !p.tx.is_closed());
        }
        let waiting = inbox.incoming.len() + queued;
        if waiting >= cfg.queue_capacity {
            return Err(SubmitError::QueueFull(waiting));
        }
        inbox.incoming.push_back(Pending {
            tx,
            prompt: prompt_tokens,
            req: gen,
            sampler,
            policy: req.context_policy,
            dropped_tokens,
            hashes,
        });
        drop(inbox);
        self.shared.wake.notify_one();
        Ok(rx)
    }

    pub fn stats(&self) -> EngineStats {
        let incoming = self.shared.inbox.lock().map_or(0, |i| i.incoming.len());
        self.shared.counters.snapshot(incoming)
    }

    /// Stops the engine: new requests are refused, every queued or running request ends with an
    /// [`Event::Error`], and the scheduler thread is joined. (A server drains first, then calls
    /// this.) Idempotent.
    pub fn shutdown(&self) {
        self.shared.inbox.lock().expect("inbox lock").shutdown = true;
        self.shared.wake.notify_all();
        let handle = self.thread.lock().expect("thread lock").take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// True once [`shutdown`](Self::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.shared.inbox.lock().map_or(true, |i| i.shutdown)
    }
}
