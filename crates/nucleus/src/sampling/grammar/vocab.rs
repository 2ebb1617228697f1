//! llguidance's view of our vocabulary: the bytes of every token in a token trie, and the
//! grammar compiler built on it (one per vocabulary, cached for the life of the process).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use llguidance::api::ParserLimits;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use super::{Grammar, GrammarError, GrammarSpec};
use crate::tokenizer::{TokenId, Tokenizer};

/// The vocabulary as llguidance sees it. Normal tokens are their bytes; control tokens are
/// `0xFF` followed by their text (llguidance's marker for special tokens, so that no text of a
/// grammar produces them); tokens with no bytes can never be produced.
struct VocabEnv {
    trie: TokTrie,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Greedy tokenization over the trie (llguidance uses it for forced text; it need not be
    /// the model's own tokenization, hence not canonical).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The token bytes llguidance works with, for every id of `tok`.
fn token_words(tok: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tok.vocab_size() as TokenId)
        .map(|id| {
            let b = tok.token_bytes(id);
            if b.is_empty() {
                Vec::new()
            } else if tok.is_special(id) {
                let mut v = Vec::with_capacity(b.len() + 1);
                v.push(TokTrie::SPECIAL_TOKEN_MARKER);
                v.extend_from_slice(b);
                v
            } else {
                b.to_vec()
            }
        })
        .collect()
}

/// llguidance's tokenizer environment for `tok`: its token trie, with every
/// end-of-generation token as EOS.
pub fn vocab_env(tok: &Tokenizer) -> Result<TokEnv, GrammarError> {
    let words = token_words(tok);
    let eog: Vec<TokenId> = tok.eog_tokens().to_vec();
    let eos = tok
        .eos()
        .or_else(|| eog.first().copied())
        .ok_or_else(|| GrammarError("the vocabulary has no end-of-generation token".into()))?;
    let mut info = TokRxInfo::new(words.len() as u32, eos);
    info.tok_bos = tok.bos();
    info.tok_pad = tok.pad();
    info.tok_unk = tok.unk();
    info.tok_end_of_turn = tok.eot();
    let mut trie = TokTrie::from(&info, &words);
    let mut eos_tokens = vec![eos];
    eos_tokens.extend(eog.iter().copied().filter(|&t| t != eos));
    trie = trie.with_eos_tokens(&eos_tokens);
    Ok(Arc::new(VocabEnv { trie }))
}

/// Compiles [`GrammarSpec`]s for one vocabulary. Building it takes a while (the token trie
/// and llguidance's per-vocabulary tables: 0.7 s for a 152k vocabulary on 2 cores), so
/// [`for_tokenizer`](Self::for_tokenizer) keeps one per distinct vocabulary.
pub struct GrammarCompiler {
    factory: ParserFactory,
    n_vocab: usize,
    eog: Arc<[TokenId]>,
}

type Cache = Mutex<Vec<(u64, Arc<GrammarCompiler>)>>;
static CACHE: Cache = Mutex::new(Vec::new());

/// A fingerprint of what the compiler depends on: every token's bytes and specialness, EOS.
fn fingerprint(tok: &Tokenizer) -> u64 {
    let mut h = DefaultHasher::new();
    tok.vocab_size().hash(&mut h);
    for id in 0..tok.vocab_size() as TokenId {
        tok.token_bytes(id).hash(&mut h);
        tok.is_special(id).hash(&mut h);
    }
    tok.eog_tokens().hash(&mut h);
    tok.eos().hash(&mut h);
    h.finish()
}

impl GrammarCompiler {
    /// A compiler for `tok`'s vocabulary (built once per vocabulary, then shared).
    pub fn for_tokenizer(tok: &Tokenizer) -> Result<Arc<GrammarCompiler>, GrammarError> {
        let key = fingerprint(tok);
        let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(c.clone());
        }
        let c = Arc::new(GrammarCompiler::new(tok)?);
        cache.push((key, c.clone()));
        Ok(c)
    }

    /// A compiler for `tok`'s vocabulary, not cached.
    pub fn new(tok: &Tokenizer) -> Result<GrammarCompiler, GrammarError> {
        let env = vocab_env(tok)?;
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            // Errors name the problem without dumping the grammar.
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(GrammarCompiler {
            factory,
            n_vocab: tok.vocab_size(),
            eog: tok.eog_tokens().into(),
        })
    }

    /// A fresh parser for `spec`; the error says why it does not compile.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let parser = self
            .factory
            .create_parser(spec.top_level()?)
            .map_err(|e| GrammarError(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError(e));
        }
        Ok(Grammar::new(matcher, self.n_vocab, self.eog.clone()))
    }
}
