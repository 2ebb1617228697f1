//! Stop conditions and the streaming hold-back buffer.
//!
//! Generation ends on an end-of-generation token (unless ignored), on a stop string, or after
//! `max_new_tokens`. Stop strings are matched on decoded *text*, so they may span token
//! boundaries ("\n\nUser:" can arrive as "\n", "\nUs", "er:"). The streamed text must never show
//! a stop string, nor any piece of one that a later token completes, so [`StopChecker`] holds
//! back the longest tail of the text that is a prefix of some stop string, and only that.
//!
//! Why that is enough: if a stop string started inside text already emitted and ended after it,
//! then at emission time the text from its start to the end was a tail of the text and a prefix
//! of the stop string — which would have been held back. So a complete match can only start in
//! the held text, and only the held text has to be searched.

use super::TokenId;

/// Why generation ended (OpenAI's `finish_reason`). The one type for the whole crate:
/// [`crate::engine`] re-exports it. Serialized as `"stop"` / `"length"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_new_tokens` reached, or the end of the context window.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What one new piece of text (or one token) gives the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is safe to stream now (may be empty while a partial stop string is held).
    pub text: String,
    /// `Some` when generation must end here; `text` is then the last of it.
    pub finish: Option<FinishReason>,
}

/// Stop-string matcher over streamed text.
#[derive(Clone, Debug, Default)]
pub struct StopChecker {
    stops: Vec<String>,
    held: String,
    emitted: String,
    matched: Option<usize>,
}

impl StopChecker {
    /// Empty stop strings are ignored (they would match before any text).
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Self {
        StopChecker {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            ..Default::default()
        }
    }

