//! Paths shared by the integration tests: `../shared` beside the checkout, and the models
//! directory (`$NUCLEUS_MODELS`, default `~/.cache/nucleus/models`).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use nucleus::engine::scheduler::{Event, Finished, TokenEvent};
use nucleus::kernels::PromptSlot;
use nucleus::model::{Batch, ForwardState, Model};
use nucleus::tokenizer::{TokenId, Tokenizer};
use tokio::sync::mpsc::UnboundedReceiver;

/// Taken first by every test that runs a real model: one such test already keeps both cores
/// busy (its model's thread pool), and two at once, each pool's spinning workers preempting
/// the other's, made the suite take 19 % longer than one after the other (483 s against 405 s
/// on the 2-vCPU Cascade Lake Xeon). Tests of files and tokenizers still run beside them.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed holding it poisons it; the others still run.
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn shared_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared"))
}

pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("NUCLEUS_MODELS") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/nucleus/models")
}

/// The model at `path` (2 threads where the machine has them) and its tokenizer, shared as the
/// engine takes them; `None` (a skip) when the file is absent outside CI.
pub fn load_shared(path: PathBuf, what: &str) -> Option<(Arc<Model>, Arc<Tokenizer>)> {
    if !require(&path, what) {
        return None;
    }
    let model = Model::load(&path, 0).expect("load model");
    let tok = Tokenizer::from_gguf(&model.file.metadata).expect("tokenizer");
    Some((Arc::new(model), Arc::new(tok)))
}

/// A model `nucleus pull` put in the models directory, by its file stem, as [`load_shared`].
pub fn pulled(name: &str) -> Option<(Arc<Model>, Arc<Tokenizer>)> {
    load_shared(models_dir().join(format!("{name}.gguf")), name)
}

/// The GGUF a golden file describes: the tiny model sits beside it, the real ones are pulled.
pub fn golden_model_path(golden_name: &str) -> PathBuf {
    let gguf = format!("{golden_name}.gguf");
    let beside = shared_dir().join("golden").join(&gguf);
    if beside.exists() {
        beside
    } else {
        models_dir().join(gguf)
    }
}

/// In CI every input must be there; elsewhere a missing one skips the test with a message.
pub fn require(path: &std::path::Path, what: &str) -> bool {
    if path.exists() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{what} is missing at {} (CI must provide it: .ci/run pulls the models)",
            path.display()
        );
    }
    eprintln!("skipped: {what} is absent at {}", path.display());
    false
}

/// Runs a request to its end: (its token events, the whole text, the final event).
pub fn drain_events(mut rx: UnboundedReceiver<Event>) -> (Vec<TokenEvent>, String, Finished) {
    let mut events = Vec::new();
    let mut text = String::new();
    loop {
        match rx
            .blocking_recv()
            .expect("the engine ends every request with an event")
        {
            Event::Token(t) => {
                text.push_str(&t.text);
                events.push(t);
            }
            Event::Done(f) => {
                text.push_str(&f.text);
                return (events, text, f);
            }
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
}

/// Runs a request to its end: (generated token ids, the whole text, the final event).
pub fn drain(rx: UnboundedReceiver<Event>) -> (Vec<TokenId>, String, Finished) {
    let (events, text, f) = drain_events(rx);
    (events.iter().map(|t| t.token).collect(), text, f)
}

/// One forward of `ids` as a prompt that wants every row's logits, in a fresh cache: the state
/// it leaves (logits and hidden states of every row).
pub fn prompt_forward(model: &Model, ids: &[TokenId]) -> ForwardState {
    let n = ids.len();
    let mut kv = model.new_kv_cache(n, 16);
    let seq = kv.new_seq();
    let mut st = ForwardState::new();
    let mut batch = Batch::new();
    for (i, &t) in ids.iter().enumerate() {
        let slot = PromptSlot {
            len: n,
            index: i,
            all_logits: true,
        };
        batch.push_prompt(t, i, seq, true, slot);
    }
    model.forward(&batch, &mut kv, &mut st).unwrap();
    st
}
