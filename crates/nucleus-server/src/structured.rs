//! Structured output: the request fields that constrain the output to a grammar, checked and
//! turned into the sampler's [`GrammarSpec`]. At most one of them may be set.
//!
//! - `response_format`: `{"type": "text"}` (nothing), `{"type": "json_object"}` (any JSON
//!   object), `{"type": "json_schema", "json_schema": {"name", "schema", "strict",
//!   "description"}}` (a value valid against `schema`; enforced whether `strict` is true or not);
//! - `grammar` (llama-server's field): a GBNF grammar, llama.cpp's format (start rule `root`);
//!   a text with no `name ::=` rule is read as Lark in llguidance's syntax, as this field was
//!   before GBNF; `json_schema` (llama-server's: a schema object);
//! - vLLM's `guided_json` (a schema, as an object or a JSON string), `guided_regex`,
//!   `guided_grammar` (always Lark: the name of its own for Lark grammars).
//!
//! Object schemas that declare `properties` and say nothing of `additionalProperties` admit
//! only those properties, as llama.cpp reads them (see `nucleus::sampling::close_objects`).
//!
//! Whether the grammar compiles is found out when the request is submitted; the error names the
//! field ([`field_error`]).

use serde_json::Value;

use nucleus::sampling::{GrammarSpec, SamplingError};

use crate::api::ApiRequest;
use crate::ApiError;

/// A constraint and the field that asked for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Constraint {
    pub spec: GrammarSpec,
    pub field: &'static str,
}

fn is_unset(v: &Option<Value>) -> bool {
    matches!(v, None | Some(Value::Null))
}

/// A schema must be a JSON object (or `true`/`false`, which llguidance also takes).
fn schema(field: &'static str, v: &Value) -> Result<GrammarSpec, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(GrammarSpec::JsonSchema(v.clone())),
        _ => Err(ApiError::param(
            field,
            format!("`{field}` must hold a JSON Schema object"),
        )),
    }
}

fn response_format(v: &Value) -> Result<Option<GrammarSpec>, ApiError> {
    const F: &str = "response_format";
    let o = v
        .as_object()
        .ok_or_else(|| ApiError::param(F, "`response_format` must be an object with a `type`"))?;
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => {
            let js = o
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    ApiError::param(
                        F,
                        "`response_format.json_schema` must be an object with `name` and `schema`",
                    )
                })?;
            match js.get("name") {
                Some(Value::String(n))
                    if !n.is_empty()
                        && n.len() <= 64
                        && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') => {}
                _ => {
                    return Err(ApiError::param(
                        F,
                        "`response_format.json_schema.name` must be 1 to 64 letters, digits, `_` or `-`",
                    ))
                }
            }
            if !matches!(
                js.get("strict"),
                None | Some(Value::Null) | Some(Value::Bool(_))
            ) {
                return Err(ApiError::param(
                    F,
                    "`response_format.json_schema.strict` must be a boolean",
                ));
            }
            match js.get("schema") {
                // No schema: any JSON value.
                None | Some(Value::Null) => Ok(Some(GrammarSpec::JsonSchema(Value::Object(
                    Default::default(),
                )))),
                Some(s) => schema(F, s).map(Some),
            }
        }
        Some(t) => Err(ApiError::param(
            F,
            format!("`response_format.type` {t:?} is not one of text, json_object, json_schema"),
        )),
        None => Err(ApiError::param(F, "`response_format.type` is required")),
    }
}

fn text_field(field: &'static str, v: &Value) -> Result<Option<String>, ApiError> {
    match v {
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        _ => Err(ApiError::param(
            field,
            format!("`{field}` must be a string"),
        )),
    }
}

/// `grammar`'s text: GBNF when it defines a rule with `::=`, else Lark.
fn grammar_field(text: String) -> GrammarSpec {
    if nucleus::sampling::grammar::looks_like_gbnf(&text) {
        GrammarSpec::Gbnf(text)
    } else {
        GrammarSpec::Lark(text)
    }
}

