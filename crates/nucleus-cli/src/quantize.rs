//! `nucleus quantize IN OUT TYPE`: llama-quantize's file types with its per-tensor rules, and
//! the same output bytes (no importance matrix).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nucleus::quant::quantize::{quantize_file, quantize_source, Mix};

#[derive(Args, Clone, Debug)]
pub struct QuantizeArgs {
    /// The GGUF to read (F32, F16 or BF16, or any type nucleus reads, dequantized first), or a
    /// downloaded catalog name.
    pub input: String,
    /// The GGUF to write (replaced only once it is complete).
    pub output: PathBuf,
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S, Q3_K_M (= Q3_K), Q3_K_L, Q4_K_S,
    /// Q4_K_M (= Q4_K), Q5_K_S, Q5_K_M (= Q5_K), Q6_K, IQ4_NL, IQ4_XS, MXFP4_MOE (experts MXFP4, other matrices Q8_0), F16, BF16 or F32.
    #[arg(value_name = "TYPE")]
    pub mix: String,
    /// Threads converting rows (0 = all cores).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
}

pub fn quantize(args: QuantizeArgs) -> Result<()> {
    crate::limits::threads(args.threads)?;
    let mix = Mix::parse(&args.mix).map_err(anyhow::Error::msg)?;
    let input = crate::commands::resolve_existing(&args.input)?;
    // A Hugging Face checkpoint directory is quantized from the GGUF it is presented as, read
    // tensor by tensor from its shards.
    let checkpoint = if input.is_dir() {
        let c = nucleus::hf::Checkpoint::open(&input)
            .with_context(|| format!("cannot read {}", input.display()))?;
        // A file llama.cpp would tokenize differently is not written.
        c.check_llama_cpp_vocab()
            .with_context(|| format!("cannot convert {}", input.display()))?;
        Some(c)
    } else if !input.is_file() {
        bail!("no file {}", input.display());
    } else {
        None
    };
    // Hidden when stderr is not a terminal.
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{msg:48} [{bar:30}] {pos}/{len} tensors {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let mut show = |p: nucleus::quant::quantize::QuantizeProgress| {
        bar.set_length(p.total as u64);
        bar.set_position(p.index as u64);
        bar.set_message(format!("{} {} -> {}", p.name, p.from, p.to));
    };
    let summary = match &checkpoint {
        Some(c) => quantize_source(c, &args.output, &mix, args.threads, &mut show),
        None => quantize_file(&input, &args.output, &mix, args.threads, &mut show),
    }
    .with_context(|| format!("cannot quantize {}", input.display()))?;
    bar.finish_and_clear();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for (_, ty) in &summary.tensors {
        match counts.iter_mut().find(|(name, _)| name == ty.name()) {
            Some((_, n)) => *n += 1,
            None => counts.push((ty.name().to_string(), 1)),
        }
    }
    let counts: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "wrote {} ({}): {} tensors ({}), {:.2} MiB -> {:.2} MiB{}",
        args.output.display(),
        mix.name,
        summary.tensors.len(),
        counts.join(", "),
        mib(summary.input_bytes),
        mib(summary.output_bytes),
        match summary.fallbacks {
            0 => String::new(),
            n => format!("; {n} tensor(s) fell back to another type (row length)"),
        }
    );
    Ok(())
}
