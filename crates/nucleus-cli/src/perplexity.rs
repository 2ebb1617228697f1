//! `nucleus perplexity MODEL FILE`: llama-perplexity's measure, and the KL divergence of a run
//! from a saved base run (see `nucleus::eval`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use nucleus::engine::ContextPolicy;
use nucleus::eval::kl::{Base, BaseHeader, BaseWriter, KlStats};
use nucleus::eval::llama_kld::{compare_row, LlamaKldBase, LlamaKldWriter};
use nucleus::eval::{evaluate, Mode, NllStats, Scored};
use serde_json::json;

#[derive(Args, Clone, Debug)]
pub struct PerplexityArgs {
    /// Model: a catalog name or a path to a GGUF file.
    pub model: String,
    /// The text to measure on (UTF-8).
    pub file: PathBuf,
    /// Window in tokens: the text is cut into windows of this size, each evaluated fresh, and
    /// the second half of each is scored (llama-perplexity's method).
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// `error` or `truncate`: fresh windows (the default; no window is ever too long).
    /// `stream`: the whole text as one sequence through a window of --ctx tokens that keeps
    /// the attention sinks and the most recent tokens (StreamingLLM's evaluation).
    #[arg(long, default_value = "error")]
    pub context_policy: ContextPolicy,
    /// With `stream`: blocks of 16 tokens kept at the start as attention sinks (default 1;
    /// 0 measures a plain window of recent tokens, the comparison StreamingLLM makes).
    #[arg(long, default_value_t = 1)]
    pub stream_sinks: usize,
    /// How the KV cache stores keys and values: `f16`, `q8_0` or `q4_0`.
    #[arg(long, default_value = "f16")]
    pub kv_type: nucleus::kv_cache::KvType,
    /// Threads for the forward pass (0 = all cores).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
    /// Save this run's distributions (top --kl-top-k tokens per scored position) to OUT.
    #[arg(long, value_name = "OUT")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare this run with a base saved by --kl-divergence-base: mean KL divergence, top-1
    /// agreement, perplexity ratio.
    #[arg(long, value_name = "BASE")]
    pub kl_divergence: Option<PathBuf>,
    /// Save this run's distributions as llama.cpp's KL-divergence base (all tokens, its u16
    /// format) to OUT, for `llama-perplexity --kl-divergence-base OUT --kl-divergence`: llama.cpp
    /// then measures its own distance from this run. Fresh windows only.
    #[arg(long, value_name = "OUT")]
    pub kl_divergence_base_llama: Option<PathBuf>,
    /// Compare this run with a llama.cpp KL-divergence base (llama-perplexity
    /// --kl-divergence-base, or --kl-divergence-base-llama) by llama.cpp's formula, over the
    /// whole vocabulary: the same figures llama-perplexity --kl-divergence reports against it.
    #[arg(long, value_name = "BASE")]
    pub kl_divergence_llama: Option<PathBuf>,
    /// Tokens saved per position in a KL base.
    #[arg(long, default_value_t = 32)]
    pub kl_top_k: usize,
    /// Print one JSON object (for scripts) instead of the running figures.
    #[arg(long)]
    pub json: bool,
}

