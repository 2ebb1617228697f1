//! Who may call the server: CORS for browser pages (`--cors-origin`) and `/metrics` behind the
//! API key (`--metrics-require-key`).

use serde_json::json;

use crate::common::*;

const PAGE: &str = "http://localhost:3000";

fn preflight(srv: &Server, origin: &str) -> Resp {
    request(
        srv.addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", origin),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization, content-type",
            ),
        ],
        b"",
    )
}

#[test]
fn cors_lets_the_listed_origins_in() {
    let Some(srv) = start_with(small(), Some("k"), |st| {
        st.set_cors_origins(&[PAGE.to_string(), "https://example.org/".to_string()])
            .unwrap()
    }) else {
        return;
    };
    // The preflight is answered without the key (browsers send none with it).
    let r = preflight(&srv, PAGE);
    assert!(r.status < 300, "{} {}", r.status, r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(PAGE));
    let methods = r
        .header("access-control-allow-methods")
        .unwrap()
        .to_string();
    assert!(methods.contains("POST"), "{methods}");
    let headers = r
        .header("access-control-allow-headers")
        .unwrap()
        .to_ascii_lowercase();
    assert!(headers.contains("authorization") && headers.contains("content-type"));
    let r = preflight(&srv, "https://example.org");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://example.org")
    );

    // The request itself carries the header; the key is still required.
    let body = json!({"prompt": "hi", "max_tokens": 1}).to_string();
    let r = request(
        srv.addr,
        "POST",
        "/v1/completions",
        &[("Origin", PAGE), ("Authorization", "Bearer k")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(PAGE));
    let r = request(
        srv.addr,
        "POST",
        "/v1/completions",
        &[("Origin", PAGE)],
        body.as_bytes(),
    );
    assert_error(&r, 401, None);
    assert_eq!(r.header("access-control-allow-origin"), Some(PAGE));

    // Another origin gets no permission.
    let r = preflight(&srv, "http://evil.example");
    assert_eq!(r.header("access-control-allow-origin"), None);
}

#[test]
fn cors_any_origin_and_off_by_default() {
    let Some(srv) = start_with(small(), None, |st| {
        st.set_cors_origins(&["*".to_string()]).unwrap()
    }) else {
        return;
    };
    let r = preflight(&srv, "http://anything.example:8000");
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    drop(srv);

    let Some(srv) = start(small(), None) else {
        return;
    };
    let r = request(srv.addr, "GET", "/v1/models", &[("Origin", PAGE)], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
}

#[test]
fn bad_cors_origins_are_refused() {
    let Some(srv) = start_with(small(), None, |st| {
        for bad in ["localhost:3000", "ftp://x.org", "http://a b"] {
            assert!(st.set_cors_origins(&[bad.to_string()]).is_err(), "{bad}");
        }
    }) else {
        return;
    };
    drop(srv);
}

#[test]
fn metrics_behind_the_key_only_when_asked() {
    let Some(srv) = start(small(), Some("k")) else {
        return;
    };
    assert_eq!(get(srv.addr, "/metrics").status, 200);
    drop(srv);

    let Some(srv) = start_with(small(), Some("k"), |st| st.metrics_require_key = true) else {
        return;
    };
    assert_error(&get(srv.addr, "/metrics"), 401, None);
    let r = request(
        srv.addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer k")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert!(r.text().contains("nucleus_requests_running"));
    assert_eq!(get(srv.addr, "/health").status, 200);
}
