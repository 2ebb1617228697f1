//! A model's reasoning apart from its answer: the `<think>…</think>` block that Qwen3 and the
//! DeepSeek-R1 distills write before answering, split off as the text arrives.
//!
//! [`ReasoningSplitter`] is a small state machine over streamed text: pieces may cut the tags
//! anywhere (`"<th"`, `"ink>"`), and text that might still be the start of a tag is held back
//! until it is known. Its output matches llama.cpp's `deepseek` reasoning format:
//!
//! - the output opens with `<think>` (after optional whitespace), or the prompt already opened
//!   it (DeepSeek-R1's template ends the prompt with `<think>\n`, so the output has only
//!   `</think>`): what comes before `</think>` is the reasoning, what follows is the answer;
//! - the reasoning is trimmed of surrounding whitespace, and the whitespace between
//!   `</think>` and the answer is dropped;
//! - output that does not open with `<think>` is all answer; a block never closed is all
//!   reasoning.
//!
//! Output that opens with a harmony header (gpt-oss, `<|channel|>`) is split by
//! [`HarmonySplitter`] instead: its analysis channel is the reasoning, its final channel the
//! answer.

use super::harmony::HarmonySplitter;

/// The tags of a thinking block.
pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// A piece of split output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReasoningPiece {
    /// Text of the thinking block.
    Reasoning(String),
    /// Text of the answer.
    Content(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the output may still open a block.
    Start,
    /// Inside the block, nothing but whitespace in it yet.
    ReasoningStart,
    Reasoning,
    /// After the block, nothing but whitespace yet.
    ContentStart,
    Content,
}

/// Splits streamed output into reasoning and answer (see the module's documentation).
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    state: State,
    /// Text not yet released: a possible start of a tag, or whitespace whose place (inside
    /// the reasoning or at its end) is not known yet.
    held: String,
    /// Output that opens with a harmony header (gpt-oss: `<|channel|>analysis<|message|>…`)
    /// goes to a [`HarmonySplitter`] instead; `None` until the start decides.
    harmony: Option<HarmonySplitter>,
    /// Whether the start of the output is still being read for a harmony header.
    undecided: bool,
    pending: String,
}

/// The token a harmony answer opens with.
const HARMONY_START: &str = "<|channel|>";

/// The length of the longest tail of `s` that is a proper prefix of `tag`.
fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && s.ends_with(&tag[..k]))
        .unwrap_or(0)
}

impl ReasoningSplitter {
    /// `opened`: the prompt already opened the block (it ends with `<think>`), so the output
    /// starts inside it.
    pub fn new(opened: bool) -> ReasoningSplitter {
        ReasoningSplitter {
            state: if opened {
                State::ReasoningStart
            } else {
                State::Start
            },
            held: String::new(),
            harmony: None,
            undecided: !opened,
            pending: String::new(),
        }
    }

