//! Tool calls over HTTP: `tools`, `tool_choice` and `parallel_tool_calls` checked; the calls in
//! the model's output turned into `message.tool_calls`, or streamed as `delta.tool_calls`.
//!
//! - `tool_choice: "none"`: the tools are not shown to the model and its output is text;
//! - `"auto"` (the default with tools): the tools are rendered through the chat template, the
//!   model writes freely, and its `<tool_call>` blocks become calls (with
//!   `parallel_tool_calls: false`, generation stops at the end of the first call);
//! - `"required"` / `{"type": "function", "function": {"name": …}}`: the output is constrained
//!   to `<tool_call>` blocks (one or more of any tool, or exactly one of the named one), each
//!   call's arguments valid against its tool's `parameters` schema.

use serde_json::{json, Value};

use nucleus::chat::tools::{forced_call_grammar, ToolSpec, CALL_CLOSE};
use nucleus::sampling::GrammarSpec;

use crate::api::ApiRequest;
use crate::output::{OutputParser, Piece};
use crate::ApiError;

/// What the request asked of tools.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSettings {
    /// The `tools` entries, for the chat template.
    pub tools: Vec<Value>,
    /// `None`: `tool_choice` is `none`.
    pub grammar: Option<GrammarSpec>,
    /// A stop string that ends the output after its first call.
    pub stop: Option<String>,
    /// The tools' names (for untagged calls).
    pub names: Vec<String>,
}

fn name_ok(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn parse_tools(v: &Value) -> Result<(Vec<Value>, Vec<ToolSpec>), ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| ApiError::param("tools", "`tools` must be a list of tools"))?;
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let field = |f: &str| format!("tools[{i}].{f}");
        let o = t
            .as_object()
            .ok_or_else(|| ApiError::param(&format!("tools[{i}]"), "a tool must be an object"))?;
        match o.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(ApiError::param(
                    &field("type"),
                    format!("tool type {other:?} is not supported: only \"function\""),
                ))
            }
        }
        let f = o
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| ApiError::param(&field("function"), "`function` must be an object"))?;
        let name = match f.get("name") {
            Some(Value::String(n)) if name_ok(n) => n.clone(),
            _ => {
                return Err(ApiError::param(
                    &field("function.name"),
                    "a function name must be 1 to 64 letters, digits, `_` or `-`",
                ))
            }
        };
        if specs.iter().any(|s| s.name == name) {
            return Err(ApiError::param(
                &field("function.name"),
                format!("two tools are named {name:?}"),
            ));
        }
        if !matches!(
            f.get("description"),
            None | Some(Value::Null) | Some(Value::String(_))
        ) {
            return Err(ApiError::param(
                &field("function.description"),
                "`description` must be a string",
            ));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => None,
            Some(p @ Value::Object(_)) => Some(p.clone()),
            Some(_) => {
                return Err(ApiError::param(
                    &field("function.parameters"),
                    "`parameters` must be a JSON Schema object",
                ))
            }
        };
        if !matches!(
            f.get("strict"),
            None | Some(Value::Null) | Some(Value::Bool(_))
        ) {
            return Err(ApiError::param(
                &field("function.strict"),
                "`strict` must be a boolean",
            ));
        }
        specs.push(ToolSpec { name, parameters });
    }
    Ok((list.clone(), specs))
}

