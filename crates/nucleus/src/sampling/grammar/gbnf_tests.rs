//! GBNF: the translation, and llama.cpp's example grammars (tests/data/gbnf, copied from
//! llama.cpp) accepting and refusing texts byte by byte on the synthetic byte vocabulary.

use super::super::tests::vocab;
use super::super::{Grammar, GrammarCompiler, GrammarSpec};
use super::{gbnf_to_lark, looks_like_gbnf};

const JSON: &str = include_str!("../../../tests/data/gbnf/json.gbnf");
const ARITHMETIC: &str = include_str!("../../../tests/data/gbnf/arithmetic.gbnf");
const LIST: &str = include_str!("../../../tests/data/gbnf/list.gbnf");
const OTHERS: &[(&str, &str)] = &[
    (
        "json_arr",
        include_str!("../../../tests/data/gbnf/json_arr.gbnf"),
    ),
    ("c", include_str!("../../../tests/data/gbnf/c.gbnf")),
    ("chess", include_str!("../../../tests/data/gbnf/chess.gbnf")),
    (
        "english",
        include_str!("../../../tests/data/gbnf/english.gbnf"),
    ),
    (
        "japanese",
        include_str!("../../../tests/data/gbnf/japanese.gbnf"),
    ),
];

fn compile(gbnf: &str) -> Grammar {
    let tok = vocab();
    GrammarCompiler::for_tokenizer(&tok)
        .unwrap()
        .compile(&GrammarSpec::Gbnf(gbnf.into()))
        .unwrap()
}

/// Does the grammar accept `text` in full? Fed one byte token (id 3 + byte) at a time.
fn accepts(g: &str, text: &str) -> bool {
    let mut g = compile(g);
    let toks: Vec<u32> = text.bytes().map(|b| 3 + b as u32).collect();
    if g.valid_prefix(&toks) != toks.len() {
        return false;
    }
    for t in toks {
        g.accept(t).unwrap();
    }
    g.is_accepting()
}

#[test]
fn translation_by_hand() {
    let l = gbnf_to_lark(
        "root ::= item+ # list\nitem ::= \"- \" [^\\n]{1,3} (\"x\" | ) \"\\n\"\nmy-Rule ::= .",
    )
    .unwrap();
    assert_eq!(
        l,
        "start: g_root\n\
         g_root: g_item+\n\
         g_item: \"-\" \" \" /[^\\x{A}]/{1,3} ((\"x\")?) \"\\n\"\n\
         g_my_rule: /(?s:.)/\n"
    );
}

#[test]
fn gbnf_is_told_from_lark() {
    for g in [JSON, ARITHMETIC, LIST] {
        assert!(looks_like_gbnf(g));
    }
    assert!(!looks_like_gbnf(
        "start: \"a\" b\nb: /[0-9]+/ // ::= in a comment"
    ));
    assert!(!looks_like_gbnf("start: %json {\"type\": \"object\"}"));
}

#[test]
fn json_gbnf() {
    for ok in [
        "{}",
        "{\"a\": [1, 2.5, \"x\\n\"], \"b\": {\"c\": null}}",
        "{\"k\":true}",
    ] {
        assert!(accepts(JSON, ok), "{ok}");
    }
    for bad in ["[1]", "{\"a\" 1}", "{\"a\": tru}", "{'a': 1}"] {
        assert!(!accepts(JSON, bad), "{bad}");
    }
}

#[test]
fn arithmetic_gbnf() {
    assert!(accepts(ARITHMETIC, "1+2=3\n"));
    assert!(accepts(ARITHMETIC, "(a +b)*c=x\ny/2=4\n"));
    assert!(!accepts(ARITHMETIC, "1+=2\n"));
    assert!(!accepts(ARITHMETIC, "1+2=3"));
}

#[test]
fn list_gbnf() {
    assert!(accepts(LIST, "- one\n- two items\n"));
    assert!(!accepts(LIST, "one\n"));
    assert!(!accepts(LIST, "- \n"));
}

#[test]
fn the_other_examples_compile() {
    for (name, g) in OTHERS {
        let tok = vocab();
        let r = GrammarCompiler::for_tokenizer(&tok)
            .unwrap()
            .compile(&GrammarSpec::Gbnf(g.to_string()));
        assert!(r.is_ok(), "{name}: {:?}", r.err());
    }
    assert!(accepts(OTHERS[2].1, "1. e4 e5\n2. Nf3 Nc6\n"));
    assert!(accepts(OTHERS[1].1, "int main(){return 0;}"));
}

#[test]
fn errors_name_the_problem() {
    let e = |g: &str| gbnf_to_lark(g).unwrap_err().0;
    assert!(e("item ::= \"a\"").contains("no `root`"));
    assert!(e("root ::= missing").contains("`missing` is used but not defined"));
    assert!(e("root ::= <think> \"a\"").contains("token references"));
    assert!(e("root ::= \"\\q\"").contains("unknown escape"));
    assert!(e("root ::= \"abc").contains("unterminated"));
    assert!(e("root ::= (\"a\"").contains("expected `)`"));
    assert!(e("root ::= \"a\"\nroot ::= \"b\"").contains("defined twice"));
    assert!(e("root ::= [z-a]").contains("range"));
    assert!(e("root ::= \"a\"{3,1}").contains("repetition"));
}
