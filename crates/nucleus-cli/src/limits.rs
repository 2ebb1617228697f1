//! Bounds on the command line's sizes, checked before anything is loaded or allocated, each
//! with an error naming the flag.

use anyhow::{bail, Result};
use nucleus::model::{Model, MAX_CONTEXT};

/// `--threads` at most (0 = every core).
pub const MAX_THREADS: usize = 512;
/// `serve --max-running` at most.
pub const MAX_RUNNING: usize = 1024;
/// `serve --queue` at most.
pub const MAX_QUEUE: usize = 65_536;
/// `serve --block-size` at most.
pub const MAX_BLOCK_SIZE: usize = 256;
/// `serve --step-tokens` at most.
pub const MAX_STEP_TOKENS: usize = 65_536;
/// `serve --max-body-bytes` bounds.
pub const MIN_BODY_BYTES: usize = 1 << 10;
pub const MAX_BODY_BYTES: usize = 1 << 30;

/// `value` within `lo..=hi`, or an error naming `--flag`.
pub fn in_range(flag: &str, value: usize, lo: usize, hi: usize) -> Result<usize> {
    if value < lo || value > hi {
        bail!("--{flag} {value} is out of range: it must be between {lo} and {hi}");
    }
    Ok(value)
}

pub fn threads(n: usize) -> Result<usize> {
    if n > MAX_THREADS {
        bail!("--threads {n} is out of range: at most {MAX_THREADS} (0 = every core)");
    }
    Ok(n)
}

/// The context window: `--ctx`, or the model's training context capped at 4096. Above the
/// training context only with `allow_long` (`--allow-long-context`).
pub fn context(ctx: Option<usize>, allow_long: bool, model: &Model) -> Result<usize> {
    let trained = model.hp.n_ctx_train;
    let Some(n) = ctx else {
        return Ok(trained.clamp(2, 4096));
    };
    if n < 2 {
        bail!("--ctx {n} is too small: at least 2 tokens");
    }
    if n > MAX_CONTEXT {
        bail!("--ctx {n} is out of range: nucleus supports at most {MAX_CONTEXT} tokens");
    }
    if n > trained && !allow_long {
        bail!(
            "--ctx {n} is above the model's training context ({trained} tokens): positions \
             beyond it were never trained and the output degrades; pass --allow-long-context \
             to use it anyway"
        );
    }
    Ok(n)
}
