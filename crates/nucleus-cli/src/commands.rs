//! The subcommands. Each turns its arguments into calls of the nucleus library and prints the
//! result; errors bubble up to `main` and are printed as one line.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use nucleus::engine::context::{truncate_to_window, SINK_TOKENS};
use nucleus::engine::{ContextPolicy, GenerateRequest, SequenceStep, Session};
use nucleus::gguf::GgufFile;
use nucleus::model::Model;
use nucleus::sampling::{SamplingError, SamplingParams};
use nucleus::tokenizer::{TokenId, Tokenizer};

use crate::catalog::{self, CATALOG, DEFAULT_MODEL};
use crate::{GenerateArgs, ModelArgs, SamplingArgs};

/// A catalog name (pulled on first use), a path to a GGUF file or a Hugging Face checkpoint
/// directory; `None` is the default model.
pub(crate) fn resolve_model(spec: Option<&str>) -> Result<PathBuf> {
    let spec = spec.unwrap_or(DEFAULT_MODEL);
    if let Some(entry) = catalog::find(spec) {
        if !entry.is_present() {
            eprintln!("{} is not downloaded yet; pulling it (once).", entry.name);
            return crate::pull::pull(entry, false);
        }
        return Ok(entry.path());
    }
    let path = PathBuf::from(spec);
    // A directory is a Hugging Face checkpoint (config.json, *.safetensors, tokenizer.json).
    if path.is_file() || path.is_dir() {
        return Ok(path);
    }
    bail!("no model {spec:?}: it is neither a catalog name (see `nucleus list`), a file nor a checkpoint directory")
}

pub(crate) struct Loaded {
    pub model: Model,
    pub tokenizer: Tokenizer,
}

/// Loads the model at `path` and builds its tokenizer.
pub(crate) fn load_path(path: &std::path::Path, threads: usize) -> Result<Loaded> {
    crate::limits::threads(threads)?;
    let model =
        Model::load(path, threads).with_context(|| format!("cannot load {}", path.display()))?;
    with_tokenizer(model, path)
}

/// `model` (loaded from `path`) with the tokenizer of its vocabulary.
fn with_tokenizer(model: Model, path: &std::path::Path) -> Result<Loaded> {
    let tokenizer = Tokenizer::from_gguf(&model.file.metadata)
        .with_context(|| format!("cannot build the tokenizer of {}", path.display()))?;
    Ok(Loaded { model, tokenizer })
}

pub(crate) fn load(args: &ModelArgs, spec: Option<&str>) -> Result<Loaded> {
    let path = resolve_model(args.model.as_deref().or(spec))?;
    match &args.quantize {
        Some(ty) => load_quantized(&path, ty, args.threads),
        None => load_path(&path, args.threads),
    }
}

/// `--quantize TYPE`: the model (a checkpoint directory or a GGUF) quantized to TYPE as
/// `nucleus quantize` would write it, into an unlinked temporary file that is then mapped.
fn load_quantized(path: &std::path::Path, ty: &str, threads: usize) -> Result<Loaded> {
    use nucleus::quant::quantize::{quantize_source, Mix, QuantizeSource};
    crate::limits::threads(threads)?;
    let mix = Mix::parse(ty).map_err(|e| anyhow::anyhow!("--quantize: {e}"))?;
    // A checkpoint is read tensor by tensor from its shards, never assembled in memory.
    let source: Box<dyn QuantizeSource> = if path.is_dir() {
        Box::new(
            nucleus::hf::Checkpoint::open(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
        )
    } else {
        Box::new(GgufFile::open(path).with_context(|| format!("cannot read {}", path.display()))?)
    };
    let tmp = std::env::temp_dir().join(format!("nucleus-quantized-{}.gguf", std::process::id()));
    quantize_source(source.as_ref(), &tmp, &mix, threads, &mut |_| {})
        .with_context(|| format!("cannot quantize {} to {ty}", path.display()))?;
    drop(source);
    let file = GgufFile::open(&tmp);
    // Mapped (or failed): the file's name is no longer needed either way.
    let _ = std::fs::remove_file(&tmp);
    let file = file.with_context(|| format!("cannot read the {ty} copy of {}", path.display()))?;
    let model = Model::from_file(std::sync::Arc::new(file), threads)
        .with_context(|| format!("cannot load the {ty} copy of {}", path.display()))?;
    with_tokenizer(model, path)
}

pub(crate) fn context_size(args: &ModelArgs, model: &Model) -> Result<usize> {
    crate::limits::context(args.ctx, args.allow_long_context, model)
}

impl SamplingArgs {
    /// The request these flags describe; invalid values give one error naming the flag.
    pub(crate) fn request(
        &self,
        max_tokens: usize,
        ignore_eos: bool,
        n_vocab: usize,
    ) -> Result<GenerateRequest> {
        let sampling = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            no_repeat_ngram: self.no_repeat_ngram,
            logit_bias: self.logit_bias.clone(),
            seed: self.seed,
            stream: 0,
            logprobs: self.logprobs,
            grammar: None,
            community: self.community.params()?,
            samplers: self.community.order()?,
        };
        let req = GenerateRequest {
            sampling,
            stop: self.stop.clone(),
            max_tokens,
            ignore_eos,
            explain: self.explain,
            beams: self.beams,
            length_penalty: self.length_penalty,
            ..Default::default()
        };
        if let Err(e) = req.validate() {
            match e {
                SamplingError::InvalidParam { name, reason } => {
                    bail!("invalid --{}: {reason}", name.replace('_', "-"))
                }
                e => bail!(e),
            }
        }
        if let Some(&(id, _)) = self.logit_bias.iter().find(|b| b.0 as usize >= n_vocab) {
            bail!("invalid --logit-bias: token {id} is outside the vocabulary of {n_vocab} tokens");
        }
        if self.beams > 1 && (self.logprobs.is_some() || self.explain) {
            bail!("--logprobs and --explain describe sampling; they cannot be used with --beams");
        }
        Ok(req)
    }
}

