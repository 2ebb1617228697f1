//! qwen2.5's byte-level BPE: encode arbitrary text (special tokens parsed or not), the
//! round trip, escaped text, and decoding arbitrary ids (see `check_tokenizer`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    nucleus_fuzz::check_tokenizer(nucleus_fuzz::qwen(), data);
});
