//! What `explain` reports of one sampling step: the stages of the chain and the candidates
//! left after each.

/// A stage of the chain, as named in [`Explain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The finite logits as given.
    Input,
    /// After the grammar's mask.
    Grammar,
    /// After logit bias, penalties and the n-gram ban (which can only mask tokens).
    Penalties,
    /// Temperature 0: the argmax, a set of one.
    Greedy,
    Temperature,
    TopK,
    TopP,
    MinP,
    TypicalP,
    /// DRY's penalties (which only lower logits): the tokens it penalised.
    Dry,
    TopNSigma,
    Xtc,
    /// Dynamic temperature, applied after the truncations and XTC (as in llama.cpp).
    DynaTemp,
    /// Mirostat's truncation (in place of top-k to XTC).
    Mirostat,
    /// llama.cpp's infill sampler.
    Infill,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Input => "input",
            Stage::Grammar => "grammar",
            Stage::Penalties => "penalties",
            Stage::Greedy => "greedy",
            Stage::Temperature => "temperature",
            Stage::TopK => "top_k",
            Stage::TopP => "top_p",
            Stage::MinP => "min_p",
            Stage::TypicalP => "typical_p",
            Stage::Dry => "dry",
            Stage::TopNSigma => "top_n_sigma",
            Stage::Xtc => "xtc",
            Stage::DynaTemp => "dynatemp",
            Stage::Mirostat => "mirostat",
            Stage::Infill => "infill",
        }
    }
}

/// Why a token was picked: see [`super::Sampler::set_explain`].
#[derive(Clone, Debug, PartialEq)]
pub struct Explain {
    /// Size of the candidate set after each stage, in chain order.
    pub stages: Vec<(Stage, usize)>,
    /// Entropy (nats) of the final distribution the token was drawn from (0 for greedy).
    pub entropy: f32,
    /// Probability of the chosen token in that final distribution (1 for greedy).
    pub chosen_prob: f32,
}
