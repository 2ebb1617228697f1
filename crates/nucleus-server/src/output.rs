//! A chat answer's text as it streams, split into what each API shows apart: the reasoning
//! (a thinking block, see [`nucleus::chat::reasoning`]), the text of the answer, and its tool
//! calls (see [`crate::tools`]). Chat completions, Anthropic's Messages and OpenAI's Responses
//! all format these same pieces.

use nucleus::chat::{ReasoningPiece, ReasoningSplitter, ToolCallParser, ToolEvent};

/// A piece of an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Text(String),
    /// A tool call begins (`index` counts the calls from 0).
    CallStart {
        index: usize,
        name: String,
    },
    /// More of a call's arguments (JSON text).
    CallArgs {
        index: usize,
        text: String,
    },
}

/// Splits one choice's streamed text into [`Piece`]s.
pub struct OutputParser {
    reasoning: Option<ReasoningSplitter>,
    tools: Option<ToolCallParser>,
}

impl OutputParser {
    /// `reasoning`: split off a thinking block (`Some(opened)`: the prompt opened it);
    /// `tools`: parse tool calls (the tools' names, whose untagged call objects count too).
    pub fn new(reasoning: Option<bool>, tools: Option<Vec<String>>) -> OutputParser {
        OutputParser {
            reasoning: reasoning.map(ReasoningSplitter::new),
            tools: tools.map(|names| ToolCallParser::new().bare_calls(names)),
        }
    }

    /// Tool calls begun so far.
    pub fn calls(&self) -> usize {
        self.tools.as_ref().map_or(0, ToolCallParser::calls)
    }

    fn content(&mut self, text: String, out: &mut Vec<Piece>) {
        match self.tools.as_mut() {
            None => out.push(Piece::Text(text)),
            Some(p) => out.extend(p.push(&text).into_iter().map(piece)),
        }
    }

    fn route(&mut self, pieces: Vec<ReasoningPiece>) -> Vec<Piece> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                ReasoningPiece::Reasoning(r) => out.push(Piece::Reasoning(r)),
                ReasoningPiece::Content(c) => self.content(c, &mut out),
            }
        }
        out.retain(|p| !matches!(p, Piece::Text(t) | Piece::Reasoning(t) if t.is_empty()));
        out
    }

    /// The pieces that `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let pieces = match self.reasoning.as_mut() {
            Some(r) => r.push(text),
            None => vec![ReasoningPiece::Content(text.to_string())],
        };
        self.route(pieces)
    }

    /// The pieces held until the end.
    pub fn finish(&mut self) -> Vec<Piece> {
        let pieces = self
            .reasoning
            .as_mut()
            .map(ReasoningSplitter::finish)
            .unwrap_or_default();
        let mut out = self.route(pieces);
        if let Some(p) = self.tools.as_mut() {
            out.extend(p.finish().into_iter().map(piece));
        }
        out.retain(|p| !matches!(p, Piece::Text(t) if t.is_empty()));
        out
    }

    /// A whole answer: its reasoning (`None` without a thinking block), text (`None` when
    /// empty and there are calls) and calls (name, arguments JSON).
    pub fn whole(mut self, text: &str) -> Answer {
        let mut pieces = self.push(text);
        pieces.extend(self.finish());
        let mut a = Answer::default();
        for p in pieces {
            match p {
                Piece::Reasoning(r) => a.reasoning.get_or_insert_with(String::new).push_str(&r),
                Piece::Text(t) => a.text.push_str(&t),
                Piece::CallStart { name, .. } => a.calls.push((name, String::new())),
                Piece::CallArgs { index, text } => {
                    if let Some(c) = a.calls.get_mut(index) {
                        c.1.push_str(&text);
                    }
                }
            }
        }
        a
    }
}

/// A whole answer, split.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    pub reasoning: Option<String>,
    pub text: String,
    pub calls: Vec<(String, String)>,
}

impl Answer {
    /// The text as sent: see [`text_beside_calls`].
    pub fn body(&self) -> String {
        text_beside_calls(&self.text, !self.calls.is_empty())
    }
}

/// An answer's text, trimmed when it comes with tool calls (the white space the model puts
/// around them is not part of what it says).
pub fn text_beside_calls(text: &str, calls: bool) -> String {
    if calls {
        text.trim().to_string()
    } else {
        text.to_string()
    }
}

fn piece(e: ToolEvent) -> Piece {
    match e {
        ToolEvent::Text(t) => Piece::Text(t),
        ToolEvent::Start { index, name } => Piece::CallStart { index, name },
        ToolEvent::Args { index, text } => Piece::CallArgs { index, text },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_then_a_call() {
        let out = "<think>\nCall it.\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let a = OutputParser::new(Some(false), Some(vec!["f".into()])).whole(out);
        assert_eq!(a.reasoning.as_deref(), Some("Call it."));
        assert_eq!(a.text, "");
        assert_eq!(a.calls, vec![("f".to_string(), "{\"a\": 1}".to_string())]);
        // Streamed in small pieces: the same.
        let mut p = OutputParser::new(Some(false), Some(vec!["f".into()]));
        let mut pieces = Vec::new();
        for c in out.as_bytes().chunks(3) {
            pieces.extend(p.push(std::str::from_utf8(c).unwrap()));
        }
        pieces.extend(p.finish());
        let reasoning: String = pieces
            .iter()
            .filter_map(|x| match x {
                Piece::Reasoning(r) => Some(r.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(reasoning, "Call it.");
        assert!(matches!(&pieces[0], Piece::Reasoning(_)), "{pieces:?}");
        assert!(pieces
            .iter()
            .any(|x| matches!(x, Piece::CallStart { index: 0, name } if name == "f")));
        assert_eq!(p.calls(), 1);
    }

    #[test]
    fn without_reasoning_the_think_tags_are_text() {
        let a = OutputParser::new(None, None).whole("<think>x</think>y");
        assert_eq!(a.reasoning, None);
        assert_eq!(a.text, "<think>x</think>y");
    }
}
