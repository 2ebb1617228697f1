//! gpt-oss's reasoning, in OpenAI's harmony format: the answer is a series of messages, each a
//! header then a body,
//!
//! ```text
//! <|channel|>analysis<|message|>The user asks ...<|end|>
//! <|start|>assistant<|channel|>final<|message|>It is 4.<|return|>
//! ```
//!
//! (the prompt ends with `<|start|>assistant`, so the first header has no `<|start|>`). The
//! `analysis` channel's bodies are the reasoning, the `final` channel's the answer; any other
//! message (the `commentary` channel, where tool calls go) is passed on whole, header and end
//! tag included, as answer text for the tool-call parser. Output that does not open with a
//! header (`<|channel|>` or `<|start|>`, after whitespace) is all answer.
//!
//! [`HarmonySplitter`] works on streamed text as [`super::ReasoningSplitter`] does (a tag cut
//! across pieces is held back until known) and gives the same [`ReasoningPiece`]s. The tags
//! must be in the text: decode with special tokens kept.

use super::reasoning::{merge, ReasoningPiece};

const MESSAGE: &str = "<|message|>";
/// The tags that end a message's body.
const ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Content,
    /// Another channel: passed on whole, as answer text.
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A message's header, up to `<|message|>`.
    Header,
    Body(Kind),
    /// Not harmony: everything is answer.
    Plain,
}

/// Splits streamed harmony output into reasoning and answer (see the module's documentation).
#[derive(Clone, Debug)]
pub struct HarmonySplitter {
    state: State,
    held: String,
    /// Whether a header was seen (the first decides between harmony and plain text).
    started: bool,
}

impl Default for HarmonySplitter {
    fn default() -> Self {
        Self::new()
    }
}

