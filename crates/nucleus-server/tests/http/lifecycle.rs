//! Load and lifetime: a full queue, a client that disconnects mid-stream, graceful shutdown,
//! and a shutdown that clients stalled mid-request cannot hold up.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use nucleus::engine::scheduler::EngineConfig;
use serde_json::json;

use crate::common::*;

#[test]
fn queue_full_is_429_and_everything_accepted_completes() {
    let cfg = EngineConfig {
        max_running: 1,
        queue_capacity: 2,
        n_ctx: 1024,
        ..small()
    };
    let Some(srv) = start(cfg, None) else { return };
    let addr = srv.addr;
    let handles: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(move || {
                post(
                    addr,
                    "/v1/completions",
                    &json!({"prompt": "Tell me a story", "max_tokens": 400, "ignore_eos": true}),
                )
            })
        })
        .collect();
    let resps: Vec<Resp> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = resps.iter().filter(|r| r.status == 200).count();
    let full: Vec<&Resp> = resps.iter().filter(|r| r.status == 429).collect();
    assert_eq!(ok + full.len(), 6, "{resps:?}");
    assert!(!full.is_empty() && ok >= 2, "ok {ok}, 429 {}", full.len());
    let v = assert_error(full[0], 429, None);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("queue is full"));
    assert_eq!(v["error"]["code"], "queue_full");
    for r in resps.iter().filter(|r| r.status == 200) {
        assert_eq!(r.json()["usage"]["completion_tokens"], 400);
    }
}

#[test]
fn a_disconnected_stream_is_cancelled_and_frees_its_blocks() {
    let cfg = EngineConfig {
        n_ctx: 2048,
        ..small()
    };
    let Some(srv) = start(cfg, None) else { return };
    let body =
        json!({"prompt": "Count forever", "max_tokens": 2000, "ignore_eos": true, "stream": true})
            .to_string();
    let mut s = TcpStream::connect(srv.addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read until the first token arrived, then hang up.
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&got).contains("data: ") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    drop(s);
    let t0 = Instant::now();
    loop {
        let st = srv.engine.stats();
        if st.running == 0 && st.kv_used_blocks == 0 {
            assert_eq!(st.requests_cancelled, 1, "{st:?}");
            assert!(st.generation_tokens_total < 2000, "{st:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "not cancelled: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn graceful_shutdown_finishes_in_flight_requests() {
    let Some(mut srv) = start(small(), None) else {
        return;
    };
    let addr = srv.addr;
    let h = std::thread::spawn(move || {
        post(
            addr,
            "/v1/completions",
            &json!({"prompt": "Hello", "max_tokens": 40, "ignore_eos": true}),
        )
    });
    // Wait until it runs, then ask the server to stop.
    let t0 = Instant::now();
    while srv.engine.stats().running == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = srv.stop.take().unwrap().send(());
    let r = h.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 40);
    srv.thread.take().unwrap().join().unwrap();
    assert!(srv.engine.is_shut_down());
    assert_eq!(
        *srv.stopped.lock().unwrap(),
        Some(nucleus_server::Stopped {
            connections_dropped: false
        })
    );
    assert!(TcpStream::connect(addr).is_err() || get_fails(addr));
}

/// Found by scripts/soak.py's idea of a hostile client: one that sent half a request and went
/// silent kept `serve` from ever returning after the shutdown signal (axum waits for every
/// connection). Now it returns `drain` + CLOSE_GRACE after the signal and says it dropped them.
#[test]
fn clients_stalled_mid_request_do_not_keep_the_server_from_stopping() {
    let Some(mut srv) = start(small(), None) else {
        return;
    };
    // Half a request head; a whole head and half its body; a whole idle request in between.
    let mut half_head = TcpStream::connect(srv.addr).unwrap();
    half_head
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut half_body = TcpStream::connect(srv.addr).unwrap();
    half_body
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"prompt\": ",
        )
        .unwrap();
    // Both connections are being served before the signal.
    assert_eq!(get(srv.addr, "/health").status, 200);
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    let _ = srv.stop.take().unwrap().send(());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let server = srv.thread.take().unwrap();
    std::thread::spawn(move || {
        let _ = done_tx.send(server.join());
    });
    // The harness drains for 2 s; CLOSE_GRACE adds 2 more.
    let limit = Duration::from_secs(2) + nucleus_server::CLOSE_GRACE + Duration::from_secs(5);
    let joined = done_rx
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("the server still runs {limit:?} after the shutdown signal"));
    joined.unwrap();
    assert!(
        t0.elapsed() >= Duration::from_secs(2) + nucleus_server::CLOSE_GRACE,
        "returned before the drain and the grace: {:?}",
        t0.elapsed()
    );
    assert_eq!(
        *srv.stopped.lock().unwrap(),
        Some(nucleus_server::Stopped {
            connections_dropped: true
        })
    );
    assert!(srv.engine.is_shut_down());
    drop((half_head, half_body));
}
