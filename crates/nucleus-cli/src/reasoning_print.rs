//! How `nucleus chat` prints a reasoning model's answer: the thinking block (split off by the
//! library's [`ReasoningSplitter`], the same one the server uses for `reasoning_content`) is
//! shown apart from the answer, hidden, or left in the text as the model wrote it.

use std::io::Write;

use nucleus::chat::{ReasoningPiece, ReasoningSplitter};

/// `--reasoning`: what `chat` does with a thinking block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningMode {
    /// Print it apart from the answer: dimmed on a colour terminal, else between
    /// `Thinking...` and `...done thinking.` lines.
    #[default]
    Show,
    /// Do not print it (it is still generated, and kept out of the conversation's answer).
    Hide,
    /// Print the model's text as it is, tags and all; the answer in the conversation keeps it.
    Raw,
}

impl ReasoningMode {
    pub fn name(self) -> &'static str {
        match self {
            ReasoningMode::Show => "show",
            ReasoningMode::Hide => "hide",
            ReasoningMode::Raw => "raw",
        }
    }

    /// `/set reasoning VALUE`.
    pub fn parse(value: &str) -> anyhow::Result<ReasoningMode> {
        match value {
            "show" => Ok(ReasoningMode::Show),
            "hide" => Ok(ReasoningMode::Hide),
            "raw" => Ok(ReasoningMode::Raw),
            _ => anyhow::bail!("reasoning: {value:?} must be show, hide or raw"),
        }
    }
}

/// ANSI "faint" and "reset": each reasoning piece is wrapped on its own, so the terminal is
/// never left dim (by Ctrl-C, or by an error mid-answer).
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";
/// Ollama's words around thinking on a terminal without colour (or a pipe).
const OPEN_PLAIN: &str = "Thinking...\n";
const CLOSE_PLAIN: &str = "\n...done thinking.\n\n";

/// One answer's printer. `push` each streamed piece of text, then `finish`.
pub struct AnswerPrinter {
    /// `None`: the text is printed as it comes (raw mode, or a model with no reasoning mode).
    splitter: Option<ReasoningSplitter>,
    mode: ReasoningMode,
    color: bool,
    /// Whether reasoning was printed and not yet closed (by the answer or the end).
    in_thought: bool,
    /// Whether any reasoning was printed.
    thought: bool,
    reasoning: String,
    content: String,
}

impl AnswerPrinter {
    /// `reasons`: the chat template has a reasoning mode; `opened`: the prompt left a
    /// thinking block open; `color`: stdout is a terminal that takes ANSI colour.
    pub fn new(mode: ReasoningMode, reasons: bool, opened: bool, color: bool) -> AnswerPrinter {
        let split = reasons && mode != ReasoningMode::Raw;
        AnswerPrinter {
            splitter: split.then(|| ReasoningSplitter::new(opened)),
            mode,
            color,
            in_thought: false,
            thought: false,
            reasoning: String::new(),
            content: String::new(),
        }
    }

    /// Prints what `text` completes.
    pub fn push(&mut self, out: &mut impl Write, text: &str) {
        match self.splitter.as_mut() {
            None => {
                self.content.push_str(text);
                let _ = out.write_all(text.as_bytes());
            }
            Some(s) => {
                let pieces = s.push(text);
                self.print(out, pieces);
            }
        }
        let _ = out.flush();
    }

    /// The end of the answer: prints what the splitter held back and closes the reasoning.
    pub fn finish(&mut self, out: &mut impl Write) {
        if let Some(s) = self.splitter.as_mut() {
            let pieces = s.finish();
            self.print(out, pieces);
        }
        self.close_thought(out);
        let _ = out.flush();
    }

    /// The answer's reasoning (`None` when none was split off) and its content, for the
    /// conversation.
    pub fn into_parts(self) -> (Option<String>, String) {
        let reasoning = (!self.reasoning.is_empty()).then_some(self.reasoning);
        (reasoning, self.content)
    }

    fn print(&mut self, out: &mut impl Write, pieces: Vec<ReasoningPiece>) {
        for p in pieces {
            match p {
                ReasoningPiece::Reasoning(r) => {
                    self.reasoning.push_str(&r);
                    if self.mode == ReasoningMode::Hide {
                        continue;
                    }
                    if !self.in_thought && !self.color {
                        let _ = out.write_all(OPEN_PLAIN.as_bytes());
                    }
                    self.in_thought = true;
                    self.thought = true;
                    let _ = if self.color {
                        write!(out, "{DIM}{r}{RESET}")
                    } else {
                        out.write_all(r.as_bytes())
                    };
                }
                ReasoningPiece::Content(c) => {
                    self.close_thought(out);
                    self.content.push_str(&c);
                    let _ = out.write_all(c.as_bytes());
                }
            }
        }
    }

