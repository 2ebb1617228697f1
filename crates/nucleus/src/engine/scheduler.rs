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
//! uncached again).
//!
//! Admission is by KV blocks: the request at the head of the queue is admitted when its tokens,
//! plus a little headroom, fit in the free blocks not already promised to running sequences.
//! When the pool runs short anyway (sequences grow), the newest running sequence is preempted:
//! its blocks are freed and it goes back to the front of the waiting queue, to be recomputed
//! later. Its decoding state (its [`Sequence`]: sampler and RNG stream, detokenizer, stop
//! conditions) is kept, so its output does not change.
//!
//! Cancellation: a request whose event receiver is dropped is removed before the next step and
//! its blocks return to the pool. Every admitted request ends with [`Event::Done`] or
//! [`Event::Error`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::sequence::{GenerateRequest, Sequence};
use crate::kernels::PromptSlot;
use crate::kv_cache::{KvCache, SeqId};
use crate::model::{Batch, ForwardState, Model};
use crate::sampling::{FinishReason, Sampler, SamplingError, SamplingParams};
use crate::tokenizer::{TokenId, Tokenizer};

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
}

impl GenRequest {
    pub fn new(prompt_tokens: Vec<TokenId>, sampling: SamplingParams) -> GenRequest {
        GenRequest {
            prompt_tokens,
            sampling,
            stop: Vec::new(),
            max_tokens: None,
            ignore_eos: false,
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
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    BadToken { token: TokenId, vocab: usize },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
}

/// A snapshot of the engine's counters (for `/metrics`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_used_blocks: usize,
    pub kv_free_blocks: usize,
    pub kv_total_blocks: usize,
    /// Prompt tokens of admitted requests (counted once, not per recomputation).
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    /// Tokens through the forward pass (prefill, decode and recomputation).
    pub forward_tokens_total: u64,
    pub steps_total: u64,
    pub requests_finished: u64,
    pub requests_cancelled: u64,
    pub requests_failed: u64,
    pub preemptions_total: u64,
}

#[derive(Default)]
struct Counters {
    running: AtomicUsize,
    waiting: AtomicUsize,
    kv_used: AtomicUsize,
    kv_free: AtomicUsize,
    kv_total: AtomicUsize,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    forward_tokens: AtomicU64,
    steps: AtomicU64,
    finished: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    preemptions: AtomicU64,
}

struct Pending {
    tx: UnboundedSender<Event>,
    prompt: Vec<TokenId>,
    /// Validated, with `max_tokens` resolved.
    req: GenerateRequest,
    /// Built from `req.sampling` at submission.
    sampler: Sampler,
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
    /// Starts the scheduler thread. `cfg.n_ctx` is capped at the model's training context.
    pub fn start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        mut cfg: EngineConfig,
    ) -> EngineHandle {
        cfg.max_running = cfg.max_running.max(1);
        cfg.block_size = cfg.block_size.max(1);
        cfg.step_token_budget = cfg.step_token_budget.max(cfg.max_running).max(1);
        cfg.n_ctx = cfg.n_ctx.min(model.hp.n_ctx_train.max(1)).max(2);
        let kv = model.new_kv_cache(cfg.kv_tokens.max(cfg.block_size), cfg.block_size);
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox::default()),
            wake: Condvar::new(),
            counters: Counters::default(),
            cfg,
            n_vocab: model.hp.n_vocab,
        });
        shared
            .counters
            .kv_total
            .store(kv.config().n_blocks, Ordering::Relaxed);
        shared
            .counters
            .kv_free
            .store(kv.free_blocks(), Ordering::Relaxed);
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nucleus-scheduler".into())
            .spawn(move || {
                let mut sched = Scheduler {
                    shared: &s,
                    model: &model,
                    tok: &tokenizer,
                    kv,
                    state: ForwardState::new(),
                    batch: Batch::new(),
                    running: Vec::new(),
                    waiting: VecDeque::new(),
                    next_order: 0,
                };
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
        let room = cfg.n_ctx.saturating_sub(prompt);
        let max_tokens = req.max_tokens.unwrap_or(room);
        if prompt + max_tokens.max(1) > cfg.n_ctx {
            return Err(SubmitError::TooLong {
                prompt,
                max_tokens,
                n_ctx: cfg.n_ctx,
            });
        }
        let capacity = self.shared.counters.kv_total.load(Ordering::Relaxed) * cfg.block_size;
        if (prompt + 1).div_ceil(cfg.block_size) + cfg.headroom_blocks > capacity / cfg.block_size {
            return Err(SubmitError::KvTooSmall { prompt, capacity });
        }
        let gen = GenerateRequest {
            sampling: req.sampling,
            stop: req.stop,
            max_tokens,
            ignore_eos: req.ignore_eos,
            ..GenerateRequest::default()
        };
        gen.validate()?;
        let sampler = Sampler::new(gen.sampling.clone())?;
        let (tx, rx) = unbounded_channel();
        let mut inbox = self.shared.inbox.lock().expect("inbox lock");
        if inbox.shutdown {
            return Err(SubmitError::ShuttingDown);
        }
        let waiting = inbox.incoming.len() + self.shared.counters.waiting.load(Ordering::Relaxed);
        if waiting >= cfg.queue_capacity {
            return Err(SubmitError::QueueFull(waiting));
        }
        inbox.incoming.push_back(Pending {
            tx,
            prompt: req.prompt_tokens,
            req: gen,
            sampler,
        });
        drop(inbox);
        self.shared.wake.notify_one();
        Ok(rx)
    }

    pub fn stats(&self) -> EngineStats {
        let c = &self.shared.counters;
        let incoming = self.shared.inbox.lock().map_or(0, |i| i.incoming.len());
        EngineStats {
            running: c.running.load(Ordering::Relaxed),
            waiting: c.waiting.load(Ordering::Relaxed) + incoming,
            kv_used_blocks: c.kv_used.load(Ordering::Relaxed),
            kv_free_blocks: c.kv_free.load(Ordering::Relaxed),
            kv_total_blocks: c.kv_total.load(Ordering::Relaxed),
            prompt_tokens_total: c.prompt_tokens.load(Ordering::Relaxed),
            generation_tokens_total: c.generation_tokens.load(Ordering::Relaxed),
            forward_tokens_total: c.forward_tokens.load(Ordering::Relaxed),
            steps_total: c.steps.load(Ordering::Relaxed),
            requests_finished: c.finished.load(Ordering::Relaxed),
            requests_cancelled: c.cancelled.load(Ordering::Relaxed),
            requests_failed: c.failed.load(Ordering::Relaxed),
            preemptions_total: c.preemptions.load(Ordering::Relaxed),
        }
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

// ---------------------------------------------------------------------------------------------
// The scheduler.

struct Seq<'t> {
    tx: UnboundedSender<Event>,
    /// The decoding state; its context (prompt, then the generated tokens: the last one not yet
    /// in the cache while decoding) is what the batches feed.
    seq: Sequence<'t>,
    kv_seq: Option<SeqId>,
    n_cached: usize,
    /// Admission order; the highest is the newest (preempted first).
    order: u64,
    preemptions: usize,
}

impl Seq<'_> {
    fn tokens(&self) -> &[TokenId] {
        self.seq.context()
    }

    fn uncached(&self) -> usize {
        self.tokens().len() - self.n_cached
    }
}

