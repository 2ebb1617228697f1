//! Tool calls in the Hermes / Qwen2.5 syntax: rendering them back into a conversation (see
//! [`ToolCall`] in [`Message`](super::Message)), the grammar that forces a call, and parsing
//! the model's output, as it streams, into text and calls.
//!
//! The model writes each call as
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! [`ToolCallParser`] turns the streamed text into [`ToolEvent`]s: text outside the blocks,
//! then for each call its name as soon as `{"name": "…", "arguments": ` is complete, and the
//! arguments' JSON text in fragments as it comes (without the object's closing brace and the
//! closing tag, which are held back until they can be told apart). A block that does not have
//! that shape is parsed whole at its closing tag (`{"arguments": …, "name": …}` works too), and
//! if it is not a call at all it is given back as text.
//!
//! Small models often leave the tags out and answer with the bare call object(s),
//! `{"name": "get_weather", "arguments": {...}}`. With [`ToolCallParser::bare_calls`], an
//! output that begins with `{` is held to its end and taken as calls when it is nothing but
//! such objects naming known tools (as text otherwise).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";

/// A call the assistant made, as a template renders it (`arguments` as a JSON value: the
/// templates write it with `tojson`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: Value,
}

/// A function the model may call: its name and the JSON Schema of its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// `None`: any object.
    pub parameters: Option<Value>,
}

/// A Lark grammar (llguidance's syntax) for the model's output when it must call a tool: one
/// call of one of `tools`, or with `parallel` one or more, each call's arguments valid against
/// that tool's parameter schema.
pub fn forced_call_grammar(tools: &[ToolSpec], parallel: bool) -> String {
    let alternatives: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": t.name},
                    // Closed as `response_format` schemas are (see `close_objects`).
                    "arguments": t.parameters.clone().map_or_else(
                        || json!({"type": "object"}),
                        crate::sampling::grammar::close_objects,
                    ),
                },
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = json!({
        "anyOf": alternatives,
        "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
    });
    let start = if parallel {
        "start: call (\"\\n\" call)*"
    } else {
        "start: call"
    };
    format!("{start}\ncall: \"{CALL_OPEN}\\n\" body \"\\n{CALL_CLOSE}\"\nbody: %json {schema}\n")
}

/// What the parser made of the streamed text.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolEvent {
    /// Text outside the calls.
    Text(String),
    /// Call number `index` (from 0) begins: its function's name.
    Start { index: usize, name: String },
    /// More of call `index`'s arguments (JSON text; all fragments together are the object).
    Args { index: usize, text: String },
}

#[derive(Debug)]
enum State {
    Text,
    /// Inside a block, reading `{"name": "…", "arguments": `.
    Header,
    /// Streaming the arguments of the current call.
    Args,
    /// Inside a block whose head is not the usual one: parsed whole at the closing tag.
    Whole,
    /// An output that begins with `{`, held to its end (see `bare_calls`).
    Bare,
}

/// The incremental parser: see the [module docs](self).
#[derive(Debug)]
pub struct ToolCallParser {
    state: State,
    /// Text not yet given out.
    buf: String,
    /// Whitespace held after text (dropped before a call, given out before more text).
    ws: String,
    /// The whitespace before the current block (text again if the block is not a call).
    block_ws: String,
    calls: usize,
    /// Arguments text given out for the current call.
    args_out: usize,
    /// Tool names for untagged calls (`None`: only tagged blocks are calls).
    bare: Option<Vec<String>>,
    /// Text was given out.
    started: bool,
}

impl Default for ToolCallParser {
    fn default() -> Self {
        Self::new()
    }
}

/// The length of the longest suffix of `s` that begins `tag` (a tag that may be coming).
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

enum Head {
    /// The name, and the bytes the head took.
    Done(String, usize),
    Partial,
    Not,
}