/// The request's tool settings (`None`: no tools, or `tool_choice: "none"`); a 400 naming the
/// field for a bad value.
pub fn tool_settings(req: &ApiRequest) -> Result<Option<ToolSettings>, ApiError> {
    let (tools, specs) = match &req.tools {
        None | Some(Value::Null) => (Vec::new(), Vec::new()),
        Some(v) => parse_tools(v)?,
    };
    let parallel = match &req.parallel_tool_calls {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::param(
                "parallel_tool_calls",
                "`parallel_tool_calls` must be a boolean",
            ))
        }
    };
    enum Choice {
        None,
        Auto,
        Required,
        Named(String),
    }
    let choice = match &req.tool_choice {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            _ => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!("`tool_choice` {s:?} is not none, auto, required or a function"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) => {
                    if !specs.iter().any(|s| s.name == n) {
                        return Err(ApiError::param(
                            "tool_choice",
                            format!("`tool_choice` names {n:?}, which is not in `tools`"),
                        ));
                    }
                    Choice::Named(n.to_string())
                }
                _ => return Err(ApiError::param(
                    "tool_choice",
                    "`tool_choice` must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                )),
            }
        }
        Some(_) => {
            return Err(ApiError::param(
                "tool_choice",
                "`tool_choice` must be a string or an object",
            ))
        }
    };
    if specs.is_empty() {
        return match choice {
            Choice::Required | Choice::Named(_) => Err(ApiError::param(
                "tool_choice",
                "`tool_choice` asks for a call but `tools` is empty",
            )),
            _ => Ok(None),
        };
    }
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let (grammar, stop) = match choice {
        Choice::None => return Ok(None),
        Choice::Auto => (None, (!parallel).then(|| CALL_CLOSE.to_string())),
        Choice::Required => (Some(forced_call_grammar(&specs, parallel)), None),
        Choice::Named(n) => {
            let one: Vec<ToolSpec> = specs.into_iter().filter(|s| s.name == n).collect();
            (Some(forced_call_grammar(&one, false)), None)
        }
    };
    Ok(Some(ToolSettings {
        tools,
        grammar: grammar.map(GrammarSpec::Lark),
        stop,
        names,
    }))
}

/// One choice's streamed output turned into chat deltas: reasoning as `reasoning_content`,
/// text as `content`, calls as `tool_calls` entries (`index`, `id`, `type`, `function.name`
/// first; then `arguments` fragments).
pub struct ToolStream {
    parser: OutputParser,
    /// Makes a call id.
    new_id: Box<dyn FnMut() -> String + Send>,
}

impl ToolStream {
    /// `names`: the tools, whose untagged call objects count as calls too.
    pub fn new(names: Vec<String>, new_id: Box<dyn FnMut() -> String + Send>) -> ToolStream {
        ToolStream::with(None, Some(names), new_id)
    }

    /// `reasoning`: split off a thinking block (`Some(opened)`); `tools`: parse calls.
    pub fn with(
        reasoning: Option<bool>,
        tools: Option<Vec<String>>,
        new_id: Box<dyn FnMut() -> String + Send>,
    ) -> ToolStream {
        ToolStream {
            parser: OutputParser::new(reasoning, tools),
            new_id,
        }
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.parser.calls()
    }

    fn deltas(&mut self, pieces: Vec<Piece>) -> Vec<Value> {
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Reasoning(r) => json!({"reasoning_content": r}),
                Piece::Text(t) => json!({"content": t}),
                Piece::CallStart { index, name } => json!({"tool_calls": [{
                    "index": index,
                    "id": (self.new_id)(),
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }]}),
                Piece::CallArgs { index, text } => {
                    json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
                }
            })
            .collect()
    }

    /// The deltas a piece of output text completes.
    pub fn push(&mut self, text: &str) -> Vec<Value> {
        let pieces = self.parser.push(text);
        self.deltas(pieces)
    }

    /// The deltas held until the end.
    pub fn finish(&mut self) -> Vec<Value> {
        let pieces = self.parser.finish();
        self.deltas(pieces)
    }
}

/// A whole answer's message: `content` (null when only calls) and `tool_calls`.
pub fn message(text: &str, names: &[String], new_id: &mut dyn FnMut() -> String) -> (Value, usize) {
    message_with(text, None, Some(names), new_id)
}