    /// Whether the output is inside the thinking block now.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.state, State::ReasoningStart | State::Reasoning)
    }

    /// The pieces that `text` completes (none while a possible tag is held back).
    pub fn push(&mut self, text: &str) -> Vec<ReasoningPiece> {
        if let Some(h) = self.harmony.as_mut() {
            return h.push(text);
        }
        if !self.undecided {
            return self.push_think(text);
        }
        self.pending.push_str(text);
        if self.pending.len() < HARMONY_START.len() && HARMONY_START.starts_with(&self.pending) {
            return Vec::new();
        }
        self.undecided = false;
        let start = std::mem::take(&mut self.pending);
        if start.starts_with(HARMONY_START) {
            let h = self.harmony.insert(HarmonySplitter::new());
            return h.push(&start);
        }
        self.push_think(&start)
    }

    /// [`push`](Self::push) for output with `<think>` blocks.
    fn push_think(&mut self, text: &str) -> Vec<ReasoningPiece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            let before = (self.state, self.held.len());
            self.step(&mut out);
            if (self.state, self.held.len()) == before {
                break;
            }
        }
        merge(out)
    }

    /// One transition on the held text.
    fn step(&mut self, out: &mut Vec<ReasoningPiece>) {
        match self.state {
            State::Start => {
                let rest = self.held.trim_start();
                if let Some(after) = rest.strip_prefix(THINK_OPEN) {
                    self.held = after.to_string();
                    self.state = State::ReasoningStart;
                } else if !(rest.is_empty() || THINK_OPEN.starts_with(rest)) {
                    self.state = State::Content;
                }
            }
            State::ReasoningStart | State::ContentStart => {
                let trimmed = self.held.trim_start();
                if trimmed.len() != self.held.len() {
                    self.held = trimmed.to_string();
                }
                if !self.held.is_empty() {
                    self.state = if self.state == State::ReasoningStart {
                        State::Reasoning
                    } else {
                        State::Content
                    };
                }
            }
            State::Reasoning => {
                if let Some(pos) = self.held.find(THINK_CLOSE) {
                    let thought = self.held[..pos].trim_end();
                    if !thought.is_empty() {
                        out.push(ReasoningPiece::Reasoning(thought.to_string()));
                    }
                    self.held = self.held[pos + THINK_CLOSE.len()..].to_string();
                    self.state = State::ContentStart;
                    return;
                }
                // Release all but a possible start of `</think>` and trailing whitespace
                // (which belongs to the reasoning only if more of it follows).
                let keep_tag = partial_tag(&self.held, THINK_CLOSE);
                let body = &self.held[..self.held.len() - keep_tag];
                let release = body.trim_end().len();
                if release > 0 {
                    out.push(ReasoningPiece::Reasoning(self.held[..release].to_string()));
                    self.held.drain(..release);
                }
            }
            State::Content => {
                if !self.held.is_empty() {
                    out.push(ReasoningPiece::Content(std::mem::take(&mut self.held)));
                }
            }
        }
    }

    /// The end of the output: what is still held.
    pub fn finish(&mut self) -> Vec<ReasoningPiece> {
        if let Some(h) = self.harmony.as_mut() {
            return h.finish();
        }
        let mut out = Vec::new();
        if self.undecided {
            self.undecided = false;
            let start = std::mem::take(&mut self.pending);
            out = self.push_think(&start);
        }
        out.extend(self.finish_think());
        out
    }

    fn finish_think(&mut self) -> Vec<ReasoningPiece> {
        let held = std::mem::take(&mut self.held);
        let piece = match self.state {
            // Whitespace, or an unfinished `<think>`: text after all.
            State::Start => (!held.is_empty()).then_some(ReasoningPiece::Content(held)),
            State::ReasoningStart | State::Reasoning => {
                let t = held.trim_end();
                (!t.is_empty()).then(|| ReasoningPiece::Reasoning(t.to_string()))
            }
            State::ContentStart | State::Content => {
                (!held.is_empty()).then_some(ReasoningPiece::Content(held))
            }
        };
        self.state = State::Content;
        piece.into_iter().collect()
    }
}