/// The request's constraint, if it sets one; a 400 naming the field for a malformed value or a
/// second constraint.
pub fn constraint(req: &ApiRequest) -> Result<Option<Constraint>, ApiError> {
    let mut found: Vec<Constraint> = Vec::new();
    let mut add = |field: &'static str, spec: Option<GrammarSpec>| {
        if let Some(spec) = spec {
            found.push(Constraint { spec, field });
        }
    };
    if let Some(v) = req.response_format.as_ref().filter(|v| !v.is_null()) {
        add("response_format", response_format(v)?);
    }
    if let Some(v) = req.grammar.as_ref().filter(|v| !v.is_null()) {
        add("grammar", text_field("grammar", v)?.map(grammar_field));
    }
    if !is_unset(&req.json_schema) {
        let v = req.json_schema.as_ref().expect("set");
        add("json_schema", Some(schema("json_schema", v)?));
    }
    if let Some(v) = req.guided_json.as_ref().filter(|v| !v.is_null()) {
        let spec = match v {
            Value::String(s) => {
                let parsed: Value = serde_json::from_str(s).map_err(|e| {
                    ApiError::param("guided_json", format!("`guided_json` is not JSON: {e}"))
                })?;
                schema("guided_json", &parsed)?
            }
            other => schema("guided_json", other)?,
        };
        add("guided_json", Some(spec));
    }
    if let Some(v) = req.guided_regex.as_ref().filter(|v| !v.is_null()) {
        add(
            "guided_regex",
            text_field("guided_regex", v)?.map(GrammarSpec::Regex),
        );
    }
    if let Some(v) = req.guided_grammar.as_ref().filter(|v| !v.is_null()) {
        add(
            "guided_grammar",
            text_field("guided_grammar", v)?.map(GrammarSpec::Lark),
        );
    }
    if found.len() > 1 {
        return Err(ApiError::param(
            found[1].field,
            format!(
                "`{}` and `{}` both constrain the output: send one",
                found[0].field, found[1].field
            ),
        ));
    }
    Ok(found.pop())
}

/// A submission error about the grammar, as a 400 naming the field that set it.
pub fn field_error(field: &str, e: &SamplingError) -> Option<ApiError> {
    match e {
        SamplingError::Grammar(msg) => Some(
            ApiError::param(field, format!("`{field}` cannot be used: {msg}"))
                .with_code("invalid_grammar"),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(v: Value) -> Result<Option<Constraint>, String> {
        let req: ApiRequest = serde_json::from_value(v).unwrap();
        constraint(&req).map_err(|e| format!("{}: {}", e.param.unwrap_or_default(), e.message))
    }

    #[test]
    fn fields_become_grammars() {
        assert_eq!(run(json!({})), Ok(None));
        assert_eq!(run(json!({"response_format": {"type": "text"}})), Ok(None));
        assert_eq!(
            run(json!({"response_format": {"type": "json_object"}})),
            Ok(Some(Constraint {
                spec: GrammarSpec::JsonObject,
                field: "response_format"
            }))
        );
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let rf = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a_b-1", "schema": s, "strict": true}}});
        assert_eq!(
            run(rf).unwrap().unwrap().spec,
            GrammarSpec::JsonSchema(s.clone())
        );
        let g = run(json!({"guided_json": s.to_string()})).unwrap().unwrap();
        assert_eq!(
            (g.spec, g.field),
            (GrammarSpec::JsonSchema(s), "guided_json")
        );
        assert_eq!(
            run(json!({"grammar": "start: \"x\""}))
                .unwrap()
                .unwrap()
                .spec,
            GrammarSpec::Lark("start: \"x\"".into())
        );
        assert_eq!(
            run(json!({"guided_regex": "[0-9]+"}))
                .unwrap()
                .unwrap()
                .spec,
            GrammarSpec::Regex("[0-9]+".into())
        );
        assert_eq!(
            run(json!({"grammar": "root ::= [0-9]+"}))
                .unwrap()
                .unwrap()
                .spec,
            GrammarSpec::Gbnf("root ::= [0-9]+".into())
        );
        assert_eq!(
            run(json!({"guided_grammar": "start: \"x\""}))
                .unwrap()
                .unwrap()
                .spec,
            GrammarSpec::Lark("start: \"x\"".into())
        );
        assert_eq!(run(json!({"grammar": ""})), Ok(None));
    }

    #[test]
    fn bad_values_name_the_field() {
        for (v, field) in [
            (json!({"response_format": "json"}), "response_format"),
            (
                json!({"response_format": {"type": "xml"}}),
                "response_format",
            ),
            (json!({"response_format": {}}), "response_format"),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}}}),
                "response_format",
            ),
            (json!({"grammar": 5}), "grammar"),
            (json!({"json_schema": "x"}), "json_schema"),
            (json!({"guided_json": "{"}), "guided_json"),
            (json!({"guided_regex": ["a"]}), "guided_regex"),
            (
                json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}),
                "guided_regex",
            ),
        ] {
            let e = run(v.clone()).expect_err(&v.to_string());
            assert!(e.starts_with(&format!("{field}: ")), "{v}: {e}");
        }
    }
}
