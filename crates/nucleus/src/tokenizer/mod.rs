//! (stand-in until the tokenizer lands)
pub type TokenId = u32;