/// The length of the longest tail of `s` that is a proper prefix of one of `tags`.
fn partial_tail(s: &str, tags: &[&str]) -> usize {
    tags.iter()
        .map(|tag| {
            (1..tag.len().min(s.len() + 1))
                .rev()
                .find(|&k| s.is_char_boundary(s.len() - k) && s.ends_with(&tag[..k]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

impl HarmonySplitter {
    pub fn new() -> HarmonySplitter {
        HarmonySplitter {
            state: State::Header,
            held: String::new(),
            started: false,
        }
    }

    /// The pieces that `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<ReasoningPiece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        merge(out)
    }

    /// One transition; `false` when it needs more text.
    fn step(&mut self, out: &mut Vec<ReasoningPiece>) -> bool {
        match self.state {
            State::Plain => {
                if !self.held.is_empty() {
                    out.push(ReasoningPiece::Content(std::mem::take(&mut self.held)));
                }
                false
            }
            State::Header => {
                if !self.started {
                    let t = self.held.trim_start();
                    let opens = ["<|channel|>", "<|start|>"];
                    if opens.iter().any(|o| t.starts_with(o)) {
                        self.started = true;
                    } else if opens.iter().any(|o| o.starts_with(t)) {
                        return false; // empty, or the start of a header: not known yet
                    } else {
                        self.state = State::Plain;
                        return true;
                    }
                }
                let Some(pos) = self.held.find(MESSAGE) else {
                    return false;
                };
                let header = &self.held[..pos];
                let kind = if header.contains("<|channel|>analysis") {
                    Kind::Reasoning
                } else if header.contains("<|channel|>final") {
                    Kind::Content
                } else {
                    Kind::Other
                };
                if kind == Kind::Other {
                    let raw = self.held[..pos + MESSAGE.len()].to_string();
                    out.push(ReasoningPiece::Content(raw));
                }
                self.held.drain(..pos + MESSAGE.len());
                self.state = State::Body(kind);
                true
            }
            State::Body(kind) => {
                let end = ENDS
                    .iter()
                    .filter_map(|e| self.held.find(e).map(|p| (p, e.len())))
                    .min();
                let (release, consumed) = match end {
                    Some((p, len)) => (p, Some(p + len)),
                    None => (self.held.len() - partial_tail(&self.held, &ENDS), None),
                };
                if release > 0 {
                    out.push(piece(kind, self.held[..release].to_string()));
                }
                match consumed {
                    Some(c) => {
                        if kind == Kind::Other {
                            out.push(ReasoningPiece::Content(self.held[release..c].to_string()));
                        }
                        self.held.drain(..c);
                        self.state = State::Header;
                        true
                    }
                    None => {
                        self.held.drain(..release);
                        false
                    }
                }
            }
        }
    }

    /// The end of the output: what is still held.
    pub fn finish(&mut self) -> Vec<ReasoningPiece> {
        let held = std::mem::take(&mut self.held);
        let kind = match self.state {
            State::Body(kind) => kind,
            // An unfinished header (or plain text) is text after all; a lone `<|start|>`
            // after the last message is nothing.
            State::Header if self.started && held.trim() == "<|start|>assistant" => return vec![],
            State::Header | State::Plain => Kind::Content,
        };
        self.state = State::Plain;
        if held.is_empty() {
            return vec![];
        }
        vec![piece(kind, held)]
    }
}

fn piece(kind: Kind, text: String) -> ReasoningPiece {
    match kind {
        Kind::Reasoning => ReasoningPiece::Reasoning(text),
        Kind::Content | Kind::Other => ReasoningPiece::Content(text),
    }
}

/// A whole harmony output split: `(reasoning, content)`; `None` when it had no analysis.
pub fn split_harmony(text: &str) -> (Option<String>, String) {
    let mut s = HarmonySplitter::new();
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let (mut reasoning, mut content) = (None::<String>, String::new());
    for p in pieces {
        match p {
            ReasoningPiece::Reasoning(r) => reasoning.get_or_insert_with(String::new).push_str(&r),
            ReasoningPiece::Content(c) => content.push_str(&c),
        }
    }
    (reasoning, content)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pieces: &[&str]) -> (String, String) {
        let mut s = HarmonySplitter::new();
        let mut out = Vec::new();
        for p in pieces {
            out.extend(s.push(p));
        }
        out.extend(s.finish());
        super::super::reasoning::joined(out)
    }

    /// Every cut in two and three pieces, and char by char, gives the whole text's split.
    fn every_cut(text: &str, want: (&str, &str)) {
        let want = (want.0.to_string(), want.1.to_string());
        assert_eq!(run(&[text]), want, "whole");
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &i in &cuts {
            assert_eq!(run(&[&text[..i], &text[i..]]), want, "cut at {i}");
            for &j in cuts.iter().filter(|&&j| j >= i).step_by(3) {
                assert_eq!(
                    run(&[&text[..i], &text[i..j], &text[j..]]),
                    want,
                    "cuts at {i}, {j}"
                );
            }
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(&refs), want, "char by char");
    }

    #[test]
    fn analysis_then_final() {
        // The shape of OpenAI's harmony guide's example answer.
        every_cut(
            "<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. \
             Provide answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
            (
                "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.",
                "2 + 2 = 4.",
            ),
        );
    }

    #[test]
    fn a_tool_call_on_commentary_stays_whole() {
        let call = "<|start|>assistant<|channel|>commentary to=functions.get_weather \
                    <|constrain|>json<|message|>{\"location\":\"Paris\"}<|call|>";
        every_cut(
            &format!("<|channel|>analysis<|message|>Need weather.<|end|>{call}"),
            ("Need weather.", call),
        );
    }

    #[test]
    fn plain_text_and_unfinished_output() {
        every_cut("Hello <|channel|> there", ("", "Hello <|channel|> there"));
        every_cut(
            "<|channel|>analysis<|message|>still thinking <|en",
            ("still thinking <|en", ""),
        );
        every_cut("<|channel|>final<|message|>Hi", ("", "Hi"));
        assert_eq!(split_harmony("Hi"), (None, "Hi".into()));
        assert_eq!(
            split_harmony("<|channel|>analysis<|message|>r<|end|><|start|>assistant"),
            (Some("r".into()), String::new())
        );
    }
}
