//! GBNF, llama.cpp's grammar format (`grammars/README.md` in llama.cpp), translated to
//! llguidance's Lark syntax (llguidance 1.9's Rust crate reads Lark, not GBNF).
//!
//! What is read: rules `name ::= alternatives` (names of letters, digits, `-` and `_`; `root`
//! is the start), string literals `"..."`, character classes `[...]` and `[^...]` with ranges,
//! `.` (any character), groups `( ... )`, alternatives `|` (an empty one too), repetitions
//! `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`, comments `# ...`, and the escapes `\x..`,
//! `\u....`, `\U........`, `\t`, `\n`, `\r`, `\\`, `\"`, `\[`, `\]`. A rule's body may span
//! lines: it ends where the next `name ::=` begins. llama.cpp's token references (`<[id]>`,
//! `<think>`, `!<...>`) are refused with an error.
//!
//! The translation keeps GBNF's meaning exactly: every literal character and every class is a
//! lexeme of one character, so llguidance's lexer never has to choose between two lexemes
//! (a multi-character lexeme would be matched greedily, which GBNF does not do), and all the
//! structure is in the Lark rules, which llguidance parses with Earley (any context-free
//! grammar, left recursion included).

use std::collections::HashMap;
use std::fmt::Write;

use super::GrammarError;

enum Atom {
    Lit(String),
    Class {
        neg: bool,
        ranges: Vec<(char, char)>,
    },
    Any,
    Rule(String),
    Group(Vec<Vec<Item>>),
}

struct Item {
    atom: Atom,
    /// `(min, max)`; `None` max: unbounded. `(1, Some(1))`: no repetition.
    rep: (u32, Option<u32>),
}