struct Scheduler<'a> {
    shared: &'a Shared,
    model: &'a Model,
    tok: &'a Tokenizer,
    kv: KvCache,
    state: ForwardState,
    batch: Batch,
    running: Vec<Seq<'a>>,
    waiting: VecDeque<Seq<'a>>,
    next_order: u64,
}

impl<'a> Scheduler<'a> {
    fn run(&mut self) {
        loop {
            if !self.take_incoming() {
                self.fail_all("the server is shutting down");
                self.publish();
                return;
            }
            self.drop_cancelled();
            self.admit();
            self.publish();
            if self.running.is_empty() {
                continue;
            }
            let plan = self.plan();
            if !plan.is_empty() {
                self.step(&plan);
            }
            self.publish();
        }
    }

    /// Moves new requests into the waiting queue, sleeping while there is nothing to do.
    /// Returns false on shutdown.
    fn take_incoming(&mut self) -> bool {
        let mut inbox = self.shared.inbox.lock().expect("inbox lock");
        while self.running.is_empty()
            && self.waiting.is_empty()
            && inbox.incoming.is_empty()
            && !inbox.shutdown
        {
            inbox = self.shared.wake.wait(inbox).expect("inbox lock");
        }
        if inbox.shutdown {
            return false;
        }
        for p in inbox.incoming.drain(..) {
            self.waiting.push_back(Seq {
                tx: p.tx,
                seq: Sequence::with_sampler(self.tok, &p.prompt, &p.req, p.sampler),
                kv_seq: None,
                n_cached: 0,
                order: 0,
                preemptions: 0,
            });
        }
        self.shared
            .counters
            .waiting
            .store(self.waiting.len(), Ordering::Relaxed);
        true
    }

    fn release(&mut self, seq: &mut Seq) {
        if let Some(id) = seq.kv_seq.take() {
            let _ = self.kv.free_seq(id);
        }
        seq.n_cached = 0;
    }