pub fn perplexity(args: PerplexityArgs) -> Result<()> {
    check_kl_flags(&args)?;
    let text = read_text(&args.file)?;
    let path = crate::commands::resolve_model(Some(&args.model))?;
    let crate::commands::Loaded { model, tokenizer } =
        crate::commands::load_path(&path, args.threads)?;
    let tokens = tokenizer.encode(&text, true, false)?;
    nucleus::eval::perplexity::check(&model, tokens.len(), args.ctx)?;
    let mode = match args.context_policy {
        ContextPolicy::Stream => Mode::Stream {
            sink_blocks: args.stream_sinks,
        },
        _ => Mode::Windows,
    };
    if mode == Mode::Windows && args.stream_sinks != 1 {
        bail!("--stream-sinks is for --context-policy stream");
    }
    let header = BaseHeader {
        n_vocab: model.hp.n_vocab,
        n_ctx: args.ctx,
        k: args.kl_top_k.clamp(1, model.hp.n_vocab),
        mode,
        tokens,
    };
    let mut sinks = Sinks::open(&args, &header)?;
    let bar = progress_bar(args.json, mode);
    let mut running = Vec::new();
    let t0 = Instant::now();
    let bos = tokenizer.bos().filter(|_| tokenizer.add_bos());
    let stats = evaluate(
        &model,
        &header.tokens,
        args.ctx,
        mode,
        args.kv_type,
        bos,
        |s: &Scored| sinks.push(s),
        |done, total, st: &NllStats| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            if mode == Mode::Windows {
                running.push(st.ppl());
            }
        },
    )?;
    bar.finish_and_clear();
    let kl = sinks.finish()?;
    let run = Run {
        args: &args,
        path: &path,
        mode,
        tokens: header.tokens.len(),
        secs: t0.elapsed().as_secs_f64(),
    };
    if args.json {
        println!("{}", run.json(&stats, kl.as_ref()));
    } else {
        run.print(&stats, kl.as_ref(), &running);
    }
    Ok(())
}

/// The KL flags that contradict each other.
fn check_kl_flags(args: &PerplexityArgs) -> Result<()> {
    if args.kl_divergence.is_some() && args.kl_divergence_base.is_some() {
        bail!("--kl-divergence-base saves a base and --kl-divergence compares with one; use one at a time");
    }
    if args.kl_divergence.is_some() && args.kl_divergence_llama.is_some() {
        bail!(
            "--kl-divergence and --kl-divergence-llama each compare with a base; use one at a time"
        );
    }
    if args.kl_divergence_llama.is_some()
        && args.kl_divergence_llama == args.kl_divergence_base_llama
    {
        bail!("--kl-divergence-llama reads the file that --kl-divergence-base-llama would overwrite; give two paths");
    }
    Ok(())
}

/// The text to measure on: a UTF-8 file.
fn read_text(file: &std::path::Path) -> Result<String> {
    let text = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    String::from_utf8(text).map_err(|_| anyhow::anyhow!("{} is not UTF-8 text", file.display()))
}

/// The KL base at `p`, made with this run's vocabulary, window, mode and tokens.
fn matching_base(p: &std::path::Path, header: &BaseHeader) -> Result<Base> {
    let base = Base::load(p).with_context(|| format!("cannot read the KL base {}", p.display()))?;
    if base.header.n_vocab != header.n_vocab {
        bail!(
            "the KL base was made with a vocabulary of {} tokens, this model has {}",
            base.header.n_vocab,
            header.n_vocab
        );
    }
    if base.header.n_ctx != header.n_ctx || base.header.mode != header.mode {
        bail!(
            "the KL base was made with --ctx {} ({:?}); this run is --ctx {} ({:?})",
            base.header.n_ctx,
            base.header.mode,
            header.n_ctx,
            header.mode
        );
    }
    if base.header.tokens != header.tokens {
        bail!("the KL base was made on another text (or another tokenization)");
    }
    Ok(base)
}

/// The llama.cpp KL base at `p`, made with this run's vocabulary, window and tokens, with a
/// row for each position this run scores (fresh windows only).
fn matching_llama_base(
    p: &std::path::Path,
    args: &PerplexityArgs,
    mode: Mode,
    n_vocab: usize,
    tokens: &[u32],
) -> Result<LlamaKldBase> {
    if mode != Mode::Windows {
        bail!("--kl-divergence-llama compares fresh windows only (llama-perplexity's); drop --context-policy stream");
    }
    let base = LlamaKldBase::open(p)
        .with_context(|| format!("cannot read the llama.cpp KL base {}", p.display()))?;
    if base.n_vocab != n_vocab {
        bail!(
            "the llama.cpp KL base was made with a vocabulary of {} tokens, this model has {n_vocab}",
            base.n_vocab
        );
    }
    if base.n_ctx != args.ctx {
        bail!(
            "the llama.cpp KL base was made with windows of {} tokens (-c); this run has --ctx {}",
            base.n_ctx,
            args.ctx
        );
    }
    let windows = tokens.len() / args.ctx;
    if base.n_chunk != windows || base.tokens[..] != tokens[..windows * args.ctx] {
        bail!("the llama.cpp KL base was made on another text (or another tokenization, or with --chunks)");
    }
    Ok(base)
}