fn err<T>(msg: impl Into<String>) -> Result<T, GrammarError> {
    Err(GrammarError(format!("GBNF: {}", msg.into())))
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

struct Parser<'a> {
    s: &'a [char],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.pos).copied()
    }

    fn line(&self) -> usize {
        1 + self.s[..self.pos.min(self.s.len())]
            .iter()
            .filter(|c| **c == '\n')
            .count()
    }

    /// Skips whitespace (newlines included) and comments.
    fn space(&mut self) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.pos += 1;
                }
            } else if c.is_whitespace() {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self.peek().is_some_and(is_word) {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.s[start..self.pos].iter().collect())
    }

    /// At `name ::=` (the start of the next rule)?
    fn at_rule_start(&mut self) -> bool {
        let save = self.pos;
        let found = self.name().is_some() && {
            self.space();
            self.s[self.pos..].starts_with(&[':', ':', '='])
        };
        self.pos = save;
        found
    }

    fn hex(&mut self, n: usize) -> Result<char, GrammarError> {
        let digits: String = self
            .s
            .get(self.pos..self.pos + n)
            .unwrap_or(&[])
            .iter()
            .collect();
        self.pos += n;
        u32::from_str_radix(&digits, 16)
            .ok()
            .filter(|_| digits.len() == n)
            .and_then(char::from_u32)
            .map_or_else(
                || err(format!("line {}: bad escape \\{digits}", self.line())),
                Ok,
            )
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<char, GrammarError> {
        let Some(c) = self.peek() else {
            return err("unexpected end of grammar");
        };
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let Some(e) = self.peek() else {
            return err("unexpected end of grammar after `\\`");
        };
        self.pos += 1;
        Ok(match e {
            'x' => self.hex(2)?,
            'u' => self.hex(4)?,
            'U' => self.hex(8)?,
            't' => '\t',
            'n' => '\n',
            'r' => '\r',
            '\\' | '"' | '[' | ']' => e,
            _ => return err(format!("line {}: unknown escape `\\{e}`", self.line())),
        })
    }

    fn alternates(&mut self, nested: bool) -> Result<Vec<Vec<Item>>, GrammarError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Item>, GrammarError> {
        let mut items = Vec::new();
        loop {
            self.space();
            let atom = match self.peek() {
                None | Some('|') => break,
                Some(')') if nested => break,
                Some('"') => {
                    self.pos += 1;
                    let mut s = String::new();
                    while self.peek() != Some('"') {
                        if self.peek().is_none() {
                            return err("unterminated string literal");
                        }
                        s.push(self.char()?);
                    }
                    self.pos += 1;
                    Atom::Lit(s)
                }
                Some('[') => self.class()?,
                Some('.') => {
                    self.pos += 1;
                    Atom::Any
                }
                Some('(') => {
                    self.pos += 1;
                    let alts = self.alternates(true)?;
                    if self.peek() != Some(')') {
                        return err(format!("line {}: expected `)`", self.line()));
                    }
                    self.pos += 1;
                    Atom::Group(alts)
                }
                Some(c) if is_word(c) => {
                    if !nested && self.at_rule_start() {
                        break;
                    }
                    Atom::Rule(self.name().unwrap_or_default())
                }
                Some('<') | Some('!') => {
                    return err(format!(
                        "line {}: token references (`<...>`) are not supported",
                        self.line()
                    ))
                }
                Some(c) => return err(format!("line {}: unexpected `{c}`", self.line())),
            };
            self.space();
            let rep = self.repetition()?;
            items.push(Item { atom, rep });
        }
        Ok(items)
    }

    fn class(&mut self) -> Result<Atom, GrammarError> {
        self.pos += 1; // '['
        let neg = self.peek() == Some('^');
        self.pos += neg as usize;
        let mut ranges = Vec::new();
        while self.peek() != Some(']') {
            let lo = self.char()?;
            let mut hi = lo;
            if self.peek() == Some('-') && self.s.get(self.pos + 1) != Some(&']') {
                self.pos += 1;
                hi = self.char()?;
            }
            if hi < lo {
                return err(format!("line {}: class range {lo:?}-{hi:?}", self.line()));
            }
            ranges.push((lo, hi));
        }
        self.pos += 1;
        Ok(Atom::Class { neg, ranges })
    }

    fn number(&mut self) -> Option<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        self.s[start..self.pos]
            .iter()
            .collect::<String>()
            .parse()
            .ok()
    }

    fn repetition(&mut self) -> Result<(u32, Option<u32>), GrammarError> {
        let rep = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.pos += 1;
                self.space();
                let lo = self.number();
                self.space();
                let rep = if self.peek() == Some(',') {
                    self.pos += 1;
                    self.space();
                    (lo.unwrap_or(0), self.number())
                } else {
                    let Some(n) = lo else {
                        return err(format!("line {}: bad repetition", self.line()));
                    };
                    (n, Some(n))
                };
                self.space();
                if self.peek() != Some('}') || rep.1.is_some_and(|hi| hi < rep.0) {
                    return err(format!("line {}: bad repetition", self.line()));
                }
                rep
            }
            _ => return Ok((1, Some(1))),
        };
        self.pos += 1;
        Ok(rep)
    }
}

/// Does `text` define a GBNF rule (a line starting `name ::=`)? Lark never does: it is how a
/// field that takes either tells them apart.
pub fn looks_like_gbnf(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        let n = l
            .chars()
            .take_while(|c| is_word(*c))
            .map(char::len_utf8)
            .sum::<usize>();
        n > 0 && l[n..].trim_start().starts_with("::=")
    })
}

