//! Chat templates: the Jinja template stored in the GGUF (`tokenizer.chat_template`), rendered
//! with minijinja and Python-compatible string methods, as Hugging Face renders it.

pub mod harmony;
mod pyjson;
pub mod reasoning;
pub mod strftime;
pub mod tools;

mod encode;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use harmony::{split_harmony, HarmonySplitter};
pub use reasoning::{split_reasoning, ReasoningPiece, ReasoningSplitter};
pub use tools::{ToolCall, ToolCallParser, ToolEvent, ToolSpec};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant's calls (absent from the template's view when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` message: the function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant's reasoning (its thinking block), which templates such as Qwen3's render.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error(
        "this model has no chat template (tokenizer.chat_template); use plain completion instead"
    )]
    NoTemplate,
    #[error("chat template error: {0}")]
    Template(String),
    #[error("cannot tokenize the chat prompt: {0}")]
    Tokenize(#[from] crate::tokenizer::TokenizerError),
}

pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    /// The template renders the `tools` variable.
    renders_tools: bool,
    /// The template writes thinking blocks (`<think>`).
    reasons: bool,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are the texts of those tokens, which templates may use.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = minijinja::Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_function(
            "strftime_now",
            |format: String| -> Result<String, minijinja::Error> {
                strftime::strftime_now(&format)
                    .map_err(|m| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, m))
            },
        );
        // Hugging Face's `tojson` is Python's `json.dumps` (", " and ": ", no HTML escapes),
        // which is what the models saw in training.
        env.add_filter("tojson", pyjson::tojson);
        // Templates often trim the leading newline of blocks as Hugging Face's Jinja does.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| ChatError::Template(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            renders_tools: source.contains("tools"),
            reasons: source.contains(reasoning::THINK_CLOSE)
                || source.contains(reasoning::THINK_OPEN)
                || source.contains("enable_thinking")
                || source.contains("reasoning_effort"),
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends where the
    /// assistant's reply begins.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Whether the template uses the `tools` it is given (Qwen2.5's does; many do not).
    pub fn renders_tools(&self) -> bool {
        self.renders_tools
    }

    /// Whether the model has a reasoning mode: its template writes thinking blocks or takes
    /// `enable_thinking` / `reasoning_effort` (Qwen3, DeepSeek-R1, gpt-oss). Its output is then
    /// worth splitting with [`ReasoningSplitter`].
    pub fn reasons(&self) -> bool {
        self.reasons
    }

    /// [`render`](Self::render) with the functions the model may call (OpenAI's `tools`
    /// entries, `{"type": "function", "function": {...}}`), as the template's `tools`.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with_kwargs(messages, tools, add_generation_prompt, None)
    }

    /// [`render_with_tools`](Self::render_with_tools) with extra variables for the template
    /// (`chat_template_kwargs`: `enable_thinking`, `reasoning_effort`, ...). They cannot replace
    /// the variables this function sets (`messages`, `tools`, ...).
    pub fn render_with_kwargs(
        &self,
        messages: &[Message],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, Value>>,
    ) -> Result<String, ChatError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ChatError::Template(e.to_string()))?;
        let mut ctx: std::collections::BTreeMap<String, minijinja::Value> = kwargs
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), minijinja::Value::from_serialize(v)))
            .collect();
        use minijinja::Value as V;
        ctx.insert("messages".into(), V::from_serialize(messages));
        ctx.insert("tools".into(), V::from_serialize(tools));
        ctx.insert(
            "add_generation_prompt".into(),
            V::from(add_generation_prompt),
        );
        ctx.insert("bos_token".into(), V::from(self.bos.clone()));
        ctx.insert("eos_token".into(), V::from(self.eos.clone()));
        tmpl.render(ctx)
            .map_err(|e| ChatError::Template(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let out = t
            .render(
                &[
                    Message::new("system", "Be brief."),
                    Message::new("user", "Hi"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_string_methods_and_errors() {
        let t = ChatTemplate::new("{{ messages[0]['content'].strip() }}{% if messages|length > 1 %}{{ raise_exception('one only') }}{% endif %}", "", "").unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "  x ")], false).unwrap(),
            "x"
        );
        let err = t
            .render(
                &[Message::new("user", "a"), Message::new("user", "b")],
                false,
            )
            .unwrap_err();
        assert!(err.to_string().contains("one only"));
        assert!(ChatTemplate::new("{% if %}", "", "").is_err());
    }
}