/// Reads `ws* { ws* "name" ws* : ws* "…" ws* , ws* "arguments" ws* : ws*` at the start of `s`.
fn parse_head(s: &str) -> Head {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Matches `lit` at i: Some(true) matched, Some(false) mismatch, None: input ends first.
    let lit = |i: &mut usize, lit: &str| -> Option<bool> {
        let l = lit.as_bytes();
        let n = l.len().min(b.len() - *i);
        if b[*i..*i + n] != l[..n] {
            return Some(false);
        }
        if n < l.len() {
            return None;
        }
        *i += n;
        Some(true)
    };
    macro_rules! expect {
        ($l:expr) => {
            ws(&mut i);
            match lit(&mut i, $l) {
                Some(true) => {}
                Some(false) => return Head::Not,
                None => return Head::Partial,
            }
        };
    }
    expect!("{");
    expect!("\"name\"");
    expect!(":");
    ws(&mut i);
    if i >= b.len() {
        return Head::Partial;
    }
    if b[i] != b'"' {
        return Head::Not;
    }
    let start = i;
    i += 1;
    loop {
        match b.get(i) {
            None => return Head::Partial,
            Some(b'\\') => i += 2,
            Some(b'"') => break,
            Some(_) => i += 1,
        }
    }
    i += 1;
    let Ok(name) = serde_json::from_str::<String>(&s[start..i]) else {
        return Head::Not;
    };
    expect!(",");
    expect!("\"arguments\"");
    expect!(":");
    ws(&mut i);
    if i >= b.len() {
        return Head::Partial;
    }
    Head::Done(name, i)
}

impl ToolCallParser {
    pub fn new() -> ToolCallParser {
        ToolCallParser {
            state: State::Text,
            buf: String::new(),
            ws: String::new(),
            block_ws: String::new(),
            calls: 0,
            args_out: 0,
            bare: None,
            started: false,
        }
    }

    /// Also take an output made only of untagged call objects naming one of `names` as calls
    /// (see the [module docs](self)); such an output is given out at its end.
    pub fn bare_calls(mut self, names: Vec<String>) -> ToolCallParser {
        self.bare = Some(names);
        self
    }

    /// The bare call objects `text` is made of, if it is nothing else.
    fn parse_bare(&self, text: &str) -> Option<Vec<(String, Value)>> {
        let names = self.bare.as_ref()?;
        let mut out = Vec::new();
        for v in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
            let v = v.ok()?;
            let name = v.get("name")?.as_str()?;
            let args = v.get("arguments")?;
            if !names.iter().any(|n| n == name) || !args.is_object() || v.as_object()?.len() != 2 {
                return None;
            }
            out.push((name.to_string(), args.clone()));
        }
        (!out.is_empty()).then_some(out)
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn text(&mut self, out: &mut Vec<ToolEvent>, t: &str) {
        if t.is_empty() {
            return;
        }
        // Whitespace is held at the end of text: it goes before more text, not before a call.
        let body = t.trim_end();
        if !body.is_empty() {
            self.started = true;
            let mut s = std::mem::take(&mut self.ws);
            s.push_str(body);
            out.push(ToolEvent::Text(s));
        }
        self.ws.push_str(&t[body.len()..]);
    }

    /// Feeds the next piece of output text; returns what it completes.
    pub fn push(&mut self, piece: &str) -> Vec<ToolEvent> {
        self.buf.push_str(piece);
        let mut out = Vec::new();
        loop {
            let progressed = match self.state {
                State::Text => self.step_text(&mut out),
                State::Header => self.step_header(&mut out),
                State::Args => self.step_args(&mut out),
                State::Whole => self.step_whole(&mut out),
                State::Bare => false,
            };
            if !progressed {
                return out;
            }
        }
    }

    fn step_text(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        if self.bare.is_some() && !self.started && self.calls == 0 {
            match self.buf.trim_start().chars().next() {
                Some('{') => {
                    self.state = State::Bare;
                    return false;
                }
                None => return false,
                Some(_) => {}
            }
        }
        if let Some(p) = self.buf.find(CALL_OPEN) {
            let before = self.buf[..p].to_string();
            self.text(out, &before);
            self.block_ws = std::mem::take(&mut self.ws);
            self.buf.drain(..p + CALL_OPEN.len());
            self.state = State::Header;
            return true;
        }
        let keep = partial_tag(&self.buf, CALL_OPEN);
        let give = self.buf.len() - keep;
        let t = self.buf[..give].to_string();
        self.text(out, &t);
        self.buf.drain(..give);
        false
    }

    fn step_header(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        match parse_head(&self.buf) {
            Head::Done(name, used) => {
                out.push(ToolEvent::Start {
                    index: self.calls,
                    name,
                });
                self.calls += 1;
                self.buf.drain(..used);
                self.args_out = 0;
                self.state = State::Args;
                true
            }
            Head::Partial if !self.buf.contains(CALL_CLOSE) => false,
            _ => {
                self.state = State::Whole;
                true
            }
        }
    }

