//! A conversation to prompt tokens: only the template's own text can become special tokens,
//! and BOS is there once.

use super::{ChatError, ChatTemplate, Message};
use crate::tokenizer::{Escapes, TokenId, Tokenizer, TokenizerError};

impl ChatTemplate {
    /// Renders `messages` and tokenizes the prompt.
    ///
    /// The template's own text is parsed for special tokens (`<|im_start|>`, the `bos_token` it
    /// writes); the messages' contents are plain text, so a message holding `<|im_end|>` gets
    /// the tokens of those characters, not the control token (see
    /// [`Tokenizer::escape_plain`]). `parse_special_in_messages` parses the contents too, as
    /// llama.cpp does (a message can then open or close turns).
    ///
    /// BOS comes once: the tokenizer adds it when the vocabulary asks (`add_bos_token`),
    /// unless the prompt already starts with it because the template wrote `bos_token`. EOS is
    /// appended when the vocabulary asks (`add_eos_token`), as [`Tokenizer::encode`] does.
    pub fn encode(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
        parse_special_in_messages: bool,
    ) -> Result<Vec<TokenId>, ChatError> {
        let mut ids = if parse_special_in_messages {
            let text = self.render(messages, add_generation_prompt)?;
            tok.encode(&text, false, true)?
        } else {
            let mut escapes = Escapes::new();
            let escaped: Vec<Message> = messages
                .iter()
                .map(|m| Message {
                    content: tok.escape_plain(&m.content, &mut escapes),
                    ..m.clone()
                })
                .collect();
            let text = self.render(&escaped, add_generation_prompt)?;
            tok.encode_escaped(&text, false, &escapes)?
        };
        if tok.add_bos() {
            let bos = tok.bos().ok_or(TokenizerError::NoSpecialToken("bos"))?;
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        if tok.add_eos() {
            ids.push(tok.eos().ok_or(TokenizerError::NoSpecialToken("eos"))?);
        }
        Ok(ids)
    }
}
