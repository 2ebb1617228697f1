//! SentencePiece-style tokenization as llama.cpp's `llm_tokenizer_spm`: start from UTF-8
//! characters, repeatedly merge the adjacent pair whose concatenation is the vocabulary token
//! with the highest score (ties: leftmost first), then emit each symbol's token, or its bytes as
//! `<0xXX>` byte tokens when the symbol is not in the vocabulary.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{TokenId, Tokenizer};

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Tokenizes `text` (spaces already escaped as "▁"), appending to `out`.
pub(super) fn tokenize(tok: &Tokenizer, text: &str, out: &mut Vec<TokenId>) {
    if text.is_empty() {
        return;
    }
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (start, c) in text.char_indices() {
        let i = symbols.len();
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: if i == 0 { NONE } else { i - 1 },
            next: i + 1,
        });
    }
    if let Some(last) = symbols.last_mut() {
        last.next = NONE;
    }

    let mut queue = BinaryHeap::with_capacity(symbols.len());
    let try_add =
        |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: usize, right: usize| {
            if left == NONE || right == NONE {
                return;
            }
            let (l, r) = (symbols[left], symbols[right]);
            let piece = &text[l.start..l.start + l.len + r.len];
            if let Some(id) = tok.token_id(piece) {
                queue.push(Bigram {
                    left,
                    right,
                    score: tok.scores[id as usize],
                    size: piece.len(),
                });
            }
        };
    for i in 1..symbols.len() {
        try_add(&symbols, &mut queue, i - 1, i);
    }

    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if r.next != NONE {
            symbols[r.next].prev = b.left;
        }
        let prev = symbols[b.left].prev;
        let next = symbols[b.left].next;
        try_add(&symbols, &mut queue, prev, b.left);
        try_add(&symbols, &mut queue, b.left, next);
    }

    let mut i = 0;
    while i != NONE {
        let s = symbols[i];
        let piece = &text[s.start..s.start + s.len];
        match tok.token_id(piece) {
            Some(id) => out.push(id),
            None => {
                for &byte in piece.as_bytes() {
                    if let Some(id) = tok.byte_tokens[byte as usize].or(tok.unk) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}