/// `--context-policy`, or the command's default: `stream` for `chat` (a conversation goes on
/// past the window), `error` otherwise.
pub(crate) fn policy_of(args: &ModelArgs, default: ContextPolicy) -> ContextPolicy {
    args.context_policy.unwrap_or(default)
}

/// A session with room for the request's beams.
pub(crate) fn session_for<'m>(
    args: &ModelArgs,
    model: &'m Model,
    n_ctx: usize,
    req: &GenerateRequest,
    policy: ContextPolicy,
) -> Result<Session<'m>> {
    let kv_tokens = if req.beams > 1 {
        Session::kv_tokens_for_beams(n_ctx, req.beams, req.max_tokens)
    } else {
        n_ctx
    };
    let mut session = Session::with_kv_type(model, n_ctx, kv_tokens, args.kv_type)?;
    session.set_prefix_caching(!args.no_prefix_cache);
    session.set_context_policy(policy)?;
    Ok(session)
}

/// The prompt as `--context-policy` has it fit a window of `n_ctx` tokens with room for
/// `max_tokens` (at least a quarter of the window is left to answer): unchanged, truncated
/// after its first `keep` tokens (`truncate`; a note says how many were dropped), or refused.
/// `stream` takes any prompt.
pub(crate) fn fit_prompt(
    policy: ContextPolicy,
    prompt: Vec<TokenId>,
    keep: usize,
    n_ctx: usize,
    max_tokens: usize,
) -> Result<(Vec<TokenId>, usize)> {
    match policy {
        ContextPolicy::Stream => Ok((prompt, 0)),
        _ if prompt.len() < n_ctx => Ok((prompt, 0)),
        ContextPolicy::Error => bail!(
            "the prompt is {} tokens but the context window is {n_ctx}; shorten it, raise --ctx \
             or use --context-policy truncate or stream",
            prompt.len()
        ),
        ContextPolicy::Truncate => {
            let (p, dropped) = truncate_to_window(&prompt, keep, n_ctx, max_tokens);
            eprintln!("note: the prompt was truncated: {dropped} tokens dropped to fit the context window of {n_ctx}");
            Ok((p, dropped))
        }
    }
}

