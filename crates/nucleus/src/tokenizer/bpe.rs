//! Byte-level BPE as llama.cpp's `llm_tokenizer_bpe`: the text is split into words by the
//! pre-tokenizer regexes of the vocabulary's `tokenizer.ggml.pre` (each regex splits the pieces
//! the previous one produced; text between matches stays a piece of its own), every word's bytes
//! start as one symbol each, and adjacent symbols are merged lowest merge rank first (ties:
//! leftmost first). A final symbol that is not a token is emitted as its single-byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use fancy_regex::Regex;

use super::{TokenId, Tokenizer, TokenizerError};
use crate::gguf::MetaValue;

/// GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the rest to U+0100 onwards.
pub(super) fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("valid char")
}

/// The inverse of [`byte_to_char`].
fn char_to_byte(c: char) -> Option<u8> {
    static TABLE: std::sync::OnceLock<HashMap<char, u8>> = std::sync::OnceLock::new();
    TABLE
        .get_or_init(|| (0..=255u8).map(|b| (byte_to_char(b), b)).collect())
        .get(&c)
        .copied()
}

/// A byte-level token text back to bytes (llama.cpp's `llama_decode_text`).
pub(super) fn decode_text(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const CJK: &str = "[一-龥ࠀ-一가-\u{D7FF}]+";
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u{1F7D}ᾀ-ᾴᾶ-ᾼ\u{1FBE}ῂ-ῄῆ-ῌῐ-\u{1FD3}ῖ-\u{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u{2126}ℨ\u{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const DEEPSEEK_LLM_PUNCT: &str = r"\s?[!-/:-~！-／：-～‘-‟　-。]+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// What a `tokenizer.ggml.pre` name means (llama.cpp's `llm_tokenizer_bpe` and
/// `llama_vocab::load`).
pub(super) struct PreConfig {
    pub regexes: Vec<&'static str>,
    pub ignore_merges: bool,
    pub add_bos: bool,
    pub no_bos: bool,
}

impl PreConfig {
    pub fn for_pre(pre: &str) -> Result<PreConfig, TokenizerError> {
        let mut cfg = PreConfig {
            regexes: Vec::new(),
            ignore_merges: false,
            add_bos: false,
            no_bos: false,
        };
        cfg.regexes = match pre {
            "default" | "" => vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => {
                cfg.ignore_merges = true;
                cfg.add_bos = true;
                vec![LLAMA3]
            }
            "dbrx" | "smaug-bpe" => vec![LLAMA3],
            "glm4" | "chatglm-bpe" => {
                cfg.no_bos = true;
                vec![LLAMA3]
            }
            "deepseek-llm" => vec![
                "[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                DEEPSEEK_LLM_PUNCT,
                r"\s+$",
                CJK,
                r"\p{N}+",
            ],
            "deepseek-coder" => vec!["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"],
            "deepseek-v3" => vec![
                r"\p{N}{1,3}",
                "[一-龥\u{3040}-ゟ゠-ヿ]+",
                r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
            ],
            "falcon" => vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => vec![r"\p{N}", GPT2],
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en"
            | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "trillion"
            | "granite-docling" | "exaone4" => vec![GPT2],
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2"
            | "hunyuan" | "solar-open" => vec![QWEN2],
            "qwen35" => vec![QWEN35],
            "poro-chat" | "bloom" | "gpt3-finnish" => vec![BLOOM],
            "viking" => vec![BLOOM, r"\p{N}"],
            "tekken" => {
                cfg.ignore_merges = true;
                cfg.add_bos = true;
                vec![TEKKEN]
            }
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => vec![GPT4O],
            "seed-coder" => vec![
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            "bailingmoe" | "bailingmoe2" | "llada-moe" => vec![
                r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
            ],
            other => return Err(TokenizerError::UnknownPre(other.to_string())),
        };
        Ok(cfg)
    }
}

/// A merge: its rank and the token the merged pair becomes (if it is one).
#[derive(Clone, Copy)]
struct Merge {
    rank: u32,
    merged: Option<TokenId>,
}

pub(super) struct Bpe {
    regexes: Vec<Regex>,
    ignore_merges: bool,
    merges: HashMap<(TokenId, TokenId), Merge>,
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    id: Option<TokenId>,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

struct Bigram {
    left: usize,
    right: usize,
    rank: u32,
    size: usize,
    merged: Option<TokenId>,
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
    /// Max-heap order: lowest rank first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl Bpe {
    pub fn new(
        cfg: PreConfig,
        merges: &[MetaValue],
        token_to_id: &HashMap<Box<str>, TokenId>,
    ) -> Result<Bpe, TokenizerError> {
        let regexes = cfg
            .regexes
            .iter()
            .map(|r| Regex::new(r).map_err(|e| TokenizerError::Regex(format!("{r}: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut map = HashMap::with_capacity(merges.len());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            let m = m.as_str().ok_or_else(|| {
                TokenizerError::Invalid("tokenizer.ggml.merges: not strings".into())
            })?;
            // llama.cpp splits at the first space after the first byte.
            let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (a, b) = (&m[..pos], &m[pos + 1..]);
            let (Some(&ia), Some(&ib)) = (token_to_id.get(a), token_to_id.get(b)) else {
                // Neither side can ever be a symbol: the merge can never apply.
                continue;
            };
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let merged = token_to_id.get(joined.as_str()).copied();
            map.entry((ia, ib)).or_insert(Merge {
                rank: rank as u32,
                merged,
            });
        }
        Ok(Bpe {
            regexes,
            ignore_merges: cfg.ignore_merges,
            merges: map,
        })
    }

    /// Splits `text` into words (byte ranges) by the regex chain.
    fn split(&self, text: &str) -> Result<Vec<(usize, usize)>, TokenizerError> {
        let mut pieces = vec![(0, text.len())];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for &(s, e) in &pieces {
                let sub = &text[s..e];
                let mut last = 0;
                for m in re.find_iter(sub) {
                    let m = m.map_err(|e| TokenizerError::Regex(e.to_string()))?;
                    if m.start() > last {
                        next.push((s + last, s + m.start()));
                    }
                    if m.end() > m.start() {
                        next.push((s + m.start(), s + m.end()));
                    }
                    last = m.end();
                }
                if last < sub.len() {
                    next.push((s + last, e));
                }
            }
            pieces = next;
        }
        Ok(pieces)
    }

    pub fn tokenize(
        &self,
        tok: &Tokenizer,
        text: &str,
        out: &mut Vec<TokenId>,
    ) -> Result<(), TokenizerError> {
        let words = self.split(text)?;
        let mut symbols: Vec<Symbol> = Vec::new();
        let mut queue: BinaryHeap<Bigram> = BinaryHeap::new();
        let mut encoded = String::new();
        for (ws, we) in words {
            let word = &text.as_bytes()[ws..we];
            if self.ignore_merges {
                encoded.clear();
                encoded.extend(word.iter().map(|&b| byte_to_char(b)));
                if let Some(id) = tok.token_id(&encoded) {
                    out.push(id);
                    continue;
                }
            }
            symbols.clear();
            queue.clear();
            for (i, &b) in word.iter().enumerate() {
                symbols.push(Symbol {
                    start: i,
                    len: 1,
                    id: tok.byte_tokens[b as usize],
                    prev: if i == 0 { NONE } else { i - 1 },
                    next: if i + 1 == word.len() { NONE } else { i + 1 },
                });
            }
            let add = |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, l: usize, r: usize| {
                if l == NONE || r == NONE {
                    return;
                }
                let (sl, sr) = (symbols[l], symbols[r]);
                let (Some(il), Some(ir)) = (sl.id, sr.id) else {
                    return;
                };
                if let Some(m) = self.merges.get(&(il, ir)) {
                    queue.push(Bigram {
                        left: l,
                        right: r,
                        rank: m.rank,
                        size: sl.len + sr.len,
                        merged: m.merged,
                    });
                }
            };
            for i in 1..symbols.len() {
                add(&symbols, &mut queue, i - 1, i);
            }
            while let Some(b) = queue.pop() {
                let (l, r) = (symbols[b.left], symbols[b.right]);
                if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                    continue;
                }
                symbols[b.left].len += r.len;
                symbols[b.left].id = b.merged;
                symbols[b.right].len = 0;
                symbols[b.left].next = r.next;
                if r.next != NONE {
                    symbols[r.next].prev = b.left;
                }
                let (prev, next) = (symbols[b.left].prev, symbols[b.left].next);
                add(&symbols, &mut queue, prev, b.left);
                add(&symbols, &mut queue, b.left, next);
            }
            let mut i = if symbols.is_empty() { NONE } else { 0 };
            while i != NONE {
                let s = symbols[i];
                match s.id {
                    Some(id) => out.push(id),
                    None => {
                        for &b in &word[s.start..s.start + s.len] {
                            if let Some(id) = tok.byte_tokens[b as usize] {
                                out.push(id);
                            }
                        }
                    }
                }
                i = s.next;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table() {
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
    }

    #[test]
    fn all_pre_regexes_compile() {
        for pre in [
            "default",
            "llama3",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "falcon",
            "starcoder",
            "gpt-2",
            "qwen2",
            "qwen35",
            "bloom",
            "viking",
            "tekken",
            "gpt-4o",
            "seed-coder",
            "bailingmoe",
        ] {
            for r in PreConfig::for_pre(pre).unwrap().regexes {
                Regex::new(r).unwrap_or_else(|e| panic!("{pre}: {r}: {e}"));
            }
        }
        assert!(matches!(
            PreConfig::for_pre("no-such-pre"),
            Err(TokenizerError::UnknownPre(_))
        ));
    }
}
