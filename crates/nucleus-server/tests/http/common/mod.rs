//! The test harness shared by the HTTP tests: the real server over loopback with the tiny
//! random model (fast, gibberish), and a small HTTP/1.1 client over `TcpStream` that keeps the
//! tests free of client crates.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nucleus::chat::ChatTemplate;
use nucleus::engine::scheduler::{Engine, EngineConfig, EngineHandle};
use nucleus::model::Model;
use nucleus::tokenizer::Tokenizer;
use nucleus_server::AppState;
use serde_json::Value;

pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

pub fn tiny_path() -> Option<PathBuf> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/golden/tiny-llama-random.gguf"
    ));
    if p.exists() {
        return Some(p);
    }
    if std::env::var_os("CI").is_some() {
        panic!("the tiny model is missing at {}", p.display());
    }
    eprintln!("skipped: the tiny model is absent at {}", p.display());
    None
}

pub struct Server {
    pub addr: SocketAddr,
    pub engine: EngineHandle,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub thread: Option<std::thread::JoinHandle<()>>,
    /// What `serve` returned, once it has.
    pub stopped: Arc<std::sync::Mutex<Option<nucleus_server::Stopped>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn start(cfg: EngineConfig, api_key: Option<&str>) -> Option<Server> {
    start_with(cfg, api_key, |_| {})
}

/// [`start`], with `setup` changing the server's state before it serves.
pub fn start_with(
    cfg: EngineConfig,
    api_key: Option<&str>,
    setup: impl FnOnce(&mut AppState),
) -> Option<Server> {
    let path = tiny_path()?;
    let model = Arc::new(Model::load(&path, 1).unwrap());
    let tok = Arc::new(Tokenizer::from_gguf(&model.file.metadata).unwrap());
    let engine = Engine::start(model.clone(), tok.clone(), cfg);
    let mut state = AppState::new(engine.clone(), tok, "tiny", api_key.map(String::from));
    state.model = Some(model);
    // The tiny model has no chat template; give it ChatML to test the chat route.
    state.template = Some(ChatTemplate::new(CHATML, "", "").unwrap());
    setup(&mut state);
    Some(serve_state(state, engine))
}

/// A catalog model from the models directory (`$NUCLEUS_MODELS`), with its own chat template;
/// `None` (skipped, with a message) when it is absent outside CI.
pub fn start_catalog(name: &str, cfg: EngineConfig) -> Option<Server> {
    start_catalog_in(name, cfg, nucleus::model::Arithmetic::from_env())
}

/// [`start_catalog`] with the model computing in `arithmetic`.
#[allow(dead_code)]
pub fn start_catalog_in(
    name: &str,
    cfg: EngineConfig,
    arithmetic: nucleus::model::Arithmetic,
) -> Option<Server> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let dir = std::env::var_os("NUCLEUS_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cache/nucleus/models"));
    let path = dir.join(format!("{name}.gguf"));
    if !path.exists() {
        if std::env::var_os("CI").is_some() {
            panic!("{name} is missing at {}", path.display());
        }
        eprintln!("skipped: {name} is absent at {}", path.display());
        return None;
    }
    let model = Arc::new(Model::load_with(&path, 0, arithmetic).unwrap());
    let tok = Arc::new(Tokenizer::from_gguf(&model.file.metadata).unwrap());
    let engine = Engine::start(model.clone(), tok.clone(), cfg);
    let mut state = AppState::new(engine.clone(), tok, name, None);
    state.model = Some(model);
    Some(serve_state(state, engine))
}

fn serve_state(state: AppState, engine: EngineHandle) -> Server {
    let state = Arc::new(state);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let stopped = Arc::new(std::sync::Mutex::new(None));
    let stopped_in = stopped.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(l.local_addr().unwrap()).unwrap();
            let s = nucleus_server::serve(
                l,
                state,
                async move {
                    let _ = stop_rx.await;
                },
                nucleus_server::Drain::finishing(Duration::from_secs(2)),
            )
            .await
            .unwrap();
            *stopped_in.lock().unwrap() = Some(s);
        });
    });
    Server {
        addr: addr_rx.recv().unwrap(),
        engine,
        stop: Some(stop_tx),
        thread: Some(thread),
        stopped,
    }
}

pub fn small() -> EngineConfig {
    EngineConfig {
        n_ctx: 256,
        kv_tokens: 4096,
        ..Default::default()
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size_str = std::str::from_utf8(&b[..eol]).unwrap();
        let size = usize::from_str_radix(size_str.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
    out
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut w = s.try_clone().unwrap();
    let body = body.to_vec();
    // Write the body in the background: the server may answer (413) before reading it all.
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&body);
    });
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let _ = writer.join();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body,
    }
}

pub fn post(addr: SocketAddr, path: &str, v: &Value) -> Resp {
    request(addr, "POST", path, &[], v.to_string().as_bytes())
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"")
}

/// Parses an SSE body: the JSON of every `data:` event before `[DONE]`; checks the framing.
pub fn sse_events(r: &Resp) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let text = r.text();
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "stream must end with [DONE]: {text:?}"
    );
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let data = e
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("bad event {e:?}"));
        if data == "[DONE]" {
            assert_eq!(i, events.len() - 1, "[DONE] must be last");
            break;
        }
        out.push(serde_json::from_str(data).unwrap());
    }
    out
}

pub fn assert_error(r: &Resp, status: u16, param: Option<&str>) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{v}");
    }
    v
}

pub fn get_fails(addr: SocketAddr) -> bool {
    let mut s = match TcpStream::connect(addr) {
        Ok(s) => s,
        Err(_) => return true,
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = write!(s, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut buf = [0u8; 64];
    !matches!(s.read(&mut buf), Ok(n) if n > 0)
}