/// What `--explain` and `--logprobs` print to stderr for one token (nothing otherwise).
pub(crate) fn report_step(tokenizer: &Tokenizer, step: &SequenceStep, logprobs_to_stderr: bool) {
    let show = |id: TokenId| format!("{:?}", String::from_utf8_lossy(tokenizer.piece(id, false)));
    if let Some(ex) = &step.explain {
        let stages: Vec<String> = ex
            .stages
            .iter()
            .map(|(stage, n)| format!("{} {n}", stage.name()))
            .collect();
        eprintln!(
            "[explain] {:>6} {:<14} p={:.4} entropy={:.3} | {}",
            step.token,
            show(step.token),
            ex.chosen_prob,
            ex.entropy.abs(), // never print -0
            stages.join(" > ")
        );
    }
    if let (true, Some(lp)) = (logprobs_to_stderr, &step.logprob) {
        let top: Vec<String> = lp
            .top_logprobs
            .iter()
            .map(|t| format!("{} {:.3}", show(t.token), t.logprob))
            .collect();
        eprintln!(
            "[logprob] {:>6} {:<14} {:.4} | top: {}",
            lp.token,
            show(lp.token),
            lp.logprob,
            top.join(", ")
        );
    }
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let (spec, prompt) = match args.args.as_slice() {
        [prompt] => (None, prompt.clone()),
        [model, prompt] => (Some(model.as_str()), prompt.clone()),
        _ => unreachable!("clap enforces one or two arguments"),
    };
    let Loaded { model, tokenizer } = load(&args.model, spec)?;
    let req = args
        .sampling
        .request(args.max_tokens, args.ignore_eos, model.hp.n_vocab)?;
    let prompt_tokens = tokenizer.encode(&prompt, !args.no_special, true)?;
    if prompt_tokens.is_empty() {
        bail!("the prompt is empty");
    }
    let n_ctx = context_size(&args.model, &model)?;
    let policy = policy_of(&args.model, ContextPolicy::Error);
    let method = args.speculate.method(req.beams)?;
    let draft = args.speculate.load_draft(method, args.model.threads)?;
    let mut speculator = args.speculate.speculator(
        method,
        draft.as_ref(),
        &tokenizer,
        n_ctx,
        args.model.kv_type,
    )?;
    let (prompt_tokens, dropped) =
        fit_prompt(policy, prompt_tokens, SINK_TOKENS, n_ctx, req.max_tokens)?;
    let mut session = session_for(&args.model, &model, n_ctx, &req, policy)?;
    let stdout = std::io::stdout();
    let gen = session.generate_with(
        &tokenizer,
        &prompt_tokens,
        &req,
        speculator.as_mut(),
        |step| {
            report_step(&tokenizer, step, !args.json);
            if !args.json {
                let mut out = stdout.lock();
                let _ = out.write_all(step.text.as_bytes());
                let _ = out.flush();
            }
        },
    )?;
    if args.json {
        let mut v = serde_json::to_value(&gen)?;
        if policy != ContextPolicy::Error {
            v["dropped_tokens"] = (dropped + session.evicted_tokens()).into();
        }
        println!("{v}");
    } else {
        println!();
        if args.verbose {
            let t = &gen.timings;
            eprintln!(
                "prompt: {} tokens, {:.1} tok/s; generated: {} tokens, {:.1} tok/s; finish: {}",
                t.prompt_tokens,
                t.prompt_tokens_per_s,
                t.generated_tokens,
                t.generate_tokens_per_s,
                gen.finish_reason.as_str()
            );
            if let Some(s) = gen.speculation {
                eprintln!(
                    "speculation: {} proposed in {} drafts, {} accepted",
                    s.proposed, s.drafts, s.accepted
                );
            }
        }
    }
    Ok(())
}

pub fn pull(name: &str) -> Result<()> {
    let entry = catalog::find(name).with_context(|| {
        let names: Vec<&str> = CATALOG.iter().map(|m| m.name).collect();
        format!(
            "no catalog model named {name:?} (available: {})",
            names.join(", ")
        )
    })?;
    crate::pull::pull(entry, false)?;
    Ok(())
}

pub fn list() -> Result<()> {
    println!("models directory: {}", catalog::models_dir().display());
    for m in CATALOG {
        let mark = if m.is_present() { "downloaded" } else { "-" };
        let default = if m.name == DEFAULT_MODEL {
            " (default)"
        } else {
            ""
        };
        println!(
            "{:32} {:8} {:>7.1} MB  {:10}  {}{}",
            m.name,
            m.arch,
            m.size as f64 / 1e6,
            mark,
            m.description,
            default
        );
    }
    Ok(())
}

pub(crate) fn resolve_existing(spec: &str) -> Result<PathBuf> {
    if let Some(entry) = catalog::find(spec) {
        if entry.is_present() {
            return Ok(entry.path());
        }
        bail!("{spec} is not downloaded; run `nucleus pull {spec}` first");
    }
    Ok(PathBuf::from(spec))
}

pub fn tokenize(model: &str, text: &str, add_special: bool, parse_special: bool) -> Result<()> {
    let path = resolve_existing(model)?;
    // A checkpoint directory's tokenizer needs only its headers and tokenizer files read.
    let metadata = if path.is_dir() {
        nucleus::hf::Checkpoint::open(&path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .metadata
    } else {
        GgufFile::open(&path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .metadata
    };
    let tokenizer = Tokenizer::from_gguf(&metadata)?;
    let ids = tokenizer.encode(text, add_special, parse_special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

/// A deterministic pseudo-random prompt of `n` tokens (at least one: the decode measurement
/// starts from it), as llama-bench uses random tokens.
fn bench_prompt(n: usize, vocab: u64) -> Vec<TokenId> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n.max(1))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab) as TokenId
        })
        .collect()
}

/// What `bench` measures: `prompt` tokens fed at once, `gen` greedy tokens one at a time, each
/// after `depth` tokens of context.
#[derive(Clone, Copy)]
pub struct BenchSizes {
    pub prompt: usize,
    pub gen: usize,
    pub depth: usize,
}

