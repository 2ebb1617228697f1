//! The `tojson` filter as Hugging Face's templates get it: Python's
//! `json.dumps(value, ensure_ascii=False)` (`", "` between items, `": "` after keys, keys in
//! their order, no HTML escaping), or with `indent=N` the indented form.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter, Serializer};

/// `json.dumps`'s default separators on one line.
struct PyFormatter;

impl Formatter for PyFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let r = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let mut ser =
                Serializer::with_formatter(&mut out, PrettyFormatter::with_indent(pad.as_bytes()));
            value.serialize(&mut ser)
        }
        None => value.serialize(&mut Serializer::with_formatter(&mut out, PyFormatter)),
    };
    r.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let s = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(s))
}

#[cfg(test)]
mod tests {
    use crate::chat::{ChatTemplate, Message};

    #[test]
    fn like_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ tools[0] | tojson }}|{{ messages[0] | tojson(indent=1) }}",
            "",
            "",
        )
        .unwrap();
        let tool = serde_json::json!({"type": "function", "function": {"name": "f<x>", "z": [1, 2.5, "é"], "a": null}});
        let out = t
            .render_with_tools(&[Message::new("user", "hi")], Some(&[tool]), false)
            .unwrap();
        assert_eq!(
            out,
            "{\"type\": \"function\", \"function\": {\"name\": \"f<x>\", \"z\": [1, 2.5, \"é\"], \"a\": null}}|{\n \"role\": \"user\",\n \"content\": \"hi\"\n}"
        );
    }
}
