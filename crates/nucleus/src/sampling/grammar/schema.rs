//! Object schemas as clients mean them: an object schema that declares `properties` and says
//! nothing of `additionalProperties` admits only those properties.
//!
//! JSON Schema's default is open (any other key allowed), but the schemas client libraries
//! send (the openai SDK's `pydantic_function_tool`, langchain's `with_structured_output`,
//! instructor) describe a model's fields and expect nothing else; a small model given an open
//! object invents keys until `max_tokens`. llama.cpp's `json-schema-to-grammar` closes such
//! objects too (a missing `additionalProperties` adds no "rest" rule), and OpenAI's strict mode
//! requires `"additionalProperties": false`. So before compiling, every object schema with
//! `properties` and no `additionalProperties` (nor `patternProperties` /
//! `unevaluatedProperties`) gets `"additionalProperties": false`. Left open: `{"type":
//! "object"}` with no `properties` (a free-form dict), objects that set
//! `"additionalProperties": true` or a schema, and the direct branches of an `allOf` (merged
//! with each other, closing one would forbid the keys of the rest).

use serde_json::{Map, Value};

/// Keywords whose value is one schema.
const ONE: &[&str] = &[
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "additionalItems",
];
/// Keywords whose value is a list of schemas.
const LIST: &[&str] = &["anyOf", "oneOf", "prefixItems"];
/// Keywords whose value maps names to schemas.
const MAP: &[&str] = &["properties", "$defs", "definitions", "patternProperties"];

/// Closes the object schemas in `schema` (see the module's documentation).
pub fn close_objects(mut schema: Value) -> Value {
    walk(&mut schema, true);
    schema
}

fn is_object_type(m: &Map<String, Value>) -> bool {
    match m.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => false,
    }
}

fn walk(v: &mut Value, close: bool) {
    let Value::Object(m) = v else { return };
    if close
        && m.get("properties").is_some_and(Value::is_object)
        && is_object_type(m)
        && !m.contains_key("additionalProperties")
        && !m.contains_key("patternProperties")
        && !m.contains_key("unevaluatedProperties")
    {
        m.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, child) in m.iter_mut() {
        let k = k.as_str();
        if ONE.contains(&k) {
            walk(child, true);
        } else if LIST.contains(&k) || k == "allOf" {
            if let Value::Array(a) = child {
                a.iter_mut().for_each(|s| walk(s, k != "allOf"));
            }
        } else if MAP.contains(&k) {
            if let Value::Object(o) = child {
                o.values_mut().for_each(|s| walk(s, true));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::close_objects;

    #[test]
    fn closes_declared_objects_only() {
        let s = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "loc": {"type": "object", "properties": {"lat": {"type": "number"}}},
                "tags": {"type": "object"},
                "extra": {"type": "object", "properties": {}, "additionalProperties": true},
                "list": {"type": "array", "items": {"properties": {"a": {}}}},
                "either": {"anyOf": [{"properties": {"b": {}}}, {"type": "null"}]},
                "both": {"allOf": [{"properties": {"c": {}}}, {"properties": {"d": {}}}]},
                // a property *named* like a keyword is data, not a schema position
                "properties": {"type": "string"}
            },
            "$defs": {"D": {"type": "object", "properties": {"x": {}}}}
        });
        let c = close_objects(s);
        let closed = |p: &serde_json::Value| p.get("additionalProperties").cloned();
        assert_eq!(closed(&c), Some(json!(false)));
        let p = &c["properties"];
        assert_eq!(closed(&p["loc"]), Some(json!(false)));
        assert_eq!(closed(&p["tags"]), None);
        assert_eq!(closed(&p["extra"]), Some(json!(true)));
        assert_eq!(closed(&p["list"]["items"]), Some(json!(false)));
        assert_eq!(closed(&p["either"]["anyOf"][0]), Some(json!(false)));
        assert_eq!(closed(&p["both"]["allOf"][0]), None);
        assert_eq!(closed(&p["properties"]), None);
        assert_eq!(closed(&c["$defs"]["D"]), Some(json!(false)));
    }

    /// The schemas the openai SDK, langchain and instructor send for one Pydantic model
    /// (tests/data/schemas, written by its capture.py with openai 2.54, langchain-openai 1.4.3,
    /// instructor 1.17): the declared object passes, an invented key does not.
    #[test]
    fn client_library_schemas_admit_only_declared_keys() {
        use super::super::tests::vocab;
        use super::super::{GrammarCompiler, GrammarSpec};
        let ok = r#"{"name": "Paris", "country": "France", "population": 2100000}"#;
        let extra =
            r#"{"name": "Paris", "country": "France", "population": 2100000, "area_km2": 105}"#;
        let tok = vocab();
        let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
        for (lib, text) in [
            (
                "openai",
                include_str!("../../../tests/data/schemas/openai.json"),
            ),
            (
                "langchain",
                include_str!("../../../tests/data/schemas/langchain.json"),
            ),
            (
                "instructor",
                include_str!("../../../tests/data/schemas/instructor.json"),
            ),
        ] {
            let schema: serde_json::Value = serde_json::from_str(text).unwrap();
            let accepts = |t: &str| {
                let mut g = compiler
                    .compile(&GrammarSpec::JsonSchema(schema.clone()))
                    .unwrap();
                let toks: Vec<u32> = t.bytes().map(|b| 3 + b as u32).collect();
                g.valid_prefix(&toks) == toks.len()
            };
            assert!(accepts(ok), "{lib}");
            assert!(!accepts(extra), "{lib}: an undeclared key passed");
        }
    }
}
