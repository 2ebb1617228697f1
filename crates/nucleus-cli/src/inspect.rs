//! `nucleus inspect`: a GGUF file's (or a checkpoint's) metadata and tensor table, and with
//! `--memory` the model's memory plan.

use anyhow::{bail, Context, Result};
use nucleus::gguf::GgufFile;
use nucleus::kv_cache::KvType;
use nucleus::model::Model;

use crate::commands::resolve_existing;

pub fn inspect(path: &str, all: bool) -> Result<()> {
    let path = resolve_existing(path)?;
    // A checkpoint directory shows the GGUF it is converted to.
    let file = if path.is_dir() {
        nucleus::hf::Checkpoint::open(&path)
            .and_then(|c| c.to_gguf())
            .with_context(|| format!("cannot read {}", path.display()))?
    } else {
        GgufFile::open(&path).with_context(|| format!("cannot read {}", path.display()))?
    };
    println!(
        "{}: GGUF v{}, {} bytes, alignment {}",
        path.display(),
        file.version,
        file.file_size(),
        file.alignment
    );
    println!("\nmetadata ({} keys):", file.metadata.len());
    for (k, v) in file.metadata.iter() {
        println!("  {k:45} {}", v.display_short(100));
    }
    let params: u64 = file.tensors.iter().map(|t| t.n_elements()).sum();
    let bytes: usize = file.tensors.iter().map(|t| t.size).sum();
    println!(
        "\ntensors ({}, {:.1} M parameters, {:.1} MB, {:.2} bits/weight):",
        file.tensors.len(),
        params as f64 / 1e6,
        bytes as f64 / 1e6,
        bytes as f64 * 8.0 / params.max(1) as f64
    );
    let shown = if all {
        file.tensors.len()
    } else {
        40.min(file.tensors.len())
    };
    for t in &file.tensors[..shown] {
        println!(
            "  {:40} {:6} {:>24} {:>12}",
            t.name,
            t.ty.name(),
            format!("{:?}", t.dims),
            t.size
        );
    }
    if shown < file.tensors.len() {
        println!(
            "  … {} more (--all shows every tensor)",
            file.tensors.len() - shown
        );
    }
    Ok(())
}

/// `nucleus inspect MODEL --memory`: the model's memory plan (see `nucleus::model::MemoryPlan`).
pub fn inspect_memory(spec: &str, ctx: Option<usize>, kv_type: KvType) -> Result<()> {
    let path = resolve_existing(spec)?;
    let model = Model::load(&path, 1).with_context(|| format!("cannot load {}", path.display()))?;
    let n_ctx = ctx.unwrap_or(model.hp.n_ctx_train.min(4096));
    if n_ctx == 0 {
        bail!("--ctx must be at least 1");
    }
    let plan = model.memory_plan(n_ctx, kv_type, nucleus::engine::BLOCK_SIZE, 512);
    plan.kv.check().map_err(anyhow::Error::msg)?;
    let hp = &model.hp;
    println!(
        "{}: context {n_ctx} tokens, {} KV cache in blocks of {} tokens",
        path.display(),
        kv_type,
        plan.kv.block_size
    );
    println!(
        "  weights               {:>10}  (memory-mapped from the file)",
        mb(plan.weights_bytes)
    );
    if let Some(moe) = hp.moe {
        print_experts(&model, moe, plan.weights_bytes);
    }
    println!(
        "  KV per token          {:>10}  bytes: {} layers × {} KV heads × (key {} + value {} values) in {kv_type}",
        plan.kv.bytes_per_token(),
        hp.n_layers,
        hp.n_head_kv,
        hp.head_dim,
        hp.head_dim_v
    );
    println!(
        "    global layers       {:>10}  bytes/token ({} layers)",
        plan.global_bytes_per_token, plan.global_layers
    );
    match plan.window {
        Some(w) => println!(
            "    local layers        {:>10}  bytes/token ({} layers, window {w}: held for the window only)",
            plan.local_bytes_per_token, plan.local_layers
        ),
        None => println!("    local layers              none"),
    }
    print_pools(&plan, n_ctx);
    Ok(())
}

/// Bytes in kB below a megabyte, else in MB.
fn mb(b: usize) -> String {
    match b {
        0..1_000_000 => format!("{:.1} kB", b as f64 / 1e3),
        _ => format!("{:.1} MB", b as f64 / 1e6),
    }
}

/// The experts' share of the weights, and what a token reads of them.
fn print_experts(model: &Model, moe: nucleus::model::MoeParams, weights_bytes: usize) {
    let experts: usize = model
        .file
        .tensors
        .iter()
        .filter(|t| t.name.contains("_exps."))
        .map(|t| t.size)
        .sum();
    let active = weights_bytes - experts + experts / moe.n_expert * moe.n_expert_used;
    println!(
        "    experts             {:>10}  ({} per layer, {} used per token: a token reads {} of the weights)",
        mb(experts),
        moe.n_expert,
        moe.n_expert_used,
        mb(active)
    );
}

/// The KV pools, the bookkeeping, the scratch, the total and what the machine has free.
fn print_pools(plan: &nucleus::model::MemoryPlan, n_ctx: usize) {
    println!(
        "  KV pool               {:>10}  ({} blocks: {} tokens rounded up to whole blocks, global layers)",
        mb(plan.kv_pool_bytes - plan.window_pool_bytes),
        plan.kv.n_blocks,
        n_ctx
    );
    if plan.window_pool_blocks > 0 {
        println!(
            "  KV window pool        {:>10}  ({} blocks: the window, the attention sink and a chunk, local layers)",
            mb(plan.window_pool_bytes),
            plan.window_pool_blocks,
        );
        println!(
            "    (local layers keeping the whole context would take {} more)",
            mb(
                (plan.local_bytes_per_token * plan.kv.block_size * plan.kv.n_blocks)
                    .saturating_sub(plan.window_pool_bytes)
            )
        );
    }
    println!(
        "  pool overhead         {:>10}  at most (reference counts, free list, prefix-cache index)",
        mb(plan.bookkeeping_bytes)
    );
    println!(
        "  forward scratch       {:>10}  (a prompt chunk of {} tokens)",
        mb(plan.scratch_bytes),
        plan.chunk_tokens
    );
    println!(
        "  total of the above    {:>10}  (the process also holds the tokenizer's tables and the runtime)",
        mb(plan.total_bytes())
    );
    if let Some(avail) = nucleus::model::available_memory() {
        println!(
            "  available now         {:>10}  (MemAvailable, or the cgroup's limit; `run`, `chat` and `serve` refuse a KV cache and scratch beyond it: {})",
            mb(avail as usize),
            if plan.check_available().is_ok() { "fits" } else { "does NOT fit" }
        );
    }
}