    fn close_thought(&mut self, out: &mut impl Write) {
        if self.in_thought {
            self.in_thought = false;
            let end = if self.color { "\n\n" } else { CLOSE_PLAIN };
            let _ = out.write_all(end.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = "<think>\nThe user greets me.\n</think>\n\nHello!";

    /// Prints `text` streamed in pieces of `step` bytes (on char boundaries).
    fn stream(
        text: &str,
        step: usize,
        mode: ReasoningMode,
        reasons: bool,
        opened: bool,
        color: bool,
    ) -> (String, (Option<String>, String)) {
        let mut p = AnswerPrinter::new(mode, reasons, opened, color);
        let mut out = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + step).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            p.push(&mut out, &text[i..j]);
            i = j;
        }
        p.finish(&mut out);
        (String::from_utf8(out).unwrap(), p.into_parts())
    }

    fn every_step(
        text: &str,
        mode: ReasoningMode,
        reasons: bool,
        opened: bool,
        color: bool,
        want: &str,
    ) -> (Option<String>, String) {
        // Whole, the text prints exactly `want`; in smaller pieces, the same but for where the
        // colour codes fall.
        let (whole, parts) = stream(text, text.len(), mode, reasons, opened, color);
        assert_eq!(whole, want, "{mode:?} color {color}");
        for step in 1..text.len() {
            let (printed, p) = stream(text, step, mode, reasons, opened, color);
            // Each piece is dimmed apart, so compare with the codes taken out.
            let plain = |s: &str| s.replace(DIM, "").replace(RESET, "");
            assert_eq!(plain(&printed), plain(want), "step {step}");
            assert_eq!(p, parts, "step {step}");
        }
        parts
    }

    #[test]
    fn shown_dimmed_on_a_colour_terminal() {
        let parts = every_step(
            QWEN3,
            ReasoningMode::Show,
            true,
            false,
            true,
            "\x1b[2mThe user greets me.\x1b[0m\n\nHello!",
        );
        assert_eq!(parts, (Some("The user greets me.".into()), "Hello!".into()));
    }

    #[test]
    fn shown_between_words_without_colour() {
        every_step(
            QWEN3,
            ReasoningMode::Show,
            true,
            false,
            false,
            "Thinking...\nThe user greets me.\n...done thinking.\n\nHello!",
        );
    }

    #[test]
    fn hidden_but_kept_apart() {
        let parts = every_step(QWEN3, ReasoningMode::Hide, true, false, true, "Hello!");
        assert_eq!(parts, (Some("The user greets me.".into()), "Hello!".into()));
    }

    #[test]
    fn raw_is_the_model_text() {
        let parts = every_step(QWEN3, ReasoningMode::Raw, true, false, true, QWEN3);
        assert_eq!(parts, (None, QWEN3.to_string()));
    }

    #[test]
    fn prompt_opened_block_and_unclosed_block() {
        // DeepSeek-R1: the prompt ends with `<think>\n`; the output has only `</think>`.
        every_step(
            "2+2=4.\n</think>\n\nIt is 4.",
            ReasoningMode::Show,
            true,
            true,
            false,
            "Thinking...\n2+2=4.\n...done thinking.\n\nIt is 4.",
        );
        // Stopped (max tokens, Ctrl-C) while thinking: the block is still closed on screen.
        let parts = every_step(
            "<think>still going",
            ReasoningMode::Show,
            true,
            false,
            true,
            "\x1b[2mstill going\x1b[0m\n\n",
        );
        assert_eq!(parts, (Some("still going".into()), String::new()));
    }

    #[test]
    fn a_model_without_reasoning_prints_its_text() {
        // A coder model that writes `<think>` as code is not split.
        let text = "let s = \"<think>x</think>\";";
        let parts = every_step(text, ReasoningMode::Show, false, false, true, text);
        assert_eq!(parts, (None, text.to_string()));
    }

    #[test]
    fn set_values() {
        assert_eq!(ReasoningMode::parse("hide").unwrap(), ReasoningMode::Hide);
        let e = ReasoningMode::parse("dim").unwrap_err().to_string();
        assert!(
            e.contains("\"dim\"") && e.contains("show, hide or raw"),
            "{e}"
        );
    }
}
