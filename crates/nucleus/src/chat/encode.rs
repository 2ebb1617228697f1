//! A conversation to prompt tokens: only the template's own text can become special tokens,
//! and BOS is there once.

use serde_json::Value;

use super::reasoning::prompt_opens_reasoning;
use super::{ChatError, ChatTemplate, Message};
use crate::tokenizer::{Escapes, TokenId, Tokenizer, TokenizerError};

/// `v` with every string in it (keys included) escaped as [`Tokenizer::escape_plain`] does.
fn escape_json(tok: &Tokenizer, v: &Value, escapes: &mut Escapes) -> Value {
    match v {
        Value::String(s) => Value::String(tok.escape_plain(s, escapes)),
        Value::Array(a) => Value::Array(a.iter().map(|x| escape_json(tok, x, escapes)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (tok.escape_plain(k, escapes), escape_json(tok, x, escapes)))
                .collect(),
        ),
        other => other.clone(),
    }
}

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
        self.encode_with_tools(
            tok,
            messages,
            None,
            add_generation_prompt,
            parse_special_in_messages,
        )
    }

    /// [`Self::encode`] with `tools` for the template. The tools' text and the arguments of
    /// assistants' tool calls are plain text like the contents.
    pub fn encode_with_tools(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
        parse_special_in_messages: bool,
    ) -> Result<Vec<TokenId>, ChatError> {
        self.encode_with_kwargs(
            tok,
            messages,
            tools,
            add_generation_prompt,
            parse_special_in_messages,
            None,
        )
        .map(|(ids, _)| ids)
    }

    /// [`Self::encode_with_tools`] with extra template variables (see
    /// [`ChatTemplate::render_with_kwargs`]); also says whether the prompt leaves a thinking
    /// block open (see [`super::reasoning::prompt_opens_reasoning`]), so that the output starts
    /// inside it.
    pub fn encode_with_kwargs(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
        parse_special_in_messages: bool,
        kwargs: Option<&serde_json::Map<String, Value>>,
    ) -> Result<(Vec<TokenId>, bool), ChatError> {
        let (mut ids, opens) = if parse_special_in_messages {
            let text = self.render_with_kwargs(messages, tools, add_generation_prompt, kwargs)?;
            (
                tok.encode(&text, false, true)?,
                prompt_opens_reasoning(&text),
            )
        } else {
            let mut escapes = Escapes::new();
            let escaped: Vec<Message> = messages
                .iter()
                .map(|m| {
                    let mut e = m.clone();
                    e.content = tok.escape_plain(&m.content, &mut escapes);
                    if let Some(r) = &m.reasoning_content {
                        e.reasoning_content = Some(tok.escape_plain(r, &mut escapes));
                    }
                    for c in &mut e.tool_calls {
                        c.function.name = tok.escape_plain(&c.function.name, &mut escapes);
                        c.function.arguments =
                            escape_json(tok, &c.function.arguments, &mut escapes);
                    }
                    e
                })
                .collect();
            let tools: Option<Vec<Value>> = tools.map(|t| {
                t.iter()
                    .map(|v| escape_json(tok, v, &mut escapes))
                    .collect()
            });
            let text =
                self.render_with_kwargs(&escaped, tools.as_deref(), add_generation_prompt, kwargs)?;
            (
                tok.encode_escaped(&text, false, &escapes)?,
                prompt_opens_reasoning(&text),
            )
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
        Ok((ids, opens))
    }
}
