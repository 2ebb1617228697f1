//! What llama-quantize calls file types: a name (`Q4_K_M`), the `general.file_type` number it
//! writes, and the default tensor type that its per-tensor rules (`rules.rs`) start from.

use crate::quant::GgmlType;

/// One output file type ("mix") of `nucleus quantize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    /// llama-quantize's name for it.
    pub name: &'static str,
    /// llama.cpp's `llama_ftype`, written to `general.file_type`.
    pub ftype: u32,
    /// The type of every quantizable tensor before the per-tensor rules.
    pub default_type: GgmlType,
}

macro_rules! mix {
    ($name:literal, $ftype:literal, $ty:ident) => {
        Mix {
            name: $name,
            ftype: $ftype,
            default_type: GgmlType::$ty,
        }
    };
}

/// The mixes nucleus can write, numbered as `llama_ftype`. Q2_K_S (which needs an importance
/// matrix) and the IQ1/IQ2/IQ3/TQ mixes are not among them.
pub const MIXES: &[Mix] = &[
    mix!("F32", 0, F32),
    mix!("F16", 1, F16),
    mix!("BF16", 32, BF16),
    mix!("Q4_0", 2, Q4_0),
    mix!("Q4_1", 3, Q4_1),
    mix!("Q5_0", 8, Q5_0),
    mix!("Q5_1", 9, Q5_1),
    mix!("Q8_0", 7, Q8_0),
    mix!("Q2_K", 10, Q2_K),
    mix!("Q3_K_S", 11, Q3_K),
    mix!("Q3_K_M", 12, Q3_K),
    mix!("Q3_K_L", 13, Q3_K),
    mix!("Q4_K_S", 14, Q4_K),
    mix!("Q4_K_M", 15, Q4_K),
    mix!("Q5_K_S", 16, Q5_K),
    mix!("Q5_K_M", 17, Q5_K),
    mix!("Q6_K", 18, Q6_K),
    mix!("IQ4_NL", 25, IQ4_NL),
    mix!("IQ4_XS", 30, IQ4_XS),
    mix!("MXFP4_MOE", 38, MXFP4),
];

/// llama-quantize's aliases: a bare K type names its `_M` mix.
const ALIASES: &[(&str, &str)] = &[("Q3_K", "Q3_K_M"), ("Q4_K", "Q4_K_M"), ("Q5_K", "Q5_K_M")];

impl Mix {
    /// Looks a mix up by name, ignoring case (`q4_k_m`, `Q4_K`); an unknown name is an error
    /// that lists the known ones.
    pub fn parse(name: &str) -> Result<Mix, String> {
        let upper = name.to_ascii_uppercase();
        let canonical = ALIASES
            .iter()
            .find(|(alias, _)| *alias == upper)
            .map_or(upper.as_str(), |(_, to)| to);
        MIXES
            .iter()
            .find(|m| m.name == canonical)
            .copied()
            .ok_or_else(|| {
                let known: Vec<&str> = MIXES.iter().map(|m| m.name).collect();
                let aliases: Vec<String> = ALIASES
                    .iter()
                    .map(|(a, to)| format!("{a} (= {to})"))
                    .collect();
                format!(
                    "unknown quantization type {name:?}: known types are {}, {}",
                    known.join(", "),
                    aliases.join(", ")
                )
            })
    }

    /// Whether the default type is a block-quantized one (the per-tensor rules and the row
    /// length fallbacks apply only then).
    pub fn is_quantized(&self) -> bool {
        !matches!(
            self.default_type,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_aliases_and_case() {
        assert_eq!(Mix::parse("q4_k_m").unwrap().ftype, 15);
        assert_eq!(Mix::parse("Q4_K").unwrap().name, "Q4_K_M");
        assert_eq!(Mix::parse("Q3_K").unwrap().name, "Q3_K_M");
        assert_eq!(Mix::parse("iq4_nl").unwrap().default_type, GgmlType::IQ4_NL);
        let err = Mix::parse("Q7_K").unwrap_err();
        assert!(err.contains("\"Q7_K\"") && err.contains("Q4_K_M") && err.contains("IQ4_NL"));
    }
}