/// A writer of llama.cpp's KL-divergence base at `p` (fresh windows only).
fn llama_writer(
    p: &std::path::Path,
    args: &PerplexityArgs,
    mode: Mode,
    n_vocab: usize,
    tokens: &[u32],
) -> Result<LlamaKldWriter<std::io::BufWriter<std::fs::File>>> {
    if mode != Mode::Windows {
        bail!("--kl-divergence-base-llama writes fresh windows only (llama-perplexity's); drop --context-policy stream");
    }
    let file = std::fs::File::create(p).with_context(|| format!("cannot write {}", p.display()))?;
    LlamaKldWriter::new(
        std::io::BufWriter::new(file),
        args.ctx,
        n_vocab,
        tokens.len() / args.ctx,
        tokens,
    )
    .with_context(|| format!("cannot write {}", p.display()))
}

/// The progress of the windows (or stream chunks); hidden for `--json`.
fn progress_bar(json: bool, mode: Mode) -> ProgressBar {
    let bar = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed_precise} (eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(match mode {
        Mode::Windows => "windows",
        Mode::Stream { .. } => "stream chunks",
    });
    bar
}

/// Where each scored position goes: the base being written, llama.cpp's base being written,
/// the comparison with a saved base. The first failure is kept for after the run.
struct Sinks {
    base: Option<Base>,
    writer: Option<BaseWriter>,
    llama_writer: Option<LlamaKldWriter<std::io::BufWriter<std::fs::File>>>,
    llama_base: Option<LlamaKldBase>,
    kl: KlStats,
    next_base: usize,
    failure: Option<anyhow::Error>,
}

impl Sinks {
    /// The bases and writers that `args` name, checked against this run (`header`).
    fn open(args: &PerplexityArgs, header: &BaseHeader) -> Result<Sinks> {
        let (mode, n_vocab, tokens) = (header.mode, header.n_vocab, &header.tokens);
        Ok(Sinks {
            base: match &args.kl_divergence {
                Some(p) => Some(matching_base(p, header)?),
                None => None,
            },
            writer: match &args.kl_divergence_base {
                Some(p) => Some(
                    BaseWriter::create(p, header)
                        .with_context(|| format!("cannot write {}", p.display()))?,
                ),
                None => None,
            },
            llama_writer: match &args.kl_divergence_base_llama {
                Some(p) => Some(llama_writer(p, args, mode, n_vocab, tokens)?),
                None => None,
            },
            llama_base: match &args.kl_divergence_llama {
                Some(p) => Some(matching_llama_base(p, args, mode, n_vocab, tokens)?),
                None => None,
            },
            kl: KlStats::default(),
            next_base: 0,
            failure: None,
        })
    }

    fn push(&mut self, s: &Scored) {
        if let Some(w) = self.writer.as_mut() {
            if let Err(e) = w.push(s) {
                self.failure.get_or_insert(e.into());
            }
        }
        if let Some(w) = self.llama_writer.as_mut() {
            if let Err(e) = w.push(s.logits) {
                self.failure.get_or_insert(e.into());
            }
        }
        if let Some(b) = self.llama_base.as_mut() {
            match b.next_row() {
                Ok(row) => {
                    let c = compare_row(s.logits, row, s.target as usize);
                    self.kl.record(c.kl, c.same_top, c.nll_base, c.nll);
                }
                Err(e) => {
                    self.failure.get_or_insert(
                        anyhow::Error::new(e).context("cannot read the llama.cpp KL base"),
                    );
                }
            }
        }
        if let Some(b) = &self.base {
            match b.positions.get(self.next_base) {
                Some(p) if p.target_index == s.target_index => self.kl.push(p, s),
                _ => {
                    self.failure.get_or_insert(anyhow::anyhow!(
                        "the KL base does not have position {} where this run does",
                        s.target_index
                    ));
                }
            }
            self.next_base += 1;
        }
    }

