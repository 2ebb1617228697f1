//! The order of the sampler chain's stages, as llama.cpp names and orders them
//! (`common/common.h`'s `samplers` default; `common/sampling.cpp` builds the chain from it):
//! penalties, DRY, top-n-σ, top-k, typical-p, top-p, min-p, XTC, temperature (dynamic
//! temperature when `dynatemp_range > 0`), then the draw. A request may give its own order
//! (llama-server's `samplers`, a list of names or a string of letters; the CLI's
//! `--samplers "top_k;top_p;..."`): a stage left out is not applied, as in llama.cpp.
//!
//! Logit bias, the grammar and the n-gram ban are not part of the list (llama.cpp applies bias
//! and grammar outside it too). Nucleus applies penalties and DRY to the logits before the
//! truncations work on their list of candidates, so an order that puts them after another
//! stage is refused rather than run in another order than asked.

use serde::{Deserialize, Serialize};

/// A stage that `samplers` can place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChainStage {
    Penalties,
    Dry,
    TopNSigma,
    TopK,
    #[serde(rename = "typ_p")]
    TypicalP,
    TopP,
    MinP,
    Xtc,
    Temperature,
    /// llama.cpp's infill sampler (see [`super::infill`]); not in the default order.
    Infill,
}

use ChainStage::*;

/// Every stage, for names and letters.
const ALL: [ChainStage; 10] = [
    Penalties,
    Dry,
    TopNSigma,
    TopK,
    TypicalP,
    TopP,
    MinP,
    Xtc,
    Temperature,
    Infill,
];

/// llama.cpp's default order.
pub const LLAMA_CPP_ORDER: [ChainStage; 9] = [
    Penalties,
    Dry,
    TopNSigma,
    TopK,
    TypicalP,
    TopP,
    MinP,
    Xtc,
    Temperature,
];

impl ChainStage {
    /// llama.cpp's canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Penalties => "penalties",
            Dry => "dry",
            TopNSigma => "top_n_sigma",
            TopK => "top_k",
            TypicalP => "typ_p",
            TopP => "top_p",
            MinP => "min_p",
            Xtc => "xtc",
            Temperature => "temperature",
            Infill => "infill",
        }
    }

    /// llama.cpp's letter (`--sampling-seq`, a `samplers` string).
    fn letter(self) -> char {
        match self {
            Penalties => 'e',
            Dry => 'd',
            TopNSigma => 's',
            TopK => 'k',
            TypicalP => 'y',
            TopP => 'p',
            MinP => 'm',
            Xtc => 'x',
            Temperature => 't',
            Infill => 'i',
        }
    }

    /// A name as llama.cpp reads it: canonical, kebab-case (`top-k`), without the underscore
    /// (`topk`), or an alias (`nucleus`, `temp`, `typ`, and `typical_p` here); any case.
    pub fn from_name(name: &str) -> Result<ChainStage, String> {
        let n = name.to_ascii_lowercase().replace('-', "_");
        let found = ALL
            .into_iter()
            .find(|s| n == s.name() || n == s.name().replace('_', ""));
        match (found, n.as_str()) {
            (Some(s), _) => Ok(s),
            (None, "nucleus") => Ok(TopP),
            (None, "temp") => Ok(Temperature),
            (None, "typ" | "typical_p" | "typical") => Ok(TypicalP),
            (None, "adaptive_p") => Err("sampler \"adaptive_p\" is not implemented".into()),
            (None, _) => Err(format!(
                "unknown sampler {name:?}; the samplers are {}",
                ALL.map(|s| s.name()).join(", ")
            )),
        }
    }
}

/// Names (`["top_k", "top_p"]`) to an order, checked.
pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Vec<ChainStage>, String> {
    let order = names
        .iter()
        .map(|n| ChainStage::from_name(n.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    check(&order)?;
    Ok(order)
}

/// llama.cpp's letters (`"kpt"`, or `"edskypmxt"` for the default) to an order, checked.
pub fn from_letters(letters: &str) -> Result<Vec<ChainStage>, String> {
    let order = letters
        .chars()
        .map(|ch| {
            ALL.into_iter()
                .find(|s| s.letter() == ch)
                .ok_or_else(|| match ch {
                    'a' => ChainStage::from_name("adaptive_p").unwrap_err(),
                    _ => format!(
                        "unknown sampler letter {ch:?}; the letters are {}",
                        ALL.map(|s| s.letter().to_string()).join("")
                    ),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    check(&order)?;
    Ok(order)
}

/// The CLI's form: names separated by `;` (llama.cpp's `--samplers`), or `,`.
pub fn parse_list(list: &str) -> Result<Vec<ChainStage>, String> {
    let names: Vec<&str> = list
        .split([';', ','])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    from_names(&names)
}

/// Each stage at most once; penalties and DRY before the other stages.
pub fn check(order: &[ChainStage]) -> Result<(), String> {
    for (i, s) in order.iter().enumerate() {
        if order[..i].contains(s) {
            return Err(format!("sampler {:?} is named twice", s.name()));
        }
        if matches!(s, Penalties | Dry) {
            if let Some(before) = order[..i].iter().find(|p| !matches!(p, Penalties | Dry)) {
                return Err(format!(
                    "sampler {:?} must come before {:?}: nucleus applies penalties and DRY to \
                     the logits before the other stages",
                    s.name(),
                    before.name()
                ));
            }
        }
    }
    Ok(())
}

/// `top_k;top_p;temperature`.
pub fn display(order: &[ChainStage]) -> String {
    order.iter().map(|s| s.name()).collect::<Vec<_>>().join(";")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_names_letters_and_aliases() {
        let default =
            parse_list("penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature")
                .unwrap();
        assert_eq!(default, LLAMA_CPP_ORDER);
        assert_eq!(from_letters("edskypmxt").unwrap(), LLAMA_CPP_ORDER);
        assert_eq!(
            from_names(&["Top-K", "nucleus", "minp", "temp", "typ"]).unwrap(),
            vec![TopK, TopP, MinP, Temperature, TypicalP]
        );
        assert_eq!(display(&[TopK, Temperature]), "top_k;temperature");
    }

    #[test]
    fn bad_orders_are_named() {
        let e = from_names(&["top_k", "top_q"]).unwrap_err();
        assert!(e.contains("\"top_q\"") && e.contains("top_n_sigma"), "{e}");
        let e = from_names(&["top_k", "top_p", "adaptive_p"]).unwrap_err();
        assert!(
            e.contains("\"adaptive_p\"") && e.contains("not implemented"),
            "{e}"
        );
        assert_eq!(from_letters("kpi").unwrap(), vec![TopK, TopP, Infill]);
        let e = from_letters("kpz").unwrap_err();
        assert!(e.contains("'z'"), "{e}");
        let e = from_names(&["top_k", "penalties"]).unwrap_err();
        assert!(
            e.contains("\"penalties\" must come before \"top_k\""),
            "{e}"
        );
        let e = from_names(&["top_k", "top_k"]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        assert_eq!(from_names::<&str>(&[]).unwrap(), vec![]);
    }
}
