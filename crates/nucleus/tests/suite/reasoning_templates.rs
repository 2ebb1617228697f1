//! Reasoning with the published templates of reasoning models: Qwen3's (from Qwen3-0.6B's
//! `tokenizer_config.json`, as vendored in llama.cpp's `models/templates/`) and
//! DeepSeek-R1-Distill's, whose prompt opens the `<think>` block itself.

use nucleus::chat::reasoning::prompt_opens_reasoning;
use nucleus::chat::{split_reasoning, ChatTemplate, Message, ReasoningPiece, ReasoningSplitter};
use serde_json::json;

const QWEN3: &str = include_str!("../data/qwen3_template.jinja");
const R1: &str = include_str!("../data/deepseek_r1_template.jinja");

fn kwargs(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().unwrap().clone()
}

#[test]
fn qwen3_enable_thinking_reaches_the_template() {
    let t = ChatTemplate::new(QWEN3, "", "<|im_end|>").unwrap();
    assert!(t.reasons());
    let msgs = [Message::new("user", "Hi")];
    let on = t.render_with_kwargs(&msgs, None, true, None).unwrap();
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on:?}");
    assert!(!prompt_opens_reasoning(&on));
    let off = t
        .render_with_kwargs(
            &msgs,
            None,
            true,
            Some(&kwargs(json!({"enable_thinking": false}))),
        )
        .unwrap();
    assert!(
        off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{off:?}"
    );
    assert!(!prompt_opens_reasoning(&off));
    // Kwargs cannot replace the template's own variables.
    let same = t
        .render_with_kwargs(&msgs, None, true, Some(&kwargs(json!({"messages": []}))))
        .unwrap();
    assert_eq!(same, on);
}

#[test]
fn qwen3_renders_the_reasoning_of_the_last_turn() {
    let t = ChatTemplate::new(QWEN3, "", "<|im_end|>").unwrap();
    let mut a = Message::new("assistant", "Let me check.");
    a.reasoning_content = Some("The user wants weather.".into());
    let out = t
        .render_with_kwargs(&[Message::new("user", "Weather?"), a], None, false, None)
        .unwrap();
    assert!(
        out.contains("<think>\nThe user wants weather.\n</think>\n\nLet me check."),
        "{out:?}"
    );
}

#[test]
fn r1_prompt_opens_the_block_and_its_output_splits() {
    let t = ChatTemplate::new(R1, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>").unwrap();
    assert!(t.reasons());
    let p = t.render(&[Message::new("user", "2+2?")], true).unwrap();
    assert!(p.ends_with("<｜Assistant｜><think>\n"), "{p:?}");
    assert!(prompt_opens_reasoning(&p));
    // What an R1 distill writes after that prompt, streamed in pieces that cut the tag.
    let mut s = ReasoningSplitter::new(true);
    let mut pieces = Vec::new();
    for p in [
        "Two plus two",
        " is four.\n</th",
        "ink>\n\nThe answer is 4.",
    ] {
        pieces.extend(s.push(p));
    }
    pieces.extend(s.finish());
    assert_eq!(
        pieces,
        vec![
            ReasoningPiece::Reasoning("Two plus two".into()),
            ReasoningPiece::Reasoning(" is four.".into()),
            ReasoningPiece::Content("The answer is 4.".into()),
        ]
    );
}

#[test]
fn qwen3_output_with_a_tool_call_after_reasoning() {
    let out = "<think>\nI need the weather tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (r, c) = split_reasoning(out, false);
    assert_eq!(r.as_deref(), Some("I need the weather tool."));
    let (text, calls) = nucleus::chat::tools::parse_with(nucleus::chat::ToolCallParser::new(), &c);
    assert_eq!(text, None);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, "get_weather");
}

#[test]
fn a_template_without_thinking_does_not_reason() {
    let chatml = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
    assert!(!ChatTemplate::new(chatml, "", "").unwrap().reasons());
}

/// gpt-oss: its published template (llama.cpp's `models/templates/openai-gpt-oss-120b.jinja`,
/// as the gpt-oss fixture carries it) renders a conversation in harmony, and the model's
/// harmony output splits into its analysis channel (the reasoning) and its final channel (the
/// answer), whole or streamed token by token.
#[test]
fn gpt_oss_template_renders_harmony_and_its_final_channel_is_the_answer() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/arch/gpt-oss.gguf");
    let file = nucleus::gguf::GgufFile::open(&path).unwrap();
    let source = file.metadata.get_str("tokenizer.chat_template").unwrap();
    let t = ChatTemplate::new(source, "<|startoftext|>", "<|return|>").unwrap();
    assert!(t.reasons());
    let prompt = t
        .render_with_kwargs(&[Message::new("user", "What is 2+2?")], None, true, None)
        .unwrap();
    assert!(
        prompt.starts_with("<|start|>system<|message|>"),
        "{prompt:?}"
    );
    assert!(
        prompt.contains("<|start|>user<|message|>What is 2+2?<|end|>"),
        "{prompt:?}"
    );
    assert!(prompt.ends_with("<|start|>assistant"), "{prompt:?}");
    let effort = t
        .render_with_kwargs(
            &[Message::new("user", "Hi")],
            None,
            true,
            Some(&kwargs(json!({"reasoning_effort": "high"}))),
        )
        .unwrap();
    assert!(effort.contains("Reasoning: high"), "{effort:?}");

    let tokens = [
        "<|channel|>",
        "analysis",
        "<|message|>",
        "Simple",
        " sum.",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|channel|>",
        "final",
        "<|message|>",
        "4",
    ];
    let (reasoning, content) = split_reasoning(&tokens.concat(), false);
    assert_eq!(reasoning.as_deref(), Some("Simple sum."));
    assert_eq!(content, "4");
    let mut s = ReasoningSplitter::new(false);
    let mut pieces: Vec<ReasoningPiece> = tokens.iter().flat_map(|t| s.push(t)).collect();
    pieces.extend(s.finish());
    let text = |want_reasoning: bool| -> String {
        pieces
            .iter()
            .filter_map(|p| match (p, want_reasoning) {
                (ReasoningPiece::Reasoning(r), true) | (ReasoningPiece::Content(r), false) => {
                    Some(r.as_str())
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(text(true), "Simple sum.");
    assert_eq!(text(false), "4");
    // Plain text from a model that does not speak harmony stays the answer.
    assert_eq!(
        split_reasoning("<|chan", false),
        (None, "<|chan".to_string())
    );
}