/// Translates a GBNF grammar (start rule `root`) to llguidance's Lark syntax.
pub fn gbnf_to_lark(src: &str) -> Result<String, GrammarError> {
    let chars: Vec<char> = src.chars().collect();
    let mut p = Parser { s: &chars, pos: 0 };
    let mut rules: Vec<(String, Vec<Vec<Item>>)> = Vec::new();
    loop {
        p.space();
        if p.peek().is_none() {
            break;
        }
        let Some(name) = p.name() else {
            return err(format!("line {}: expected a rule name", p.line()));
        };
        p.space();
        if !p.s[p.pos..].starts_with(&[':', ':', '=']) {
            return err(format!("line {}: expected `::=` after `{name}`", p.line()));
        }
        p.pos += 3;
        let alts = p.alternates(false)?;
        if rules.iter().any(|r| r.0 == name) {
            return err(format!("rule `{name}` is defined twice"));
        }
        rules.push((name, alts));
    }
    // Lark rule names: lower case, `_` for `-`, unique.
    let mut names: HashMap<&str, String> = HashMap::new();
    for (name, _) in &rules {
        let base = format!("g_{}", name.to_lowercase().replace('-', "_"));
        let mut n = base.clone();
        let mut i = 2;
        while names.values().any(|v| *v == n) {
            n = format!("{base}_{i}");
            i += 1;
        }
        names.insert(name, n);
    }
    let Some(root) = names.get("root") else {
        return err("no `root` rule");
    };
    let mut out = format!("start: {root}\n");
    for (name, alts) in &rules {
        let body = emit_alts(alts, &names)?;
        let _ = writeln!(out, "{}: {body}", names[name.as_str()]);
    }
    Ok(out)
}

fn emit_alts(alts: &[Vec<Item>], names: &HashMap<&str, String>) -> Result<String, GrammarError> {
    let mut parts = Vec::new();
    let mut empty = false;
    for seq in alts {
        let items = seq
            .iter()
            .map(|i| emit_item(i, names))
            .collect::<Result<Vec<_>, _>>()?;
        let s = items
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        if s.is_empty() {
            empty = true;
        } else {
            parts.push(s);
        }
    }
    Ok(match (parts.is_empty(), empty) {
        (true, _) => "\"\"".into(),
        (false, false) => parts.join(" | "),
        (false, true) => format!("({})?", parts.join(" | ")),
    })
}

/// A regex class item: `\x{..}` escapes, so nothing in it is special to regex or Lark.
fn class_char(c: char) -> String {
    format!("\\x{{{:X}}}", c as u32)
}

fn emit_item(it: &Item, names: &HashMap<&str, String>) -> Result<String, GrammarError> {
    let (atom, single) = match &it.atom {
        Atom::Lit(s) if s.is_empty() => return Ok(String::new()),
        Atom::Lit(s) => {
            let chars: Vec<String> = s
                .chars()
                .map(|c| serde_json::to_string(&c.to_string()).unwrap_or_default())
                .collect();
            (chars.join(" "), chars.len() == 1)
        }
        Atom::Class { neg, ranges } => {
            if ranges.is_empty() {
                if !neg {
                    return err("an empty character class `[]` matches nothing");
                }
                ("/(?s:.)/".to_string(), true)
            } else {
                let mut r = String::from(if *neg { "/[^" } else { "/[" });
                for &(lo, hi) in ranges {
                    r.push_str(&class_char(lo));
                    if hi != lo {
                        r.push('-');
                        r.push_str(&class_char(hi));
                    }
                }
                r.push_str("]/");
                (r, true)
            }
        }
        Atom::Any => ("/(?s:.)/".to_string(), true),
        Atom::Rule(n) => match names.get(n.as_str()) {
            Some(l) => (l.clone(), true),
            None => return err(format!("rule `{n}` is used but not defined")),
        },
        Atom::Group(alts) => {
            let body = emit_alts(alts, names)?;
            if body == "\"\"" {
                return Ok(String::new());
            }
            (format!("({body})"), true)
        }
    };
    let wrap = |a: &str| {
        if single {
            a.to_string()
        } else {
            format!("({a})")
        }
    };
    Ok(match it.rep {
        (1, Some(1)) => atom,
        (_, Some(0)) => String::new(),
        (0, None) => format!("{}*", wrap(&atom)),
        (1, None) => format!("{}+", wrap(&atom)),
        (0, Some(1)) => format!("{}?", wrap(&atom)),
        (m, None) => format!("{}{{{m},}}", wrap(&atom)),
        (m, Some(n)) if m == n => format!("{}{{{m}}}", wrap(&atom)),
        (m, Some(n)) => format!("{}{{{m},{n}}}", wrap(&atom)),
    })
}

#[cfg(test)]
#[path = "gbnf_tests.rs"]
mod tests;
