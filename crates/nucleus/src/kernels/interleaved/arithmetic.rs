//! Which arithmetic the products compute: nucleus's own or llama.cpp's, and the float chain
//! a packed product follows where its type has more than one.

/// Which arithmetic the matrix products use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Arithmetic {
    /// nucleus's own: repacked Q8_0/Q5_0/Q4_0/IQ4_NL/Q3_K–Q6_K/IQ4_XS weights, one float chain per
    /// output (Q4_K: llama.cpp's repacked gemm's), and every row of every other type in the arithmetic
    /// of the one-row kernels, so that a token's results never depend on its place in a prompt
    /// or a batch.
    #[default]
    Fast,
    /// llama.cpp's, bit for bit (its batched kernels for a prompt's rows, chosen by the row's
    /// place in its prompt).
    Exact,
}

impl Arithmetic {
    /// `fast` or `exact`, as `nucleus bench` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Arithmetic::Fast => "fast",
            Arithmetic::Exact => "exact",
        }
    }

    /// `Exact` when the environment variable `NUCLEUS_EXACT` is set to anything but `0` or the
    /// empty string, otherwise `Fast`.
    pub fn from_env() -> Arithmetic {
        match std::env::var("NUCLEUS_EXACT") {
            Ok(v) if !v.is_empty() && v != "0" => Arithmetic::Exact,
            _ => Arithmetic::Fast,
        }
    }
}

/// Which float chain a packed product follows, where its type has more than one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Chain {
    /// The one every type has: the one-row kernels' (for Q4_K, llama.cpp's repacked gemv:
    /// one FMA per super-block, `--exact`'s for generated tokens).
    #[default]
    Default,
    /// Q4_K only: llama.cpp's repacked gemm, one FMA per pair of sub-blocks, which `--exact`
    /// takes for a prompt's rows in whole groups of four and nucleus's own arithmetic for
    /// every token.
    Q4kPairs,
    /// Q8_0 only: llama.cpp's one kernel for it (`ggml_vec_dot_q8_0_q8_0`, every row),
    /// eight lanes per block summed at the end ([`q8_lanes`](super::q8_lanes)): `--exact`'s. (The other
    /// chains keep one sum per block.)
    Q8Lanes,
}

impl Chain {
    /// The chain of nucleus's own arithmetic in this process, for every Q4_K product, prompt
    /// or generated token alike (so a token's outputs keep their bits whichever kernel runs
    /// it). Where a prompt's products run on AMX tiles (or on their emulation), the one-row
    /// kernels' one FMA per super-block: the tiles then fold their sums once per super-block
    /// instead of once per pair of sub-blocks, and llama.cpp's own build on such a CPU (its
    /// AMX kernels, one float step per super-block) is farther from `--exact` than this chain
    /// is (docs/src/arithmetic.md). Elsewhere llama.cpp's repacked gemm's pairs, `--exact`'s
    /// for a prompt's rows, since there llama.cpp's builds agree on them.
    pub fn fast() -> Chain {
        if tiles_run() {
            Chain::Default
        } else {
            Chain::Q4kPairs
        }
    }
}

/// Whether this process runs a prompt's products on AMX tiles, on the hardware or emulated.
fn tiles_run() -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::amx::tiles_run();
    #[cfg(not(target_arch = "x86_64"))]
    false
}
