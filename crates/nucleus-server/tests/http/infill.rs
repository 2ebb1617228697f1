//! Fill-in-the-middle: the prompt layout of `/infill` and of `suffix` on `/v1/completions`
//! (token ids, against Qwen2.5-Coder's FIM token ids and llama-server's `format_prompt_infill`
//! rules), their answers streamed and not, the prefix cache on a second completion in the same
//! file, and the errors.

use crate::common;

use crate::common::{post, start_catalog, Server};
use nucleus::engine::scheduler::EngineConfig;
use nucleus::model::Model;
use nucleus::tokenizer::{TokenId, Tokenizer};
use nucleus_server::infill::{format_infill, ExtraFile, Infill};
use serde_json::{json, Value};

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";

// Qwen2.5-Coder's special tokens (its tokenizer_config.json's `added_tokens_decoder`).
const FIM_PREFIX: TokenId = 151659;
const FIM_MIDDLE: TokenId = 151660;
const FIM_SUFFIX: TokenId = 151661;
const FIM_PAD: TokenId = 151662;
const REPO_NAME: TokenId = 151663;
const FILE_SEP: TokenId = 151664;

fn qwen_path() -> Option<std::path::PathBuf> {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from)?;
    let dir = std::env::var_os("NUCLEUS_MODELS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| home.join(".cache/nucleus/models"));
    let p = dir.join(format!("{QWEN}.gguf"));
    if p.exists() {
        return Some(p);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{QWEN} is missing at {}", p.display());
    }
    eprintln!("skipped: {QWEN} is absent at {}", p.display());
    None
}

fn qwen_tokenizer() -> Option<Tokenizer> {
    let file = nucleus::gguf::GgufFile::open(qwen_path()?).unwrap();
    Some(Tokenizer::from_gguf(&file.metadata).unwrap())
}

fn enc(tok: &Tokenizer, s: &str) -> Vec<TokenId> {
    tok.encode(s, false, false).unwrap()
}

#[test]
fn qwen_fim_tokens_are_found_and_end_generation() {
    let Some(tok) = qwen_tokenizer() else { return };
    let f = tok.fim();
    assert_eq!(
        (f.pre, f.suf, f.mid, f.pad, f.rep, f.sep),
        (
            Some(FIM_PREFIX),
            Some(FIM_SUFFIX),
            Some(FIM_MIDDLE),
            Some(FIM_PAD),
            Some(REPO_NAME),
            Some(FILE_SEP)
        )
    );
    for id in [FIM_PAD, REPO_NAME, FILE_SEP] {
        assert!(tok.is_eog(id), "{id} must end generation");
    }
    assert!(!tok.is_eog(FIM_MIDDLE));
}

#[test]
fn repo_level_layout_matches_llama_server() {
    let Some(tok) = qwen_tokenizer() else { return };
    let extra = [
        ExtraFile {
            filename: "util.py".into(),
            text: "def add(a, b):\n    return a + b\n".into(),
        },
        ExtraFile {
            filename: "tmp".into(),
            text: "X = 1\n".into(),
        },
    ];
    let (prefix, suffix, prompt) = ("def f(x):\n    y = ", "\n    return y\n", "add(");
    let input = Infill {
        prefix: enc(&tok, prefix),
        suffix: enc(&tok, suffix),
        extra: &extra,
        prompt: enc(&tok, prompt),
    };
    let got = format_infill(&tok, input, 2048, -1, 4096).unwrap();
    let mut want = vec![REPO_NAME];
    want.extend(enc(&tok, "myproject\n"));
    want.push(FILE_SEP);
    want.extend(enc(&tok, "util.py\n"));
    want.extend(enc(&tok, "def add(a, b):\n    return a + b\n"));
    want.push(FILE_SEP);
    want.extend(enc(&tok, "tmp\n"));
    want.extend(enc(&tok, "X = 1\n"));
    want.push(FILE_SEP);
    want.extend(enc(&tok, "filename\n"));
    // The prompt follows the prefix, before the suffix token (llama-server's order).
    want.push(FIM_PREFIX);
    want.extend(enc(&tok, prefix));
    want.extend(enc(&tok, prompt));
    want.push(FIM_SUFFIX);
    want.extend(enc(&tok, suffix));
    want.push(FIM_MIDDLE);
    assert_eq!(got, want);
    // The text as llama-server's `prompt` field shows it.
    assert_eq!(
        tok.decode(&got, false),
        "<|repo_name|>myproject\n<|file_sep|>util.py\ndef add(a, b):\n    return a + b\n\
         <|file_sep|>tmp\nX = 1\n<|file_sep|>filename\n\
         <|fim_prefix|>def f(x):\n    y = add(<|fim_suffix|>\n    return y\n<|fim_middle|>"
    );
}

