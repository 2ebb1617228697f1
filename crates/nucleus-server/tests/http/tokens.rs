//! `/tokenize`, `/detokenize` and `/v1/embeddings` over loopback, their bad values, and the API
//! key on them.

use serde_json::{json, Value};

use crate::common::*;

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn tokenize_detokenize_round_trip_with_pieces() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    let text = "Hello world, the café is open";
    let r = post(a, "/tokenize", &json!({"content": text}));
    assert_eq!(r.status, 200, "{}", r.text());
    let plain = ids(&r.json()["tokens"]);
    assert!(plain.len() >= 5, "{plain:?}");
    assert_ne!(plain[0], 1, "no BOS unless add_special");

    let r = post(a, "/detokenize", &json!({"tokens": plain}));
    assert_eq!(r.status, 200, "{}", r.text());
    let back = r.json()["content"].as_str().unwrap().to_string();
    // The SPM vocabulary writes the leading word boundary as a space.
    assert_eq!(back.trim_start(), text);

    let r = post(
        a,
        "/tokenize",
        &json!({"content": text, "with_pieces": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let pieces = r.json()["tokens"].as_array().unwrap().clone();
    assert_eq!(pieces.len(), plain.len());
    let mut joined = Vec::new();
    for (p, &id) in pieces.iter().zip(&plain) {
        assert_eq!(p["id"].as_u64(), Some(id), "{p}");
        match &p["piece"] {
            Value::String(s) => joined.extend_from_slice(s.as_bytes()),
            Value::Array(bytes) => joined.extend(bytes.iter().map(|b| b.as_u64().unwrap() as u8)),
            other => panic!("bad piece {other}"),
        }
    }
    assert_eq!(String::from_utf8(joined).unwrap(), back);

    let r = post(
        a,
        "/tokenize",
        &json!({"content": text, "add_special": true}),
    );
    let with_bos = ids(&r.json()["tokens"]);
    assert_eq!(with_bos[0], 1, "BOS first");
    assert_eq!(&with_bos[1..], &plain[..]);

    // Special-token text is parsed unless asked otherwise.
    let r = post(a, "/tokenize", &json!({"content": "</s>"}));
    assert_eq!(ids(&r.json()["tokens"]), vec![2]);
    let r = post(
        a,
        "/tokenize",
        &json!({"content": "</s>", "parse_special": false}),
    );
    assert!(ids(&r.json()["tokens"]).len() > 1);
    let r = post(a, "/detokenize", &json!({"tokens": [1, 2]}));
    assert_eq!(r.json()["content"], "<s></s>");
}

#[test]
fn tokenize_and_detokenize_bad_values() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    assert_error(&post(a, "/tokenize", &json!({})), 400, Some("content"));
    assert_error(
        &post(a, "/tokenize", &json!({"content": 5})),
        400,
        Some("content"),
    );
    assert_error(
        &post(
            a,
            "/tokenize",
            &json!({"content": "x", "with_pieces": "yes"}),
        ),
        400,
        Some("with_pieces"),
    );
    let v = assert_error(
        &post(a, "/tokenize", &json!({"content": "x", "add_bos": true})),
        400,
        Some("add_bos"),
    );
    assert_eq!(v["error"]["code"], "unknown_field");
    for bad in [
        json!([32000]),
        json!([-1]),
        json!([1.5]),
        json!(["a"]),
        json!([null]),
    ] {
        assert_error(
            &post(a, "/detokenize", &json!({ "tokens": bad })),
            400,
            Some("tokens"),
        );
    }
    assert_error(&post(a, "/detokenize", &json!({})), 400, Some("tokens"));
    let r = post(a, "/detokenize", &json!({"tokens": []}));
    assert_eq!(r.json()["content"], "");
    assert_eq!(get(a, "/health").status, 200);
}

/// An embedding as the f32 values the server computed (JSON gives their shortest repr).
fn embedding(v: &Value) -> Vec<f32> {
    v["embedding"]
        .as_array()
        .unwrap_or_else(|| panic!("no embedding: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn unbase64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("bad base64 {c}"),
    };
    let mut out = Vec::new();
    for quad in s.as_bytes().chunks(4) {
        let n = quad
            .iter()
            .take_while(|&&c| c != b'=')
            .fold(0u32, |acc, &c| acc << 6 | u32::from(val(c)));
        let len = quad.iter().take_while(|&&c| c != b'=').count();
        let n = n << (6 * (4 - len));
        out.extend_from_slice(&n.to_be_bytes()[1..len]);
    }
    out
}

#[test]
fn embeddings_float_base64_tokens_and_batches() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    let e = "/v1/embeddings";
    let r = post(
        a,
        e,
        &json!({"input": "The quick brown fox", "model": "tiny"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["object"], "embedding");
    let one = embedding(&v["data"][0]);
    assert_eq!(one.len(), 256, "the tiny model's width");
    let norm: f64 = one.iter().map(|&x| f64::from(x * x)).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    let n_tok = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(n_tok > 1);
    assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(n_tok));

    // The same text as token ids (what the server tokenizes: BOS, no special parsing).
    let t = post(
        a,
        "/tokenize",
        &json!({"content": "The quick brown fox", "add_special": true, "parse_special": false}),
    )
    .json();
    assert_eq!(t["tokens"].as_array().unwrap().len() as u64, n_tok);
    let r = post(a, e, &json!({"input": t["tokens"]}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(embedding(&r.json()["data"][0]), one);

    // A batch: in order, each as it is alone.
    let r = post(
        a,
        e,
        &json!({"input": ["Lorem ipsum dolor", "The quick brown fox"]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let d = r.json()["data"].as_array().unwrap().clone();
    assert_eq!(d.len(), 2);
    assert_eq!(d[1]["index"], 1);
    assert_eq!(embedding(&d[1]), one);
    assert_ne!(embedding(&d[0]), one);
    let r = post(a, e, &json!({"input": [t["tokens"], [5, 6, 7]]}));
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 2);

    // base64: the same floats, little-endian f32.
    let r = post(
        a,
        e,
        &json!({"input": "The quick brown fox", "encoding_format": "base64"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let bytes = unbase64(r.json()["data"][0]["embedding"].as_str().unwrap());
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(floats, one);

    let m = get(a, "/v1/models").json();
    assert_eq!(m["data"][0]["meta"]["n_embd"], 256);
    assert!(m["data"][0]["meta"]["embeddings"]
        .as_str()
        .unwrap()
        .contains("mean"));
}

#[test]
fn embeddings_bad_values() {
    let Some(srv) = start(small(), None) else {
        return;
    };
    let a = srv.addr;
    let e = "/v1/embeddings";
    for (body, param) in [
        (json!({}), "input"),
        (json!({"input": ""}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": [[]]}), "input"),
        (json!({"input": 3}), "input"),
        (json!({"input": [1, "a"]}), "input"),
        (json!({"input": [32000]}), "input"),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": "x", "dimensions": 64}), "dimensions"),
        (json!({"input": "x", "pooling": "cls"}), "pooling"),
    ] {
        assert_error(&post(a, e, &body), 400, Some(param));
    }
    let long = "hello ".repeat(400);
    let v = assert_error(&post(a, e, &json!({"input": long})), 400, Some("input"));
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let r = post(a, e, &json!({"input": "x", "dimensions": 256}));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn the_api_key_guards_tokenize_and_embeddings() {
    let Some(srv) = start(small(), Some("s3cret")) else {
        return;
    };
    for (path, body) in [
        ("/tokenize", json!({"content": "hi"})),
        ("/detokenize", json!({"tokens": [1]})),
        ("/v1/embeddings", json!({"input": "hi"})),
    ] {
        let b = body.to_string();
        assert_error(
            &request(srv.addr, "POST", path, &[], b.as_bytes()),
            401,
            None,
        );
        let r = request(
            srv.addr,
            "POST",
            path,
            &[("Authorization", "Bearer s3cret")],
            b.as_bytes(),
        );
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
}
