//! Streaming detokenization: token ids in, whole UTF-8 characters out.

use super::{TokenId, Tokenizer};

/// Feeds token ids one at a time and returns only complete UTF-8 characters.
///
/// A multi-byte character split across byte tokens is held back until it is complete; bytes that
/// can no longer become a valid character are replaced by U+FFFD (one per invalid sequence, as
/// `String::from_utf8_lossy`). [`StreamDecoder::finish`] flushes what is left (an incomplete
/// character becomes U+FFFD). Concatenating every `push` and the final `finish` gives exactly
/// [`Tokenizer::decode`] of the same ids.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    skip_special: bool,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer, skip_special: bool) -> Self {
        StreamDecoder {
            tok,
            skip_special,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text that became complete.
    pub fn push(&mut self, id: TokenId) -> String {
        self.pending
            .extend_from_slice(self.tok.piece(id, self.skip_special));
        self.drain(false)
    }

    /// Returns what is still held back (an incomplete character as U+FFFD) and resets.
    pub fn finish(&mut self) -> String {
        self.drain(true)
    }

    /// Bytes held back because they may still become a character.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    fn drain(&mut self, flush: bool) -> String {
        let mut out = String::new();
        let mut pos = 0;
        loop {
            match std::str::from_utf8(&self.pending[pos..]) {
                Ok(s) => {
                    out.push_str(s);
                    pos = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[pos..pos + valid]).expect("valid"),
                    );
                    pos += valid;
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            pos += n;
                        }
                        None => {
                            // An incomplete character at the end: wait for more bytes.
                            if flush {
                                out.push('\u{FFFD}');
                                pos = self.pending.len();
                            }
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..pos);
        out
    }
}
