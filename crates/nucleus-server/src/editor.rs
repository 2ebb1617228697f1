//! The fields editor plugins (llama.vim, llama.vscode) send to `/infill`, with llama-server's
//! meanings (`tools/server/server-context.cpp`, `server-schema.cpp`, `server-common.cpp`):
//!
//! - `n_indent`: once the output has a new line, a line whose first non-blank character comes
//!   with fewer than `n_indent` spaces or tabs before it ends the answer, cut just before that
//!   character (the completion stays inside the block being written);
//! - `t_max_predict_ms`: once generation has run that long, a token whose text has a new line
//!   ends the answer (after it), so a slow completion still ends on a whole line;
//! - `response_fields`: the final result keeps only these fields, each a `/`-separated path
//!   (`"timings/prompt_n"`), under that path as its key; a path that is not there is left out;
//! - `t_max_prompt_ms` and `cache_prompt` change nothing: llama-server does not implement the
//!   first either, and the prefix cache is always on.

use std::time::Instant;

use serde_json::{Map, Value};

use crate::ApiError;

/// `n_indent` and `t_max_predict_ms` (0: off).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EditorLimits {
    pub n_indent: usize,
    pub t_max_predict_ms: u64,
}

fn non_negative(map: &mut Map<String, Value>, field: &str) -> Result<u64, ApiError> {
    match map.remove(field) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_i64().filter(|&n| n < 0).map(|_| 0))
            .ok_or_else(|| {
                ApiError::param(
                    field,
                    format!("`{field}` = {v} must be an integer (0 or less: off)"),
                )
            }),
    }
}

impl EditorLimits {
    /// Takes the fields out of a request body (llama-server reads a negative value as off).
    pub fn take(map: &mut Map<String, Value>) -> Result<EditorLimits, ApiError> {
        let n_indent = non_negative(map, "n_indent")?;
        let t_max_predict_ms = non_negative(map, "t_max_predict_ms")?;
        // Accepted and, as in llama-server, without effect.
        map.remove("t_max_prompt_ms");
        map.remove("cache_prompt");
        Ok(EditorLimits {
            n_indent: n_indent.min(1 << 20) as usize,
            t_max_predict_ms,
        })
    }

    /// With the answer so far `before` and a new token's `text` (generation started at
    /// `t_first`): the part of `text` to keep, and whether the answer ends here.
    pub fn check<'t>(
        &self,
        before: &str,
        text: &'t str,
        t_first: Instant,
        now: Instant,
    ) -> (&'t str, bool) {
        if self.n_indent > 0 {
            if let Some(cut) = indent_cut(before, text, self.n_indent) {
                return (&text[..cut], true);
            }
        }
        let late =
            self.t_max_predict_ms > 0 && (now - t_first).as_millis() as u64 > self.t_max_predict_ms;
        (text, late && text.contains('\n'))
    }
}

/// Where in `text` (appended to `before`) the first line after a new line starts its content
/// with fewer than `n` spaces or tabs of indentation; `None` if no line does (yet).
fn indent_cut(before: &str, text: &str, n: usize) -> Option<usize> {
    let whole = format!("{before}{text}");
    let mut start = whole.find('\n')? + 1;
    loop {
        let line = &whole[start..];
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let rest = &line[indent..];
        let first = rest.chars().next();
        match first {
            // Only blanks so far: not known yet.
            None => return None,
            // An empty line says nothing about indentation.
            Some('\n') => {}
            Some(_) if indent < n => {
                let at = start + indent;
                // A cut inside what was already sent cannot be taken back (it was checked
                // when it came); only this token's part can be cut.
                return (at >= before.len()).then(|| at - before.len());
            }
            Some(_) => {}
        }
        start += indent + rest.find('\n')? + 1;
    }
}

/// `response_fields`, checked: `None` when absent or empty (the whole result).
pub fn response_fields(map: &mut Map<String, Value>) -> Result<Option<Vec<String>>, ApiError> {
    let bad = || {
        ApiError::param(
            "response_fields",
            "`response_fields` must be an array of field paths (\"timings/prompt_n\")",
        )
    };
    match map.remove("response_fields") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.is_empty() => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(bad()),
    }
}