    /// The first failure, or the writers finished and the comparison (if a base was given).
    fn finish(self) -> Result<Option<KlStats>> {
        if let Some(e) = self.failure {
            return Err(e);
        }
        if let Some(w) = self.writer {
            w.finish().context("cannot write the KL base")?;
        }
        if let Some(w) = self.llama_writer {
            w.finish().context("cannot write the llama.cpp KL base")?;
        }
        let compared = self.base.is_some() || self.llama_base.is_some();
        Ok(compared.then_some(self.kl))
    }
}

/// What a finished run reports.
struct Run<'a> {
    args: &'a PerplexityArgs,
    path: &'a std::path::Path,
    mode: Mode,
    tokens: usize,
    secs: f64,
}

impl Run<'_> {
    fn mode_name(&self) -> String {
        match self.mode {
            Mode::Windows => "windows".to_string(),
            Mode::Stream { sink_blocks } => format!("stream, {sink_blocks} sink block(s)"),
        }
    }

    /// How the KL divergence was summed: over the whole vocabulary (a llama.cpp base) or over
    /// the base's top tokens and a bucket for the rest (a lower bound).
    fn kl_method(&self) -> &'static str {
        if self.args.kl_divergence_llama.is_some() {
            "llama.cpp, whole vocabulary"
        } else {
            "top k + rest"
        }
    }

    fn json(&self, stats: &NllStats, kl: Option<&KlStats>) -> serde_json::Value {
        let mut v = json!({
            "model": self.path.display().to_string(),
            "file": self.args.file.display().to_string(),
            "ctx": self.args.ctx,
            "mode": self.mode_name(),
            "kv_type": self.args.kv_type.name(),
            "tokens": self.tokens,
            "tokens_scored": stats.count,
            "ppl": stats.ppl(),
            "ppl_stderr": stats.ppl_stderr(),
            "mean_nll": stats.mean(),
            "seconds": self.secs,
        });
        if let Some(kl) = kl {
            v["kl_divergence"] = kl_json(kl);
            v["kl_divergence"]["method"] = self.kl_method().into();
        }
        v
    }

    fn print(&self, stats: &NllStats, kl: Option<&KlStats>, running: &[f64]) {
        if !running.is_empty() {
            let parts: Vec<String> = running
                .iter()
                .enumerate()
                .map(|(i, p)| format!("[{}]{p:.4}", i + 1))
                .collect();
            println!("{}", parts.join(","));
        }
        println!(
            "{}, ctx {}, {} KV cache: {} tokens, {} scored in {:.1} s",
            self.mode_name(),
            self.args.ctx,
            self.args.kv_type,
            self.tokens,
            stats.count,
            self.secs
        );
        println!(
            "Final estimate: PPL = {:.4} +/- {:.5}",
            stats.ppl(),
            stats.ppl_stderr()
        );
        if let Some(kl) = kl {
            println!(
                "KL divergence from the base ({}): mean {:.6} ± {:.6}, 99% {:.6}, max {:.6}; top-1 agreement {:.2}%; PPL base {:.4}, this run {:.4}, ratio {:.4}",
                self.kl_method(),
                kl.mean_kl(),
                kl.kl_stderr(),
                kl.kl_quantile(0.99),
                kl.kl_quantile(1.0),
                100.0 * kl.top1_agreement(),
                kl.base_nll.ppl(),
                kl.new_nll.ppl(),
                kl.new_nll.ppl() / kl.base_nll.ppl()
            );
        }
    }
}

fn kl_json(kl: &KlStats) -> serde_json::Value {
    json!({
        "mean": kl.mean_kl(),
        "stderr": kl.kl_stderr(),
        "p99": kl.kl_quantile(0.99),
        "max": kl.kl_quantile(1.0),
        "top1_agreement": kl.top1_agreement(),
        "ppl_base": kl.base_nll.ppl(),
        "ppl": kl.new_nll.ppl(),
        "ppl_ratio": kl.new_nll.ppl() / kl.base_nll.ppl(),
        "positions": kl.kl.len(),
    })
}
