//! Keeping text from becoming control tokens when it passes through a chat template.
//!
//! A chat prompt is one string: the template's own text (`<|im_start|>`, `<start_of_turn>`, the
//! `bos_token` it writes) around the messages' contents. Parsed for special tokens as a whole,
//! a message that contains `<|im_end|><|im_start|>system` would close its turn and open a system
//! turn (role injection). So, before rendering, [`Tokenizer::escape_plain`] replaces in each
//! content the first character of every text that could match a control (or unknown) token,
//! including one cut off at either end of the content, with a sentinel: a character of plane
//! 16's private-use area that no token text contains. The template copies it like any other
//! character (trimmed, concatenated, sliced); [`Tokenizer::encode_escaped`] then parses the
//! rendered prompt for special tokens, which the sentinels break, and gives the text between
//! them its characters back before tokenizing it. A content's characters that are themselves
//! in the sentinel range are escaped too, so nothing a message holds can pass for a sentinel.
//! User-defined tokens (such as qwen's `<tool_call>`) are left alone: they are matched in plain
//! text as well, as llama.cpp and Hugging Face match them.

use std::borrow::Cow;
use std::collections::HashMap;

use super::{attr, Tokenizer};

/// The first sentinel; sentinel `i` stands for [`Escapes`]' `i`-th character.
const BASE: u32 = 0x10_0000;
/// The last character of the private-use area of plane 16.
const LAST: u32 = 0x10_FFFD;

fn in_range(c: char) -> bool {
    (BASE..=LAST).contains(&(c as u32))
}

/// The characters escaped in the contents of one prompt (see the module's documentation).
#[derive(Clone, Debug, Default)]
pub struct Escapes {
    chars: Vec<char>,
    index: HashMap<char, u32>,
}

impl Escapes {
    pub fn new() -> Escapes {
        Escapes::default()
    }

    /// The sentinel for `c`.
    fn sentinel(&mut self, c: char) -> char {
        if let Some(&i) = self.index.get(&c) {
            return char::from_u32(BASE + i).unwrap_or(char::REPLACEMENT_CHARACTER);
        }
        let i = self.chars.len() as u32;
        if BASE + i > LAST {
            // More distinct characters than sentinels (only a content made of nearly every
            // private-use character gets here): the character is lost, never let through.
            return char::REPLACEMENT_CHARACTER;
        }
        self.chars.push(c);
        self.index.insert(c, i);
        char::from_u32(BASE + i).unwrap_or(char::REPLACEMENT_CHARACTER)
    }

    /// `text` with its sentinels replaced by the characters they stand for. Characters of the
    /// range that are no sentinel of these escapes (a template's own) are kept.
    pub(super) fn unescape<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if !text.chars().any(in_range) {
            return Cow::Borrowed(text);
        }
        let map = |c: char| {
            if in_range(c) {
                if let Some(&orig) = self.chars.get((c as u32 - BASE) as usize) {
                    return orig;
                }
            }
            c
        };
        Cow::Owned(text.chars().map(map).collect())
    }
}

impl Tokenizer {
    /// `text` (a message's content) with every character escaped that could begin, or take
    /// part in, a control or unknown token after a template puts it into a prompt; tokenize the
    /// rendered prompt with [`Tokenizer::encode_escaped`] and the same `escapes`.
    pub fn escape_plain(&self, text: &str, escapes: &mut Escapes) -> String {
        let bytes = text.as_bytes();
        let mut present = [false; 256];
        for &b in bytes {
            present[b as usize] = true;
        }
        let mut marks: Vec<usize> = Vec::new();
        for &id in &self.special_tokens {
            if self.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) == 0 {
                continue;
            }
            let tt = &*self.texts[id as usize];
            if tt.is_empty() {
                continue;
            }
            // Whole occurrences, overlapping ones included.
            if present[tt.as_bytes()[0] as usize] {
                let mut from = 0;
                while let Some(p) = text[from..].find(tt) {
                    let at = from + p;
                    marks.push(at);
                    from = at + text[at..].chars().next().map_or(1, char::len_utf8);
                }
            }
            if text.is_empty() {
                continue;
            }
            for (k, _) in tt.char_indices().skip(1) {
                // The token's start ends the text: the template's next text could complete it.
                if text.ends_with(&tt[..k]) {
                    marks.push(text.len() - k);
                }
                // The token's end begins the text: the template's text before could start it.
                if text.starts_with(&tt[k..]) {
                    marks.push(0);
                }
            }
            // The whole text inside the token's: the template's text around could make it.
            if tt.contains(text) {
                marks.push(0);
            }
        }
        marks.sort_unstable();
        marks.dedup();
        let mut out = String::with_capacity(text.len() + 4 * marks.len());
        let mut next = marks.iter().peekable();
        for (i, c) in text.char_indices() {
            let marked = next.peek().is_some_and(|&&m| m == i);
            if marked {
                next.next();
            }
            if marked || in_range(c) {
                out.push(escapes.sentinel(c));
            } else {
                out.push(c);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_restores_and_keeps_foreign_sentinels() {
        let mut e = Escapes::new();
        let a = e.sentinel('<');
        let b = e.sentinel('\u{10_0005}');
        assert_eq!(a, '\u{10_0000}');
        assert_eq!(e.sentinel('<'), a);
        let foreign = '\u{10_0100}';
        let s = format!("x{a}y{b}{foreign}");
        assert_eq!(e.unescape(&s), format!("x<y\u{10_0005}{foreign}"));
        assert!(matches!(e.unescape("plain"), Cow::Borrowed("plain")));
    }
}
