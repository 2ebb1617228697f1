//! Token texts llama.cpp recognises by name: ends of generation, end of turn, fill-in-the-middle;
//! and its per-model attribute fix-ups, keyed by the model's name.

use super::{attr, Tokenizer};
use crate::gguf::Metadata;

/// Token texts llama.cpp treats as end of generation (`special_eog_ids`).
pub(super) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
];

/// Texts llama.cpp looks for when `tokenizer.ggml.eot_token_id` is absent.
pub(super) const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// FIM pad / repo / file-separator tokens: llama.cpp makes them control tokens and EOG.
pub(super) const FIM_EOG_TEXTS: &[&[&str]] = &[
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];

/// Other FIM tokens: llama.cpp only marks them as control tokens.
pub(super) const FIM_OTHER_TEXTS: &[&[&str]] = &[
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
];

impl Tokenizer {
    /// llama.cpp's per-model attribute fix-ups (left/right whitespace stripping around special
    /// tokens), keyed by `general.name` and the pre-tokenizer.
    pub(super) fn apply_name_attrs(&mut self, meta: &Metadata) {
        let name = meta
            .get_str("general.name")
            .unwrap_or("")
            .to_ascii_lowercase();
        let arch = meta.get_str("general.architecture").unwrap_or("");
        let set = |tok: &mut Tokenizer, text: &str, flag: u32, on: bool| {
            if let Some(&id) = tok.token_to_id.get(text) {
                if on {
                    tok.attrs[id as usize] |= flag;
                } else {
                    tok.attrs[id as usize] &= !flag;
                }
            }
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| self.pre.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|p| arch.contains(p))
        {
            set(self, "<mask>", attr::LSTRIP, true);
        } else if name.contains("phi-3") || name.contains("phi3") {
            for i in 0..self.special_tokens.len() {
                let id = self.special_tokens[i];
                self.attrs[id as usize] |= attr::RSTRIP;
            }
            set(self, "</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(self, t, attr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            set(self, "[MASK]", attr::LSTRIP, true);
        }
    }
}
