//! SentencePiece vocabularies: gemma-3's (no space prefix) when the first byte is even, llama's
//! (space prefix) when odd; the rest as in `check_tokenizer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let tok = if which & 1 == 0 {
        nucleus_fuzz::gemma()
    } else {
        nucleus_fuzz::llama_spm()
    };
    nucleus_fuzz::check_tokenizer(tok, rest);
});
