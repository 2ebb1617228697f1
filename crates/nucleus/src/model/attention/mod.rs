//! Attention of query heads over a sequence's paged KV cache, with an online softmax: the
//! scores of one block at a time, rescaling the running sum and output when the maximum grows,
//! so no n×n score matrix is ever built. Two arithmetics, both llama.cpp's:
//!
//! - [`one_query`]: its flash-attention decode path (f16 query and accumulator, keys one at a
//!   time), for every token over a quantized cache, and in `--exact` for every generated token
//!   and a prompt's tokens in micro-batches under [`TILED_MIN_BATCH`];
//! - [`tiled`]: its tiled flash attention (f32, keys in tiles of 64), in `--exact` for a
//!   prompt's tokens in micro-batches of [`TILED_MIN_BATCH`] or more, and in nucleus's own
//!   arithmetic for every token over an f16 cache (a query's bits never depend on its company,
//!   so one query or many, prompt or generated, are computed alike).
//!
//! Here: which keys a query sees, and how a score is scaled (and soft-capped).

mod dispatch;
mod one_query;
mod tiled;

#[cfg(test)]
mod tests;

pub use dispatch::arithmetic_class;
pub use one_query::attend_heads;
pub use tiled::{attend_tiled, TILED_MIN_BATCH};

/// The keys a query at position `pos` may see: `[start, pos]`, causal, limited to the last
/// `window` positions when the layer has a sliding window.
pub fn visible_range(pos: usize, window: Option<usize>) -> (usize, usize) {
    let start = match window {
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    };
    (start, pos + 1)
}

/// An attention sink (gpt-oss): a learned logit per head that joins each query's softmax as one
/// more score with no value, so that a query may attend to nothing. Applied as llama.cpp's
/// flash attention applies it, after the keys, to the query's running maximum `max`, sum and
/// f32 accumulator: when the sink is above the maximum, the accumulator and the sum are scaled
/// by e^(max − sink) and the sink adds 1; otherwise it adds e^(sink − max). Returns the new sum
/// (`S = S·ms + vs`, one FMA as GCC contracts it).
pub(super) fn apply_sink(sink: f32, max: f32, sum: f32, acc: &mut [f32]) -> f32 {
    if sink > max {
        let ms = (max - sink).exp();
        acc.iter_mut().for_each(|a| *a *= ms);
        sum.mul_add(ms, 1.0)
    } else {
        sum.mul_add(1.0, (sink - max).exp())
    }
}

/// How a raw q·k becomes an attention score: times the scale, then, with a soft cap (Gemma 2),
/// `cap · tanh(·)`, as llama.cpp's flash attention does it (it divides the scale by the cap
/// first, so the tanh sees `q·k · (scale / cap)`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreScale {
    scale: f32,
    /// 0 for none.
    softcap: f32,
}

impl ScoreScale {
    pub fn new(scale: f32, softcap: Option<f32>) -> ScoreScale {
        match softcap {
            Some(cap) => ScoreScale {
                scale: scale / cap,
                softcap: cap,
            },
            None => ScoreScale {
                scale,
                softcap: 0.0,
            },
        }
    }

    /// The factor [`score`](Self::score) multiplies by when there is no soft cap (so that a
    /// loop need not test for one at every score).
    #[inline]
    pub fn plain_factor(self) -> Option<f32> {
        (self.softcap == 0.0).then_some(self.scale)
    }

    #[inline]
    pub fn score(self, dot: f32) -> f32 {
        let s = dot * self.scale;
        if self.softcap != 0.0 {
            self.softcap * s.tanh()
        } else {
            s
        }
    }
}

impl From<f32> for ScoreScale {
    fn from(scale: f32) -> ScoreScale {
        ScoreScale::new(scale, None)
    }
}