/// [`message`] with the reasoning split off (`reasoning: Some(opened)`) into
/// `reasoning_content`, and calls parsed only with `tools`.
pub fn message_with(
    text: &str,
    reasoning: Option<bool>,
    tools: Option<&[String]>,
    new_id: &mut dyn FnMut() -> String,
) -> (Value, usize) {
    let a = OutputParser::new(reasoning, tools.map(<[String]>::to_vec)).whole(text);
    let content = match tools {
        None => Value::String(a.text),
        Some(_) => json!(Some(a.body()).filter(|t| !t.is_empty())),
    };
    let mut m = json!({"role": "assistant", "content": content});
    if let Some(r) = a.reasoning {
        m["reasoning_content"] = json!(r);
    }
    if !a.calls.is_empty() {
        m["tool_calls"] = a
            .calls
            .iter()
            .map(|(name, args)| crate::api::tool_call(&new_id(), name, args.as_str()))
            .collect();
    }
    (m, a.calls.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(v: Value) -> Result<Option<ToolSettings>, String> {
        let req: ApiRequest = serde_json::from_value(v).unwrap();
        tool_settings(&req).map_err(|e| e.param.unwrap_or_default())
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    }

    #[test]
    fn choices() {
        assert_eq!(run(json!({})), Ok(None));
        assert_eq!(run(json!({"tools": [], "tool_choice": "auto"})), Ok(None));
        assert_eq!(
            run(json!({"tools": weather(), "tool_choice": "none"})),
            Ok(None)
        );
        let auto = run(json!({"tools": weather()})).unwrap().unwrap();
        assert_eq!((auto.grammar, auto.stop), (None, None));
        let one = run(json!({"tools": weather(), "parallel_tool_calls": false}))
            .unwrap()
            .unwrap();
        assert_eq!(one.stop.as_deref(), Some("</tool_call>"));
        let req = run(json!({"tools": weather(), "tool_choice": "required"}))
            .unwrap()
            .unwrap();
        assert!(matches!(req.grammar, Some(GrammarSpec::Lark(g)) if g.contains("get_weather")));
        let named = run(json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
            .unwrap()
            .unwrap();
        assert!(
            matches!(named.grammar, Some(GrammarSpec::Lark(g)) if g.starts_with("start: call\n"))
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        let w = weather();
        for (v, field) in [
            (json!({"tools": {"a": 1}}), "tools"),
            (json!({"tools": [1]}), "tools[0]"),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]}),
                "tools[0].function.description",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]}),
                "tools[0].function.strict",
            ),
            (json!({"tools": [w[0], w[0]]}), "tools[1].function.name"),
            (
                json!({"tools": w, "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"tools": w, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": w, "tool_choice": {"type": "function"}}),
                "tool_choice",
            ),
            (json!({"tools": w, "tool_choice": 3}), "tool_choice"),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": w, "parallel_tool_calls": "no"}),
                "parallel_tool_calls",
            ),
        ] {
            assert_eq!(run(v.clone()).err().as_deref(), Some(field), "{v}");
        }
    }

    #[test]
    fn streamed_deltas_as_openai_sends_them() {
        let mut n = 0;
        let mut s = ToolStream::new(
            vec!["get_weather".into()],
            Box::new(move || {
                n += 1;
                format!("call_{n}")
            }),
        );
        let mut deltas = Vec::new();
        for piece in [
            "Sure",
            ".\n<tool_",
            "call>\n{\"name\": \"get_weather\", \"argu",
            "ments\": {\"city\"",
            ": \"Paris\"}}\n</tool_call>",
        ] {
            deltas.extend(s.push(piece));
        }
        deltas.extend(s.finish());
        let start = deltas
            .iter()
            .position(|d| d.get("tool_calls").is_some())
            .unwrap();
        let content: String = deltas[..start]
            .iter()
            .map(|d| d["content"].as_str().unwrap())
            .collect();
        assert_eq!(content, "Sure.");
        assert_eq!(
            deltas[start],
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]})
        );
        let args: String = deltas[start + 1..]
            .iter()
            .map(|d| {
                d["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(args, "{\"city\": \"Paris\"}");
        assert!(deltas.len() > 3, "{deltas:?}");
        assert_eq!(s.calls(), 1);
        let mut m = 0;
        let (msg, calls) = message(
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
            &[],
            &mut || {
                m += 1;
                format!("id{m}")
            },
        );
        assert_eq!(calls, 1);
        assert_eq!(
            msg,
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "id1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
        );
    }
}