#[test]
fn truncation_follows_the_batch_and_window_budgets() {
    let Some(tok) = qwen_tokenizer() else { return };
    let prefix: Vec<TokenId> = (0..2000).map(|i| 1000 + i).collect();
    let suffix: Vec<TokenId> = (0..900).map(|i| 5000 + i).collect();
    let prompt = vec![7, 8, 9];
    let extra = [ExtraFile {
        filename: "a.py".into(),
        text: "pass\n".repeat(50),
    }];
    let input = |extra| Infill {
        prefix: prefix.clone(),
        suffix: suffix.clone(),
        extra,
        prompt: prompt.clone(),
    };
    // A window of n_batch: n_ctx - n_batch - 2 * n_predict = 2 extra tokens (the last two).
    let got = format_infill(&tok, input(&extra), 2048, -1, 2048).unwrap();
    let tail = enc(&tok, "filename\n");
    assert_eq!(tail.len(), 2);
    assert_eq!(&got[..2], &tail[..]);
    assert_eq!(got[2], FIM_PREFIX);
    // Prefix: its last 3/4 * 2048 = 1536 tokens; suffix: its first 2048/4 - 2 - 3 = 507.
    assert_eq!(&got[3..3 + 1536], &prefix[2000 - 1536..]);
    assert_eq!(&got[3 + 1536..3 + 1536 + 3], &prompt[..]);
    let s = 3 + 1536 + 3;
    assert_eq!(got[s], FIM_SUFFIX);
    assert_eq!(&got[s + 1..s + 1 + 507], &suffix[..507]);
    assert_eq!(got[s + 1 + 507], FIM_MIDDLE);
    assert_eq!(got.len(), s + 1 + 507 + 1);
    // Smaller windows keep no extra context at all.
    let got = format_infill(&tok, input(&extra), 2048, -1, 1024).unwrap();
    assert_eq!(got[0], FIM_PREFIX);
    // A limit on the answer (n_predict) takes twice its size from the extra context.
    let got = format_infill(&tok, input(&extra), 2048, 100, 2048 + 200 + 5).unwrap();
    assert_eq!(got[5], FIM_PREFIX);
}

#[test]
fn a_model_without_fim_tokens_is_refused_naming_the_field() {
    let Some(path) = common::tiny_path() else {
        return;
    };
    let model = Model::load(&path, 1).unwrap();
    let tok = Tokenizer::from_gguf(&model.file.metadata).unwrap();
    assert_eq!(tok.fim().pre, None);
    let e = nucleus_server::infill::required_tokens(&tok, "suffix").unwrap_err();
    assert_eq!(e.status, 400);
    assert_eq!(e.param.as_deref(), Some("suffix"));
    assert!(
        e.message.contains("prefix token is missing"),
        "{}",
        e.message
    );
    let s = common::start(common::small(), None).unwrap();
    let r = post(
        s.addr,
        "/infill",
        &json!({"input_prefix": "a", "input_suffix": "b"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "input_suffix");
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "a", "suffix": "b"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "suffix");
    let r = post(
        s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "a"}], "suffix": "b"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "suffix");
    // An empty suffix asks for nothing.
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": "a", "suffix": "", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

fn qwen_server() -> Option<Server> {
    qwen_path()?;
    let cfg = EngineConfig {
        n_ctx: 4096,
        kv_tokens: 8192,
        ..Default::default()
    };
    start_catalog(QWEN, cfg)
}

