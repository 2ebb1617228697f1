use super::*;

/// Feeds `s` in pieces of `n` bytes (on char boundaries); returns every event.
fn stream(s: &str, n: usize) -> Vec<ToolEvent> {
    let mut p = ToolCallParser::new();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let mut j = (i + n).min(s.len());
        while !s.is_char_boundary(j) {
            j += 1;
        }
        out.extend(p.push(&s[i..j]));
        i = j;
    }
    out.extend(p.finish());
    out
}

/// (text, [(name, args)]) from events.
fn gather(events: &[ToolEvent]) -> (String, Vec<(String, String)>) {
    let mut text = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Text(t) => text.push_str(t),
            ToolEvent::Start { index, name } => {
                assert_eq!(*index, calls.len(), "calls start in order");
                calls.push((name.clone(), String::new()));
            }
            ToolEvent::Args { index, text } => {
                assert!(*index + 1 == calls.len(), "arguments follow their start");
                calls[*index].1.push_str(text);
            }
        }
    }
    (text, calls)
}

const ONE: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2], \"note\": \"a } b\"}}\n</tool_call>";

#[test]
fn one_call_with_text_before_it() {
    let (text, calls) = parse_tool_calls(ONE);
    assert_eq!(text.as_deref(), Some("Let me check."));
    assert_eq!(
        calls,
        vec![(
            "get_weather".to_string(),
            "{\"city\": \"Paris\", \"days\": [1, 2], \"note\": \"a } b\"}".to_string()
        )]
    );
    let v: Value = serde_json::from_str(&calls[0].1).unwrap();
    assert_eq!(v["city"], "Paris");
}

#[test]
fn streamed_in_any_pieces_gives_the_same_and_streams_arguments() {
    let whole = gather(&stream(ONE, usize::MAX));
    for n in 1..12 {
        let events = stream(ONE, n);
        assert_eq!(gather(&events), whole, "pieces of {n}");
        // The arguments come in several fragments, none with the closing tag.
        let frags: Vec<&String> = events
            .iter()
            .filter_map(|e| match e {
                ToolEvent::Args { text, .. } => Some(text),
                _ => None,
            })
            .collect();
        if n < 4 {
            assert!(frags.len() > 3, "{n}: {frags:?}");
        }
        assert!(frags.iter().all(|f| !f.contains('<')), "{frags:?}");
    }
}

#[test]
fn parallel_calls_and_trailing_text() {
    let s = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": \"é\"}}\n</tool_call>\nDone.";
    for n in [1, 2, 5, 1000] {
        let (text, calls) = gather(&stream(s, n));
        assert_eq!(text.trim(), "Done.");
        assert_eq!(
            calls,
            vec![
                ("a".into(), "{}".into()),
                ("b".into(), "{\"x\": \"é\"}".into())
            ]
        );
    }
}

#[test]
fn other_shapes_and_non_calls() {
    // Arguments first: parsed whole at the closing tag.
    let (_, calls) = parse_tool_calls(
        "<tool_call>{\"arguments\": {\"q\": 1}, \"name\": \"search\"}</tool_call>",
    );
    assert_eq!(calls, vec![("search".into(), "{\"q\":1}".into())]);
    // Not a call: the block is text.
    let s = "See <tool_call>not json</tool_call> here";
    assert_eq!(parse_tool_calls(s), (Some(s.to_string()), vec![]));
    // No call at all: the text as it is, whitespace included.
    let s = "  Hello <tool_call> {\"name\": 1";
    assert_eq!(parse_tool_calls(s), (Some(s.to_string()), vec![]));
    let s = "  Hello <tool\n";
    assert_eq!(parse_tool_calls(s), (Some(s.to_string()), vec![]));
    assert_eq!(gather(&stream(s, 1)).0, s);
    // A call cut short (a stop string at the closing tag): what came of the arguments.
    let (_, calls) =
        parse_tool_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n");
    assert_eq!(calls, vec![("f".into(), "{\"a\": 1}".into())]);
}

#[test]
fn forced_grammar_names_every_tool() {
    let tools = [
        ToolSpec {
            name: "a".into(),
            parameters: Some(json!({"type": "object", "properties": {"x": {"type": "integer"}}})),
        },
        ToolSpec {
            name: "b".into(),
            parameters: None,
        },
    ];
    let g = forced_call_grammar(&tools, true);
    assert!(g.starts_with("start: call (\"\\n\" call)*\n"), "{g}");
    assert!(
        g.contains("{\"const\":\"a\"}") && g.contains("{\"const\":\"b\"}"),
        "{g}"
    );
    assert!(forced_call_grammar(&tools, false).starts_with("start: call\n"));
}

#[test]
fn bare_call_objects_when_asked() {
    let names = vec!["get_weather".to_string(), "f".to_string()];
    let bare = || ToolCallParser::new().bare_calls(names.clone());
    let s = " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n{\"name\": \"f\", \"arguments\": {}}";
    assert_eq!(
        parse_with(bare(), s),
        (
            None,
            vec![
                ("get_weather".into(), "{\"city\":\"Paris\"}".into()),
                ("f".into(), "{}".into())
            ]
        )
    );
    // Without bare_calls, or naming an unknown tool, or with more: text.
    assert_eq!(parse_tool_calls(s).1, vec![]);
    for t in [
        "{\"name\": \"nope\", \"arguments\": {}}",
        "{\"name\": \"f\", \"arguments\": {}} and more",
        "{\"city\": \"Paris\"}",
    ] {
        assert_eq!(parse_with(bare(), t), (Some(t.to_string()), vec![]), "{t}");
    }
    // Text first: streamed as usual, tagged calls still parsed.
    let (text, calls) = parse_with(
        bare(),
        "Sure. <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
    );
    assert_eq!((text.as_deref(), calls.len()), (Some("Sure."), 1));
}
