//! KV-cache events on a ZeroMQ PUB socket, in the format llm-d's KV-cache indexer reads from
//! vLLM (llm-d-kv-cache's vLLM adapter): each message is three frames, the topic
//! `kv@<pod>@<model>`, an 8-byte big-endian sequence number, and a msgpack payload
//! `[timestamp, [event, ...]]` whose events are tagged arrays:
//! `["BlockStored", [hash], parent_hash | nil, [token ids], block_size]`,
//! `["BlockRemoved", [hash, ...]]` and `["AllBlocksCleared"]`.
//!
//! Hashes are nucleus's block hashes cut to their low 64 bits (the indexer keys blocks by
//! 64-bit integers; it computes its own keys from the token ids). The first message says
//! `AllBlocksCleared`: a subscriber that knew an earlier process of this pod starts afresh.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use nucleus::kv_cache::{BlockHash, KvEvent};
use tokio::sync::mpsc::UnboundedReceiver;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

/// Where and under which topic the events go.
#[derive(Debug, Clone)]
pub struct KvEventsConfig {
    /// A ZeroMQ endpoint, e.g. `tcp://*:5557`.
    pub endpoint: String,
    /// Connect to the endpoint (a central subscriber that binds) instead of binding it (each
    /// pod's socket found by the indexer).
    pub connect: bool,
    /// `kv@<pod>@<model>`.
    pub topic: String,
    pub block_size: usize,
}

/// Binds (or connects) the socket; then [`publish`] sends the events. Fails with the
/// endpoint's error.
pub async fn open(cfg: &KvEventsConfig) -> Result<PubSocket, String> {
    let mut socket = PubSocket::new();
    let r = if cfg.connect {
        socket.connect(&cfg.endpoint).await
    } else {
        socket.bind(&cfg.endpoint).await.map(|_| ())
    };
    r.map_err(|e| format!("cannot open the KV events socket {}: {e}", cfg.endpoint))?;
    Ok(socket)
}

/// Sends every batch of events from `rx` until the engine drops its end.
pub async fn publish(
    mut socket: PubSocket,
    cfg: KvEventsConfig,
    mut rx: UnboundedReceiver<Vec<KvEvent>>,
) {
    let mut seq: u64 = 0;
    let mut send = |payload: Vec<u8>| {
        let frames = vec![
            Bytes::from(cfg.topic.clone().into_bytes()),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ];
        seq += 1;
        ZmqMessage::try_from(frames).expect("three frames")
    };
    let cleared = send(encode_cleared());
    let _ = socket.send(cleared).await;
    while let Some(events) = rx.recv().await {
        let msg = send(encode_batch(&events, cfg.block_size));
        // A PUB socket drops what no subscriber takes; an error means the socket is gone.
        if socket.send(msg).await.is_err() {
            break;
        }
    }
}

/// The 64 bits of a block hash the indexer keys by.
pub fn wire_hash(h: BlockHash) -> u64 {
    h as u64
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn encode_cleared() -> Vec<u8> {
    let mut p = Pack::default();
    p.array(2)
        .float(now())
        .array(1)
        .array(1)
        .str("AllBlocksCleared");
    p.0
}

/// `[ts, [events]]`, with consecutive removals in one `BlockRemoved`.
pub fn encode_batch(events: &[KvEvent], block_size: usize) -> Vec<u8> {
    let mut groups: Vec<&[KvEvent]> = Vec::new();
    let mut rest = events;
    while let Some(first) = rest.first() {
        let n = match first {
            KvEvent::Stored { .. } => 1,
            KvEvent::Removed { .. } => rest
                .iter()
                .take_while(|e| matches!(e, KvEvent::Removed { .. }))
                .count(),
        };
        let (g, r) = rest.split_at(n);
        groups.push(g);
        rest = r;
    }
    let mut p = Pack::default();
    p.array(2).float(now()).array(groups.len());
    for g in groups {
        match &g[0] {
            KvEvent::Stored {
                hash,
                parent,
                tokens,
            } => {
                p.array(5)
                    .str("BlockStored")
                    .array(1)
                    .uint(wire_hash(*hash));
                match parent {
                    Some(h) => p.uint(wire_hash(*h)),
                    None => p.nil(),
                };
                p.array(tokens.len());
                for &t in tokens {
                    p.uint(u64::from(t));
                }
                p.uint(block_size as u64);
            }
            KvEvent::Removed { .. } => {
                p.array(2).str("BlockRemoved").array(g.len());
                for e in g {
                    if let KvEvent::Removed { hash } = e {
                        p.uint(wire_hash(*hash));
                    }
                }
            }
        }
    }
    p.0
}

/// A msgpack writer into memory, where writing cannot fail.
#[derive(Default)]
struct Pack(Vec<u8>);

impl Pack {
    fn array(&mut self, n: usize) -> &mut Self {
        let n = u32::try_from(n).expect("fewer than 2^32 elements");
        rmp::encode::write_array_len(&mut self.0, n).expect("writes to a Vec");
        self
    }
    fn uint(&mut self, v: u64) -> &mut Self {
        rmp::encode::write_uint(&mut self.0, v).expect("writes to a Vec");
        self
    }
    fn float(&mut self, v: f64) -> &mut Self {
        rmp::encode::write_f64(&mut self.0, v).expect("writes to a Vec");
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        rmp::encode::write_str(&mut self.0, s).expect("writes to a Vec");
        self
    }
    fn nil(&mut self) -> &mut Self {
        rmp::encode::write_nil(&mut self.0).expect("writes to a Vec");
        self
    }
}