/// Joins neighbouring pieces of the same kind (both splitters' output).
pub(crate) fn merge(pieces: Vec<ReasoningPiece>) -> Vec<ReasoningPiece> {
    let mut out: Vec<ReasoningPiece> = Vec::with_capacity(pieces.len());
    for p in pieces {
        match (out.last_mut(), p) {
            (Some(ReasoningPiece::Reasoning(a)), ReasoningPiece::Reasoning(b))
            | (Some(ReasoningPiece::Content(a)), ReasoningPiece::Content(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out
}

/// A whole output split: `(reasoning, content)`; `None` when there was no thinking block.
pub fn split_reasoning(text: &str, opened: bool) -> (Option<String>, String) {
    let mut s = ReasoningSplitter::new(opened);
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let (mut reasoning, mut content) = (None::<String>, String::new());
    for p in pieces {
        match p {
            ReasoningPiece::Reasoning(r) => reasoning.get_or_insert_with(String::new).push_str(&r),
            ReasoningPiece::Content(c) => content.push_str(&c),
        }
    }
    if reasoning.is_none() && (opened || text.trim_start().starts_with(THINK_OPEN)) {
        reasoning = Some(String::new());
    }
    (reasoning, content)
}

/// Whether a rendered prompt leaves a thinking block open for the model (it ends with
/// `<think>` and whitespace, as DeepSeek-R1's template and Qwen3's `enable_thinking`-less
/// variants write).
pub fn prompt_opens_reasoning(prompt: &str) -> bool {
    prompt.trim_end().ends_with(THINK_OPEN)
}

/// A splitter's pieces joined: (all the reasoning, all the content). For the splitters' tests.
#[cfg(test)]
pub(crate) fn joined(pieces: Vec<ReasoningPiece>) -> (String, String) {
    let (mut r, mut c) = (String::new(), String::new());
    for p in pieces {
        match p {
            ReasoningPiece::Reasoning(t) => r.push_str(&t),
            ReasoningPiece::Content(t) => c.push_str(&t),
        }
    }
    (r, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pieces: &[&str], opened: bool) -> (String, String) {
        let mut s = ReasoningSplitter::new(opened);
        let mut out = Vec::new();
        for p in pieces {
            out.extend(s.push(p));
        }
        out.extend(s.finish());
        joined(out)
    }

    /// Every way of cutting `text` in two and three pieces gives the whole text's split.
    fn every_cut(text: &str, opened: bool, want: (&str, &str)) {
        let want = (want.0.to_string(), want.1.to_string());
        assert_eq!(run(&[text], opened), want, "whole {text:?}");
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &i in &cuts {
            assert_eq!(run(&[&text[..i], &text[i..]], opened), want, "cut at {i}");
            for &j in cuts.iter().filter(|&&j| j >= i) {
                let parts = [&text[..i], &text[i..j], &text[j..]];
                assert_eq!(run(&parts, opened), want, "cuts at {i}, {j}");
            }
        }
        // One character at a time.
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(&refs, opened), want, "char by char");
    }

    #[test]
    fn qwen3_block_on_every_cut() {
        every_cut(
            "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!",
            false,
            ("The user greets me.\nI greet back.", "Hello!"),
        );
    }

    #[test]
    fn r1_prompt_opened_the_block() {
        every_cut(
            "Let me think: 2+2=4.\n</think>\n\nIt is 4.",
            true,
            ("Let me think: 2+2=4.", "It is 4."),
        );
    }

    #[test]
    fn no_block_is_all_answer() {
        every_cut(
            "Hello <thinking> world",
            false,
            ("", "Hello <thinking> world"),
        );
        every_cut("  <thi", false, ("", "  <thi"));
        every_cut("a</think>b", false, ("", "a</think>b"));
    }

    #[test]
    fn empty_and_unclosed_blocks() {
        every_cut("<think>\n\n</think>\n\nHi", false, ("", "Hi"));
        every_cut(
            "<think>still thinking </thi",
            false,
            ("still thinking </thi", ""),
        );
        every_cut("hmm", true, ("hmm", ""));
    }

    #[test]
    fn tags_inside_text_and_tool_calls_after() {
        every_cut(
            "<think>a < b, and </ then</think>x <think> y",
            false,
            ("a < b, and </ then", "x <think> y"),
        );
        let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        every_cut(
            &format!("<think>\nI should call f.\n</think>\n\n{call}"),
            false,
            ("I should call f.", call),
        );
    }

    #[test]
    fn whole_output_split() {
        assert_eq!(
            split_reasoning("<think>r</think>c", false),
            (Some("r".into()), "c".into())
        );
        assert_eq!(split_reasoning("c", false), (None, "c".into()));
        assert_eq!(
            split_reasoning("<think></think>c", false),
            (Some(String::new()), "c".into())
        );
        assert!(prompt_opens_reasoning("<｜Assistant｜><think>\n"));
        assert!(!prompt_opens_reasoning("<|im_start|>assistant\n"));
        assert!(!prompt_opens_reasoning(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
    }
}