    /// Add decoded text. Returns the text safe to emit now and `finish: Some(Stop)` when a stop
    /// string completed (the text before it is emitted, the stop string and anything after it
    /// are dropped). After a stop, further pushes return nothing.
    pub fn push(&mut self, piece: &str) -> StopStep {
        if self.matched.is_some() {
            return StopStep {
                text: String::new(),
                finish: Some(FinishReason::Stop),
            };
        }
        self.held.push_str(piece);
        // Earliest complete match (lowest start; among equal starts, the first listed).
        let hit = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|pos| (pos, i)))
            .min();
        if let Some((pos, i)) = hit {
            self.matched = Some(i);
            let text = self.held[..pos].to_string();
            self.held.clear();
            self.emitted.push_str(&text);
            return StopStep {
                text,
                finish: Some(FinishReason::Stop),
            };
        }
        let keep = self.partial_match_len();
        let text: String = self.held.drain(..self.held.len() - keep).collect();
        self.emitted.push_str(&text);
        StopStep { text, finish: None }
    }

    /// Longest tail of the held text that is a proper prefix of some stop string.
    fn partial_match_len(&self) -> usize {
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(self.held.len());
            for k in (best + 1..=max).rev() {
                if s.is_char_boundary(k) && self.held.ends_with(&s[..k]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }

    /// Generation ended for another reason (EOS, length): the held text was not a stop string
    /// after all, release it.
    pub fn flush(&mut self) -> String {
        let text = std::mem::take(&mut self.held);
        self.emitted.push_str(&text);
        text
    }

    /// Everything emitted so far; after a stop, the final text (truncated before the stop
    /// string).
    pub fn text(&self) -> &str {
        &self.emitted
    }

    /// The stop string that ended generation, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Text held back right now (a possible start of a stop string).
    pub fn held(&self) -> &str {
        &self.held
    }
}

/// All stop conditions of one request: EOS tokens, stop strings, max new tokens.
#[derive(Clone, Debug)]
pub struct StopConditions {
    /// End-of-generation tokens (EOS, `<|eot_id|>`, ...). Their text is never emitted.
    pub eos: Vec<TokenId>,
    /// Treat EOS tokens as ordinary tokens (benchmarks).
    pub ignore_eos: bool,
    /// Stop after this many generated tokens (`usize::MAX`: no limit).
    pub max_new_tokens: usize,
    checker: StopChecker,
    generated: usize,
    finished: Option<FinishReason>,
}

impl StopConditions {
    pub fn new<S: Into<String>>(
        eos: Vec<TokenId>,
        ignore_eos: bool,
        stop_strings: impl IntoIterator<Item = S>,
        max_new_tokens: usize,
    ) -> Self {
        StopConditions {
            eos,
            ignore_eos,
            max_new_tokens,
            checker: StopChecker::new(stop_strings),
            generated: 0,
            finished: None,
        }
    }

    /// Feed one generated token and its decoded text piece. A stop string beats the length
    /// limit when both happen on the same token.
    pub fn on_token(&mut self, token: TokenId, piece: &str) -> StopStep {
        if let Some(f) = self.finished {
            return StopStep {
                text: String::new(),
                finish: Some(f),
            };
        }
        self.generated += 1;
        let mut step = if !self.ignore_eos && self.eos.contains(&token) {
            StopStep {
                text: self.checker.flush(),
                finish: Some(FinishReason::Stop),
            }
        } else {
            self.checker.push(piece)
        };
        if step.finish.is_none() && self.generated >= self.max_new_tokens {
            step.text.push_str(&self.checker.flush());
            step.finish = Some(FinishReason::Length);
        }
        self.finished = step.finish;
        step
    }

    /// End generation now for a reason found outside (the context window is full, the
    /// request was cancelled): the held text is released (it did not become a stop string).
    /// Does nothing if already finished.
    pub fn finish_now(&mut self, reason: FinishReason) -> StopStep {
        if let Some(f) = self.finished {
            return StopStep {
                text: String::new(),
                finish: Some(f),
            };
        }
        self.finished = Some(reason);
        StopStep {
            text: self.checker.flush(),
            finish: Some(reason),
        }
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finished
    }

    /// The full text emitted so far (final text once finished).
    pub fn text(&self) -> &str {
        self.checker.text()
    }

    pub fn checker(&self) -> &StopChecker {
        &self.checker
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Push pieces, collecting the streamed text; returns (streamed, finish).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<FinishReason>, StopChecker) {
        let mut c = StopChecker::new(stops.iter().copied());
        let mut out = String::new();
        for p in pieces {
            let s = c.push(p);
            out.push_str(&s.text);
            // The invariant: nothing streamed so far ever contains a stop string.
            for st in stops.iter().filter(|s| !s.is_empty()) {
                assert!(!out.contains(st), "leaked {st:?} in {out:?}");
            }
            if s.finish.is_some() {
                return (out, s.finish, c);
            }
        }
        out.push_str(&c.flush());
        (out, None, c)
    }

    #[test]
    fn stop_string_split_across_tokens() {
        let (out, fin, c) = run(&["\n\nUser:"], &["Hello", "\n", "\nUs", "er:", " more"]);
        assert_eq!(out, "Hello");
        assert_eq!(fin, Some(FinishReason::Stop));
        assert_eq!(c.text(), "Hello");
        assert_eq!(c.matched(), Some("\n\nUser:"));
    }

    #[test]
    fn partial_prefix_is_held_then_released() {
        let mut c = StopChecker::new(["STOP"]);
        assert_eq!(c.push("abc S").text, "abc ");
        assert_eq!(c.held(), "S");
        assert_eq!(c.push("T").text, "");
        assert_eq!(c.held(), "ST");
        // "STx" cannot become "STOP" any more: released.
        let s = c.push("x");
        assert_eq!(s.text, "STx");
        assert_eq!(s.finish, None);
        assert_eq!(c.held(), "");
    }

    #[test]
    fn hold_only_the_part_that_could_still_match() {
        // "aab" : tail "a" could start "ab"? stop is "ab": held "aa" -> only last "a" held.
        let mut c = StopChecker::new(["ab"]);
        assert_eq!(c.push("aa").text, "a");
        assert_eq!(c.held(), "a");
        let s = c.push("b");
        assert_eq!(s.text, "");
        assert_eq!(s.finish, Some(FinishReason::Stop));
        assert_eq!(c.text(), "a");
    }

    #[test]
    fn stop_inside_one_piece_truncates_and_ignores_rest() {
        let (out, fin, _) = run(&["###"], &["foo ### bar"]);
        assert_eq!(out, "foo ");
        assert_eq!(fin, Some(FinishReason::Stop));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (out, fin, c) = run(&["world", "lo w"], &["hel", "lo", " wor", "ld"]);
        assert_eq!(out, "hel");
        assert_eq!(fin, Some(FinishReason::Stop));
        assert_eq!(c.matched(), Some("lo w"));
    }

    #[test]
    fn no_stop_streams_everything() {
        let (out, fin, _) = run(&["zzz"], &["a", "z", "zb", "c"]);
        assert_eq!(out, "azzbc");
        assert_eq!(fin, None);
        let (out, _, _) = run(&[], &["a", "b"]);
        assert_eq!(out, "ab");
        let (out, _, _) = run(&[""], &["a", "b"]); // empty stop string ignored
        assert_eq!(out, "ab");
    }

    #[test]
    fn multibyte_text_and_stops() {
        // Stop string with a multi-byte char; partial prefix must end on a char boundary.
        let (out, fin, _) = run(&["é!"], &["caf", "é", "!", "x"]);
        assert_eq!(out, "caf");
        assert_eq!(fin, Some(FinishReason::Stop));
        let (out, fin, _) = run(&["日本語"], &["私は日", "本人"]);
        assert_eq!(out, "私は日本人");
        assert_eq!(fin, None);
    }

    #[test]
    fn every_split_of_a_text_gives_the_same_result() {
        let text = "The answer is 42.\nObservation: done";
        let stops = ["\nObservation:", "Obs!"];
        for a in 1..text.len() {
            for b in a..text.len() {
                let pieces = [&text[..a], &text[a..b], &text[b..]];
                let (out, fin, _) = run(&stops, &pieces);
                assert_eq!(out, "The answer is 42.", "split {a} {b}");
                assert_eq!(fin, Some(FinishReason::Stop));
            }
        }
    }

    #[test]
    fn conditions_eos_length_and_stop() {
        // EOS: held text is released, EOS text not shown.
        let mut s = StopConditions::new(vec![2], false, ["END"], 100);
        assert_eq!(s.on_token(5, "hi E").text, "hi ");
        let st = s.on_token(2, "</s>");
        assert_eq!(st.text, "E");
        assert_eq!(st.finish, Some(FinishReason::Stop));
        assert_eq!(s.text(), "hi E");
        // ignore_eos: the EOS piece is ordinary text.
        let mut s = StopConditions::new(vec![2], true, Vec::<String>::new(), 2);
        assert_eq!(s.on_token(2, "<eos>").finish, None);
        let st = s.on_token(2, "<eos>");
        assert_eq!(st.finish, Some(FinishReason::Length));
        assert_eq!(s.text(), "<eos><eos>");
        // length: held partial stop string is flushed.
        let mut s = StopConditions::new(vec![], false, ["END"], 2);
        assert_eq!(s.on_token(7, "a").text, "a");
        let st = s.on_token(8, "EN");
        assert_eq!(st.text, "EN");
        assert_eq!(st.finish, Some(FinishReason::Length));
        assert_eq!(s.finish_reason(), Some(FinishReason::Length));
        // stop string on the last allowed token: reason is stop, not length.
        let mut s = StopConditions::new(vec![], false, ["END"], 2);
        s.on_token(7, "xE");
        let st = s.on_token(8, "ND");
        assert_eq!(st.finish, Some(FinishReason::Stop));
        assert_eq!(s.text(), "x");
        assert_eq!(s.generated(), 2);
        // after finishing, nothing more comes out.
        assert_eq!(s.on_token(9, "zz").text, "");
    }
}
