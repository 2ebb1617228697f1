//! Token texts llama.cpp recognises by name: ends of generation, end of turn, fill-in-the-middle;
//! and its per-model attribute fix-ups, keyed by the model's name.

use super::{attr, TokenId, Tokenizer};
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

/// Fill-in-the-middle tokens, as llama.cpp's vocabulary loads them: from the GGUF's
/// `tokenizer.ggml.fim_*_token_id` keys, else found by their text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FimTokens {
    /// Before the prefix (`<|fim_prefix|>`).
    pub pre: Option<TokenId>,
    /// Before the suffix (`<|fim_suffix|>`).
    pub suf: Option<TokenId>,
    /// Before the middle, where generation starts (`<|fim_middle|>`).
    pub mid: Option<TokenId>,
    pub pad: Option<TokenId>,
    /// Repository name (`<|repo_name|>`).
    pub rep: Option<TokenId>,
    /// File separator (`<|file_sep|>`).
    pub sep: Option<TokenId>,
}

/// One FIM token: its GGUF key, the deprecated key (read after it, as llama.cpp does) and the
/// texts llama.cpp looks for when both are absent.
type FimKey = (&'static str, Option<&'static str>, &'static [&'static str]);

/// pre, suf, mid, pad, rep, sep.
const FIM_KEYS: [FimKey; 6] = [
    (
        "tokenizer.ggml.fim_pre_token_id",
        Some("tokenizer.ggml.prefix_token_id"),
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
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        Some("tokenizer.ggml.suffix_token_id"),
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
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        Some("tokenizer.ggml.middle_token_id"),
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
    ),
    (
        "tokenizer.ggml.fim_pad_token_id",
        None,
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        "tokenizer.ggml.fim_rep_token_id",
        None,
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    ("tokenizer.ggml.fim_sep_token_id", None, &["<|file_sep|>"]),
];

impl FimTokens {
    /// Reads the keys (an id outside the `n`-token vocabulary is ignored, as llama.cpp does),
    /// then looks up by text (`find`) those still absent; `found` receives each id found by
    /// text (llama.cpp makes it a control token).
    pub(super) fn load(
        meta: &Metadata,
        n: usize,
        find: impl Fn(&[&str]) -> Option<TokenId>,
        mut found: impl FnMut(TokenId),
    ) -> FimTokens {
        let mut ids = [None; 6];
        for (slot, (key, old, texts)) in ids.iter_mut().zip(FIM_KEYS) {
            for k in std::iter::once(key).chain(old) {
                if let Some(v) = meta.get_u64(k).filter(|&v| (v as usize) < n) {
                    *slot = Some(v as TokenId);
                }
            }
            if slot.is_none() {
                *slot = find(texts);
                if let Some(id) = *slot {
                    found(id);
                }
            }
        }
        let [pre, suf, mid, pad, rep, sep] = ids;
        FimTokens {
            pre,
            suf,
            mid,
            pad,
            rep,
            sep,
        }
    }

    /// The FIM tokens that end generation (llama.cpp: pad, repo, file separator).
    pub fn eog(&self) -> impl Iterator<Item = TokenId> {
        [self.pad, self.rep, self.sep].into_iter().flatten()
    }
}

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
