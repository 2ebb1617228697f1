//! `GET /`: the chat page, served from the binary, without the API key; it loads nothing from
//! elsewhere. (Its behaviour in a browser: `scripts/browser_test.py`.)

use crate::common::*;

#[test]
fn the_chat_page_is_served_at_the_root() {
    let Some(srv) = start(small(), Some("k")) else {
        return;
    };
    let r = get(srv.addr, "/");
    assert_eq!(r.status, 200, "the page needs no key: {}", r.text());
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(r
        .header("content-security-policy")
        .is_some_and(|c| c.contains("default-src 'self'")));
    let html = r.text();
    assert!(html.starts_with("<!doctype html>"));
    for needle in [
        "/v1/chat/completions",
        "top_logprobs",
        "explain",
        "id=\"stop\"",
    ] {
        assert!(html.contains(needle), "{needle}");
    }
    // Nothing from elsewhere: no absolute URLs in src/href attributes.
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
    // The API stays behind the key.
    assert_error(&get(srv.addr, "/v1/models"), 401, None);
    assert_error(&request(srv.addr, "POST", "/", &[], b""), 405, None);
}