    fn drop_cancelled(&mut self) {
        let c = &self.shared.counters;
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].tx.is_closed() {
                let mut s = self.running.remove(i);
                self.release(&mut s);
                c.cancelled.fetch_add(1, Ordering::Relaxed);
            } else {
                i += 1;
            }
        }
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.tx.is_closed());
        c.cancelled
            .fetch_add((before - self.waiting.len()) as u64, Ordering::Relaxed);
    }

    /// Blocks the running sequences still need for their uncached tokens.
    fn promised_blocks(&self) -> usize {
        self.running
            .iter()
            .map(|s| match s.kv_seq {
                Some(id) => self.kv.blocks_needed(id, s.uncached()).unwrap_or(0),
                None => s.tokens().len().div_ceil(self.shared.cfg.block_size),
            })
            .sum()
    }

    fn admit(&mut self) {
        let cfg = &self.shared.cfg;
        while self.running.len() < cfg.max_running {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let need = front.tokens().len().div_ceil(cfg.block_size) + cfg.headroom_blocks;
            let free = self.kv.free_blocks();
            if free < self.promised_blocks() + need {
                if self.running.is_empty() && self.kv.used_blocks() == 0 {
                    // Can never fit (submit checks the prompt; this is a preempted sequence that
                    // grew past the whole pool).
                    let mut s = self.waiting.pop_front().expect("front exists");
                    self.fail(&mut s, "the sequence no longer fits in the KV cache");
                    continue;
                }
                break;
            }
            let mut s = self.waiting.pop_front().expect("front exists");
            s.kv_seq = Some(self.kv.new_seq());
            s.n_cached = 0;
            s.order = self.next_order;
            self.next_order += 1;
            if s.preemptions == 0 {
                self.shared
                    .counters
                    .prompt_tokens
                    .fetch_add(s.seq.prompt().len() as u64, Ordering::Relaxed);
            }
            self.running.push(s);
        }
    }

    /// Which tokens of which sequences go into this step's batch: (running index, count).
    /// Preempts the newest sequences while the KV pool cannot hold the step.
    fn plan(&mut self) -> Vec<(usize, usize)> {
        let budget = self.shared.cfg.step_token_budget;
        loop {
            let mut plan = Vec::new();
            let mut left = budget;
            // Decode tokens first: they are what running streams wait for.
            for (i, s) in self.running.iter().enumerate() {
                if s.uncached() == 1 && left > 0 {
                    plan.push((i, 1));
                    left -= 1;
                }
            }
            // Then prefill chunks, oldest first.
            let mut order: Vec<usize> = (0..self.running.len())
                .filter(|&i| self.running[i].uncached() > 1)
                .collect();
            order.sort_by_key(|&i| self.running[i].order);
            for i in order {
                if left == 0 {
                    break;
                }
                let n = self.running[i].uncached().min(left);
                plan.push((i, n));
                left -= n;
            }
            let needed: usize = plan
                .iter()
                .map(|&(i, n)| {
                    let id = self.running[i]
                        .kv_seq
                        .expect("running sequences have a cache seq");
                    self.kv.blocks_needed(id, n).unwrap_or(usize::MAX / 4)
                })
                .sum();
            let free = self.kv.free_blocks();
            if needed <= free {
                return plan;
            }
            if self.running.len() > 1 {
                self.preempt_newest();
                continue;
            }
            // A single sequence: shrink its chunk to what fits.
            let (i, n) = plan[0];
            let id = self.running[i].kv_seq.expect("running");
            let mut fit = n;
            while fit > 0 && self.kv.blocks_needed(id, fit).unwrap_or(usize::MAX) > free {
                fit -= 1;
            }
            if fit == 0 {
                let mut s = self.running.remove(i);
                self.fail(&mut s, "the KV cache is too small for this sequence");
                return Vec::new();
            }
            return vec![(i, fit)];
        }
    }

    fn preempt_newest(&mut self) {
        let i = (0..self.running.len())
            .max_by_key(|&i| self.running[i].order)
            .expect("at least one running");
        let mut s = self.running.remove(i);
        self.release(&mut s);
        s.preemptions += 1;
        self.shared
            .counters
            .preemptions
            .fetch_add(1, Ordering::Relaxed);
        self.waiting.push_front(s);
    }

    fn step(&mut self, plan: &[(usize, usize)]) {
        self.batch.clear();
        for &(i, n) in plan {
            let s = &self.running[i];
            let id = s.kv_seq.expect("running");
            let last = n == s.uncached();
            // Prompt tokens (also when recomputed after preemption) get prompt arithmetic,
            // generated ones decode arithmetic, whatever the chunking: see `Batch::push_prompt`.
            let n_prompt = s.seq.prompt().len();
            for k in 0..n {
                let pos = s.n_cached + k;
                let logits = last && k + 1 == n;
                if pos < n_prompt {
                    let slot = PromptSlot {
                        len: n_prompt,
                        index: pos,
                        all_logits: false,
                    };
                    self.batch
                        .push_prompt(s.tokens()[pos], pos, id, logits, slot);
                } else {
                    self.batch.push(s.tokens()[pos], pos, id, logits);
                }
            }
        }
        let c = &self.shared.counters;
        c.steps.fetch_add(1, Ordering::Relaxed);
        c.forward_tokens
            .fetch_add(self.batch.len() as u64, Ordering::Relaxed);
        if let Err(e) = self
            .model
            .forward(&self.batch, &mut self.kv, &mut self.state)
        {
            // Should not happen (the plan fits); fail the sequences of this batch, keep serving.
            let msg = format!("forward pass failed: {e}");
            let mut idx: Vec<usize> = plan.iter().map(|&(i, _)| i).collect();
            idx.sort_unstable_by(|a, b| b.cmp(a));
            for i in idx {
                let mut s = self.running.remove(i);
                self.fail(&mut s, &msg);
            }
            return;
        }
        let n_vocab = self.model.hp.n_vocab;
        let all_logits = self.state.logits();
        let mut buf: Vec<f32> = Vec::with_capacity(n_vocab);
        let mut row = 0;
        let mut done: Vec<usize> = Vec::new();
        let mut finals: Vec<(UnboundedSender<Event>, Finished)> = Vec::new();
        for &(i, n) in plan {
            let s = &mut self.running[i];
            let last = n == s.uncached();
            s.n_cached += n;
            if !last {
                continue;
            }
            let r = row;
            row += 1;
            buf.clear();
            buf.extend_from_slice(&all_logits[r * n_vocab..(r + 1) * n_vocab]);
            match s.seq.step(&mut buf) {
                Err(e) => {
                    c.failed.fetch_add(1, Ordering::Relaxed);
                    let _ = s.tx.send(Event::Error(format!("sampling failed: {e}")));
                    done.push(i);
                }
                Ok(out) => {
                    c.generation_tokens.fetch_add(1, Ordering::Relaxed);
                    // An EOS token is not output: its text (held text released) comes with
                    // `Done`. The sequence has fed every other token into its context.
                    let end_text = if out.is_eos {
                        out.text
                    } else {
                        let (logprob, top_logprobs) = match out.logprob {
                            Some(lp) => (
                                Some(lp.logprob),
                                lp.top_logprobs
                                    .iter()
                                    .map(|t| (t.token, t.logprob))
                                    .collect(),
                            ),
                            None => (None, Vec::new()),
                        };
                        let _ = s.tx.send(Event::Token(TokenEvent {
                            token: out.token,
                            text: out.text,
                            logprob,
                            top_logprobs,
                        }));
                        String::new()
                    };
                    if let Some(reason) = out.finish {
                        c.finished.fetch_add(1, Ordering::Relaxed);
                        // Sent after the blocks are freed and the stats published, so that a
                        // client that saw its request end sees the engine without it.
                        finals.push((
                            s.tx.clone(),
                            Finished {
                                text: end_text,
                                finish_reason: reason,
                                prompt_tokens: s.seq.prompt().len(),
                                // Sampled tokens: the generated ones and an ending EOS.
                                completion_tokens: s.seq.tokens().len() + usize::from(out.is_eos),
                                preemptions: s.preemptions,
                            },
                        ));
                        done.push(i);
                    }
                }
            }
        }
        done.sort_unstable_by(|a, b| b.cmp(a));
        for i in done {
            let mut s = self.running.remove(i);
            self.release(&mut s);
        }
        self.publish();
        for (tx, f) in finals {
            let _ = tx.send(Event::Done(f));
        }
    }

    fn fail(&mut self, s: &mut Seq, msg: &str) {
        self.release(s);
        self.shared.counters.failed.fetch_add(1, Ordering::Relaxed);
        let _ = s.tx.send(Event::Error(msg.to_string()));
    }

    fn fail_all(&mut self, msg: &str) {
        let mut all: Vec<Seq> = self.running.drain(..).collect();
        all.extend(self.waiting.drain(..));
        let incoming: Vec<Pending> = self
            .shared
            .inbox
            .lock()
            .map(|mut i| i.incoming.drain(..).collect())
            .unwrap_or_default();
        for p in incoming {
            let _ = p.tx.send(Event::Error(msg.to_string()));
        }
        for mut s in all {
            self.fail(&mut s, msg);
        }
    }

    fn publish(&self) {
        let c = &self.shared.counters;
        c.running.store(self.running.len(), Ordering::Relaxed);
        c.waiting.store(self.waiting.len(), Ordering::Relaxed);
        c.kv_used.store(self.kv.used_blocks(), Ordering::Relaxed);
        c.kv_free.store(self.kv.free_blocks(), Ordering::Relaxed);
    }
}