/// llama-server's `json_get_nested_values`: each path's value under the path as its key.
pub fn pick_fields(paths: &[String], v: &Value) -> Value {
    let mut out = Map::new();
    for path in paths {
        let mut cur = Some(v);
        for key in path.split('/') {
            cur = cur.and_then(|c| c.as_object()).and_then(|o| o.get(key));
        }
        if let Some(found) = cur {
            out.insert(path.clone(), found.clone());
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    /// Feeds `pieces` one by one; the kept text and whether it stopped.
    fn run(limits: &EditorLimits, pieces: &[&str]) -> (String, bool) {
        let t0 = Instant::now();
        let mut out = String::new();
        for p in pieces {
            let (keep, stop) = limits.check(&out, p, t0, t0);
            out.push_str(keep);
            if stop {
                return (out, true);
            }
        }
        (out, false)
    }

    #[test]
    fn n_indent_cuts_the_first_less_indented_line() {
        let l = EditorLimits {
            n_indent: 4,
            ..Default::default()
        };
        // The first line (the rest of the cursor's line) is never checked.
        assert_eq!(
            run(
                &l,
                &["x = 1", "\n    y = 2\n", "\n", "  ", "  z\n", "def g():\n"]
            ),
            ("x = 1\n    y = 2\n\n    z\n".into(), true)
        );
        // Cut inside one token: the new line and the blanks stay, as in llama-server.
        assert_eq!(run(&l, &["a\n    b\n  c"]), ("a\n    b\n  ".into(), true));
        // Tabs count as one each.
        assert_eq!(
            run(&l, &["a\n\t\t\t\tb\n"]),
            ("a\n\t\t\t\tb\n".into(), false)
        );
        // Off.
        let off = EditorLimits::default();
        assert_eq!(run(&off, &["a\nb"]), ("a\nb".into(), false));
    }

    #[test]
    fn t_max_predict_ms_ends_on_a_new_line() {
        let l = EditorLimits {
            t_max_predict_ms: 100,
            ..Default::default()
        };
        let t0 = Instant::now();
        let late = t0 + Duration::from_millis(150);
        assert_eq!(l.check("", "abc", t0, late), ("abc", false));
        assert_eq!(l.check("abc", "d\n", t0, late), ("d\n", true));
        assert_eq!(l.check("abc", "d\n", t0, t0), ("d\n", false));
    }

    #[test]
    fn fields_are_read_as_llama_server_reads_them() {
        let mut m = json!({"n_indent": 4, "t_max_predict_ms": -1, "t_max_prompt_ms": 500,
                           "cache_prompt": true, "top_k": 40})
        .as_object()
        .unwrap()
        .clone();
        let l = EditorLimits::take(&mut m).unwrap();
        assert_eq!((l.n_indent, l.t_max_predict_ms), (4, 0));
        assert_eq!(m.keys().collect::<Vec<_>>(), ["top_k"]);
        let mut bad = json!({"n_indent": "four"}).as_object().unwrap().clone();
        let e = EditorLimits::take(&mut bad).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n_indent"));
    }

    #[test]
    fn response_fields_pick_paths() {
        let v = json!({"content": "x", "timings": {"prompt_n": 3}, "truncated": false});
        let paths = vec![
            "content".to_string(),
            "timings/prompt_n".into(),
            "timings/nope".into(),
            String::new(),
        ];
        assert_eq!(
            pick_fields(&paths, &v),
            json!({"content": "x", "timings/prompt_n": 3})
        );
        let mut m = json!({"response_fields": [""]})
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(response_fields(&mut m).unwrap(), Some(vec![String::new()]));
        let mut m = json!({"response_fields": "content"})
            .as_object()
            .unwrap()
            .clone();
        assert!(response_fields(&mut m).is_err());
    }
}
