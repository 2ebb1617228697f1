//! Text to token ids: special tokens cut out of the text (llama.cpp's `tokenizer_st_partition`),
//! then each piece of text through the vocabulary's algorithm.

use super::{attr, spm, Escapes, TokenId, Tokenizer, TokenizerError, VocabKind};

/// A piece of the input after special-token partitioning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fragment {
    /// Byte range of the input text.
    Text(usize, usize),
    Token(TokenId),
}

/// C `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

impl Tokenizer {
    /// Cuts special tokens out of `text` (llama.cpp's `tokenizer_st_partition`).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let bytes = text.as_bytes();
        let mut frags = vec![Fragment::Text(0, text.len())];
        for &id in &self.special_tokens {
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let tt = &*self.texts[id as usize];
            if !text.contains(tt) {
                continue;
            }
            let mut out = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut start, end) = f else {
                    out.push(f);
                    continue;
                };
                loop {
                    let Some(pos) = text[start..end].find(tt) else {
                        out.push(Fragment::Text(start, end));
                        break;
                    };
                    let m = start + pos;
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > start && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        out.push(Fragment::Text(start, left_end));
                    }
                    out.push(Fragment::Token(id));
                    start = m + tt.len();
                    if a & attr::RSTRIP != 0 {
                        while start < end && is_c_space(bytes[start]) {
                            start += 1;
                        }
                    }
                    if start >= end {
                        break;
                    }
                }
            }
            frags = out;
        }
        frags
    }

    /// Tokenizes `text`.
    ///
    /// `add_special`: add BOS (and EOS) as the vocabulary asks (`add_bos_token`/`add_eos_token`).
    /// `parse_special`: control-token text such as `<|im_start|>` becomes that token; otherwise it
    /// is tokenized as plain text. (User-defined tokens are always matched, as in llama.cpp.)
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<TokenId>, TokenizerError> {
        let frags = self.partition(text, parse_special);
        self.encode_fragments(text, &frags, add_special, None)
    }

    /// Tokenizes a text in which the parts escaped with [`Tokenizer::escape_plain`] (through
    /// `escapes`) are plain text and the rest, a chat template's own text, is parsed for special
    /// tokens: an escaped part never becomes, nor takes part in, a control token, whatever the
    /// template did with it (copied, trimmed, concatenated). `add_special` as in [`Self::encode`].
    pub fn encode_escaped(
        &self,
        text: &str,
        add_special: bool,
        escapes: &Escapes,
    ) -> Result<Vec<TokenId>, TokenizerError> {
        // Escaped characters are sentinels no token text contains, so no special token is
        // matched across them; the text between special tokens gets its characters back.
        let frags = self.partition(text, true);
        self.encode_fragments(text, &frags, add_special, Some(escapes))
    }

    fn encode_fragments(
        &self,
        text: &str,
        frags: &[Fragment],
        add_special: bool,
        escapes: Option<&Escapes>,
    ) -> Result<Vec<TokenId>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.push(self.bos.ok_or(TokenizerError::NoSpecialToken("bos"))?);
        }
        let piece = |s: usize, e: usize| match escapes {
            Some(esc) => esc.unescape(&text[s..e]),
            None => std::borrow::Cow::Borrowed(&text[s..e]),
        };
        match self.kind {
            _ if self.hf.is_some() => {
                let hf = self.hf.as_ref().expect("checked");
                for &f in frags {
                    match f {
                        Fragment::Text(s, e) => hf.encode(&piece(s, e), &mut out)?,
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            VocabKind::Spm => {
                let mut is_prev_special = true;
                let mut buf = String::new();
                for &f in frags {
                    match f {
                        Fragment::Text(s, e) => {
                            buf.clear();
                            if self.add_space_prefix && is_prev_special {
                                buf.push('▁');
                            }
                            for c in piece(s, e).chars() {
                                buf.push(if c == ' ' { '▁' } else { c });
                            }
                            spm::tokenize(self, &buf, &mut out);
                            is_prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            is_prev_special = true;
                        }
                    }
                }
            }
            VocabKind::Bpe => {
                let bpe = self
                    .bpe
                    .as_ref()
                    .ok_or_else(|| TokenizerError::Invalid("no BPE merges".into()))?;
                for &f in frags {
                    match f {
                        Fragment::Text(s, e) => bpe.tokenize(self, &piece(s, e), &mut out)?,
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.push(self.eos.ok_or(TokenizerError::NoSpecialToken("eos"))?);
        }
        Ok(out)
    }
}