    fn step_args(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        let index = self.calls - 1;
        if let Some(p) = self.buf.find(CALL_CLOSE) {
            // The block ends: the arguments are what precedes the outer object's `}`.
            let body = self.buf[..p].trim_end();
            let args = body.strip_suffix('}').unwrap_or(body).trim_end();
            if args.len() > self.args_out {
                out.push(ToolEvent::Args {
                    index,
                    text: args[self.args_out..].to_string(),
                });
            }
            self.buf.drain(..p + CALL_CLOSE.len());
            self.state = State::Text;
            return true;
        }
        // Hold back what may be the end: the last `}` and anything after it that could still
        // be whitespace and the closing tag; or a trailing part of the tag.
        let mut hold = self.buf.len() - partial_tag(&self.buf, CALL_CLOSE);
        hold = self.buf[..hold].trim_end().len();
        if let Some(brace) = self.buf[..hold].rfind('}') {
            if self.buf[brace + 1..hold].trim().is_empty() {
                hold = self.buf[..brace].trim_end().len();
            }
        }
        if hold > self.args_out {
            out.push(ToolEvent::Args {
                index,
                text: self.buf[self.args_out..hold].to_string(),
            });
            self.args_out = hold;
        }
        false
    }

    fn step_whole(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        let Some(p) = self.buf.find(CALL_CLOSE) else {
            return false;
        };
        let body = self.buf[..p].to_string();
        self.buf.drain(..p + CALL_CLOSE.len());
        self.state = State::Text;
        self.close_block(out, &body, CALL_CLOSE);
        true
    }

    /// A block whose body is `body`, parsed whole: a call, or else text again (with `close`,
    /// the closing tag if it came).
    /// A call parsed whole: its start, then all its arguments at once.
    fn whole_call(&mut self, out: &mut Vec<ToolEvent>, name: String, args: &Value) {
        let index = self.calls;
        self.calls += 1;
        out.push(ToolEvent::Start { index, name });
        out.push(ToolEvent::Args {
            index,
            text: args.to_string(),
        });
    }

    fn close_block(&mut self, out: &mut Vec<ToolEvent>, body: &str, close: &str) {
        let call = serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| {
                let name = v.get("name")?.as_str()?.to_string();
                let args = v.get("arguments")?.clone();
                Some((name, args))
            });
        match call {
            Some((name, args)) => self.whole_call(out, name, &args),
            None => {
                self.ws = std::mem::take(&mut self.block_ws);
                let t = format!("{CALL_OPEN}{body}{close}");
                self.text(out, &t);
            }
        }
    }

    /// The output ended: gives out what was held. A call whose closing tag never came ends
    /// with what arrived of its arguments; a block that had not become a call is text.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        match self.state {
            State::Text => {
                let t = std::mem::take(&mut self.buf);
                self.text(&mut out, &t);
            }
            State::Args => {
                self.buf.push_str(CALL_CLOSE);
                self.step_args(&mut out);
            }
            State::Header | State::Whole => {
                let body = std::mem::take(&mut self.buf);
                self.close_block(&mut out, &body, "");
            }
            State::Bare => {
                let text = std::mem::take(&mut self.buf);
                match self.parse_bare(&text) {
                    Some(calls) => {
                        for (name, args) in calls {
                            self.whole_call(&mut out, name, &args);
                        }
                    }
                    None => {
                        // Not calls: parse it as any other output.
                        self.bare = None;
                        self.state = State::Text;
                        out.extend(self.push(&text));
                        out.extend(self.finish());
                        return out;
                    }
                }
            }
        }
        self.state = State::Text;
        if self.calls == 0 && !self.ws.is_empty() {
            out.push(ToolEvent::Text(std::mem::take(&mut self.ws)));
        }
        out
    }
}

/// Parses a whole output: its text (outside the calls, trimmed; `None` when empty) and its calls
/// as `(name, arguments JSON text)`; only tagged blocks are calls.
pub fn parse_tool_calls(output: &str) -> (Option<String>, Vec<(String, String)>) {
    parse_with(ToolCallParser::new(), output)
}

/// [`parse_tool_calls`] with a parser set up as wanted (e.g. [`ToolCallParser::bare_calls`]).
pub fn parse_with(mut p: ToolCallParser, output: &str) -> (Option<String>, Vec<(String, String)>) {
    let mut events = p.push(output);
    events.extend(p.finish());
    let mut text = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Text(t) => text.push_str(&t),
            ToolEvent::Start { name, .. } => calls.push((name, String::new())),
            ToolEvent::Args { index, text } => calls[index].1.push_str(&text),
        }
    }
    let text = if calls.is_empty() {
        Some(text).filter(|t| !t.is_empty())
    } else {
        Some(text.trim().to_string()).filter(|t| !t.is_empty())
    };
    (text, calls)
}

#[cfg(test)]
mod tests;