const PREFIX: &str = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n";
const SUFFIX: &str = "\n\n\nprint(fibonacci(10))\n";

#[test]
fn infill_answers_streamed_and_not_and_caches_the_file() {
    let Some(s) = qwen_server() else { return };
    let body = json!({
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [{"filename": "math_utils.py", "text": "def square(x):\n    return x * x\n"}],
        "n_predict": 24,
        "temperature": 0,
    });
    let r = post(s.addr, "/infill", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let content = v["content"].as_str().unwrap();
    assert!(!content.is_empty());
    assert_eq!(v["stop"], true);
    assert!(["eos", "limit"].contains(&v["stop_type"].as_str().unwrap()));
    assert!(v["tokens_predicted"].as_u64().unwrap() <= 24);
    let prompt = v["prompt"].as_str().unwrap();
    assert!(
        prompt.starts_with("<|repo_name|>myproject\n<|file_sep|>math_utils.py\n"),
        "{prompt}"
    );
    assert!(
        prompt.ends_with(&format!("{SUFFIX}<|fim_middle|>")),
        "{prompt}"
    );
    let n_prompt = v["tokens_evaluated"].as_u64().unwrap();
    assert_eq!(v["timings"]["predicted_n"], v["tokens_predicted"]);

    // The same file again (as an editor asks at the next keystroke): the prompt's full blocks
    // come from the prefix cache.
    let mut again = body.clone();
    again["input_suffix"] = json!("\n\n\nprint(fibonacci(12))\n");
    let v2 = post(s.addr, "/infill", &again).json();
    let cached = v2["tokens_cached"].as_u64().unwrap();
    assert_eq!(v2["timings"]["cache_n"].as_u64(), Some(cached));
    assert!(cached >= n_prompt / 2, "cached {cached} of {n_prompt}");
    assert_eq!(
        v2["timings"]["prompt_n"].as_u64().unwrap() + cached,
        v2["tokens_evaluated"].as_u64().unwrap()
    );

    // Streamed: the same text (greedy), then a final event with `stop: true`, no [DONE].
    let mut st = body.clone();
    st["stream"] = json!(true);
    let r = post(s.addr, "/infill", &st);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let text = r.text();
    assert!(!text.contains("[DONE]"));
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (last, pieces) = events.split_last().unwrap();
    assert_eq!(last["stop"], true);
    assert!(pieces.iter().all(|e| e["stop"] == false));
    let streamed: String = events
        .iter()
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, content);
}

#[test]
fn completions_suffix_is_the_same_prompt_as_infill() {
    let Some(s) = qwen_server() else { return };
    let r = post(
        s.addr,
        "/v1/completions",
        &json!({"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let infill = post(
        s.addr,
        "/infill",
        &json!({"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 16, "temperature": 0}),
    )
    .json();
    assert_eq!(v["choices"][0]["text"], infill["content"]);
    assert_eq!(v["usage"]["prompt_tokens"], infill["tokens_evaluated"]);
    // The second request (same prompt) reports its cached tokens in OpenAI's usage.
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert!(
        infill["tokens_cached"].as_u64().unwrap() > 0,
        "{infill} (first: {cached:?})"
    );
}

#[test]
fn infill_errors_name_the_field() {
    let Some(s) = qwen_server() else { return };
    let cases = [
        (json!({"input_suffix": "x"}), "input_prefix"),
        (json!({"input_prefix": "x"}), "input_suffix"),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "input_extra": "z"}),
            "input_extra",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "input_extra": [{"filename": "a"}]}),
            "input_extra[0]",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "prompt": 3}),
            "prompt",
        ),
        (
            json!({"input_prefix": {"a": 1}, "input_suffix": "y"}),
            "input_prefix",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "n_predict": 0}),
            "n_predict",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "n": 2}),
            "n",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "n_indent": "4"}),
            "n_indent",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "samplers": ["top_k", "nope"]}),
            "samplers",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "response_fields": "content"}),
            "response_fields",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "suffix": "z"}),
            "suffix",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "temperature": 9}),
            "temperature",
        ),
    ];
    for (body, field) in cases {
        let r = post(s.addr, "/infill", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], field, "{body}");
    }
}
