//! The grammar stage (llguidance through nucleus's `GrammarCompiler`): JSON Schemas, Lark
//! grammars and regexes from arbitrary text, compiled for qwen2.5's vocabulary and driven for a
//! few tokens (see `check_grammar`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nucleus_fuzz::check_grammar(data);
});