/// The best prefill and decode speeds (tok/s) of `reps` repetitions: `n.prompt` tokens fed at
/// once, then `n.gen` greedy tokens one at a time after a one-token prompt, each measurement
/// after `n.depth` tokens of context fed untimed.
fn best_speeds(session: &mut Session, n: BenchSizes, reps: usize) -> Result<(f64, f64)> {
    let tokens = bench_prompt(n.depth + n.prompt.max(1), session.model.hp.n_vocab as u64);
    let (context, prompt) = tokens.split_at(n.depth);
    // Every repetition computes its prompt.
    session.set_prefix_caching(false);
    // Warm-up: touch every weight once.
    session.feed(&prompt[..prompt.len().min(8)], 512, false)?;
    // A fresh session holding the context (whose logits are not needed: the first generated
    // token follows a token of the prompt, as without one).
    let start = |session: &mut Session| -> Result<()> {
        session.reset();
        if !context.is_empty() {
            session.feed(context, 512, false)?;
        }
        Ok(())
    };
    let (mut best_pp, mut best_tg) = (0f64, 0f64);
    for _ in 0..reps.max(1) {
        if n.prompt > 0 {
            start(session)?;
            let t = Instant::now();
            session.feed(&prompt[..n.prompt], 512, false)?;
            best_pp = best_pp.max(n.prompt as f64 / t.elapsed().as_secs_f64());
        }
        if n.gen > 0 {
            start(session)?;
            let mut logits = session.feed(&prompt[..1], 1, false)?;
            let t = Instant::now();
            for _ in 0..n.gen {
                let tok = nucleus::engine::argmax(&logits);
                logits = session.feed(&[tok], 1, false)?;
            }
            best_tg = best_tg.max(n.gen as f64 / t.elapsed().as_secs_f64());
        }
    }
    Ok((best_pp, best_tg))
}

pub fn bench(
    args: ModelArgs,
    name: Option<String>,
    n: BenchSizes,
    reps: usize,
    json: bool,
) -> Result<()> {
    let load_start = Instant::now();
    let Loaded { model, .. } = load(&args, name.as_deref())?;
    // The load as a server's: the model packed before the first pass.
    model.finish_packing();
    let load_s = load_start.elapsed().as_secs_f64();
    let n_ctx = n
        .depth
        .checked_add(n.prompt.max(n.gen.saturating_add(1)))
        .with_context(|| format!("--depth {} is past any context", n.depth))?
        .max(16);
    let mut session = Session::with_kv_type(&model, n_ctx, n_ctx, args.kv_type)?;
    let (best_pp, best_tg) = best_speeds(&mut session, n, reps)?;
    // A token of context costs its K and V in the layers that keep the whole context; the
    // sliding-window layers hold only their window, whatever the length.
    let kv_cfg = *session.kv.config();
    let kv_bytes = kv_cfg.full_bytes_per_token();
    let window_bytes = kv_cfg
        .sliding
        .map_or(0, |s| s.window * kv_cfg.window_bytes_per_token());
    let huge_gb = nucleus::model::resident_huge_bytes().map(|b| b as f64 / 1e9);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "model": model.hp.arch.name(),
                "threads": model.n_threads(),
                "prompt_tokens": n.prompt,
                "gen_tokens": n.gen,
                "depth": n.depth,
                "prefill_tokens_per_s": best_pp,
                "decode_tokens_per_s": best_tg,
                "kv_bytes_per_token": kv_bytes,
                "kv_window_bytes": window_bytes,
                "kv_type": args.kv_type.name(),
                "load_s": load_s,
                "kernels": nucleus::quant::simd_level().name(),
                "arithmetic": model.arithmetic().name(),
                "amx": nucleus::quant::amx_status(),
                "huge_pages_gb": huge_gb,
            })
        );
    } else {
        println!(
            "model: {} ({} threads), loaded in {load_s:.2} s",
            model.hp.arch.name(),
            model.n_threads()
        );
        println!(
            "kernels: {} ({} arithmetic); AMX: {}",
            nucleus::quant::simd_level().name(),
            model.arithmetic().name(),
            nucleus::quant::amx_status()
        );
        if let Some(gb) = huge_gb.filter(|&gb| gb > 0.0) {
            println!("memory in huge pages: {gb:.2} GB");
        }
        let at = if n.depth > 0 {
            format!(" @ d{}", n.depth)
        } else {
            String::new()
        };
        println!("prefill pp{}{at}: {best_pp:.1} tok/s", n.prompt);
        println!("decode  tg{}{at}: {best_tg:.1} tok/s", n.gen);
        match kv_cfg.sliding {
            Some(s) => println!(
                "KV cache: {kv_bytes} bytes/token in the global layers + {window_bytes} bytes for the window of {} in the sliding-window layers ({})",
                s.window, args.kv_type
            ),
            None => println!("KV cache: {kv_bytes} bytes/token ({})", args.kv_type),
        }
    }
    Ok(())
}
