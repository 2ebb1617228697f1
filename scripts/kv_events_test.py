#!/usr/bin/env python3
"""KV-cache events as llm-d's indexer receives them: starts `nucleus serve --kv-events` on the
default model with a small KV pool (so that blocks are evicted), subscribes with ZeroMQ (pyzmq)
on loopback, runs a mixed workload (prompts sharing prefixes, distinct long prompts that force
evictions, concurrent requests), and checks that:

- every message is [topic `kv@<pod>@<model>`, 8-byte big-endian sequence, msgpack payload],
  sequence numbers without gaps, payload `[ts, [events]]` decoded by msgpack (not our encoder);
- each BlockStored carries one hash, its parent (nil for a prompt's first block) and exactly
  block_size token ids, the first of them equal to the prompt's tokens (from /tokenize);
- replaying the events (BlockStored adds, BlockRemoved removes, AllBlocksCleared clears) gives
  exactly the server's cached-block set (`GET /kv_blocks`), with removals among them.

Needs pyzmq and msgpack (installed into target/kv-events-venv by scripts/kv_events_test.sh).
Exits non-zero on any failure.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import msgpack
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("NUCLEUS_BIN", os.path.join(ROOT, "target/release/nucleus"))
MODEL = os.environ.get("MODEL", "qwen2.5-coder-0.5b-instruct")
BLOCK = 16


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        sys.exit(f"{path}: HTTP {e.code}: {e.read().decode(errors='replace')}")


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return json.load(r)


def main():
    port, zport = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", str(port), "--ctx", "512",
         "--kv-tokens", "1024", "--max-running", "4", "--block-size", str(BLOCK),
         "--kv-events", f"tcp://127.0.0.1:{zport}", "--kv-events-pod", "pod-a"],
        stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        if "on http://" not in line:
            sys.exit(f"the server did not start: {line}{server.stderr.read()}")
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
        run(base, zport)
    finally:
        server.terminate()
        server.wait(timeout=60)


def run(base, zport):
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{zport}")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    time.sleep(1.0)  # ZeroMQ's slow joiner: the subscription reaches the publisher first

    messages = []
    stop = threading.Event()

    def receive():
        while not stop.is_set():
            if sub.poll(100):
                messages.append(sub.recv_multipart())

    rx = threading.Thread(target=receive)
    rx.start()

    shared = ("You are a careful assistant who answers questions about the Python standard "
              "library with short, correct examples. ") * 3
    prompts = [shared + f"Question {i}: how do I use the module number {i}?" for i in range(6)]
    # Long distinct prompts: more blocks than the pool keeps, so cached blocks are evicted.
    prompts += [" ".join(f"word{j}_{i}" for j in range(60)) for i in range(8)]
    prompts += [shared + "Question 0: how do I use the module number 0?"]  # a cache hit

    def complete(p):
        post(base, "/v1/completions", {"prompt": p, "max_tokens": 4, "temperature": 0})

    for p in prompts[:6]:
        complete(p)
    threads = [threading.Thread(target=complete, args=(p,)) for p in prompts[6:10]]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for p in prompts[10:]:
        complete(p)

    # Quiet: no event for a second after the last request.
    n = -1
    while n != len(messages):
        n = len(messages)
        time.sleep(1.0)
    stop.set()
    rx.join()
    sub.close()
    ctx.term()
    state = get(base, "/kv_blocks")
    assert state["block_size"] == BLOCK, state

    cached, stored, removed, prev_seq = set(), 0, 0, None
    tokens_of = {}
    for frames in messages:
        assert len(frames) == 3, f"{len(frames)} frames"
        topic, seq, payload = frames
        assert topic == f"kv@pod-a@{MODEL}".encode(), topic
        seq = int.from_bytes(seq, "big")
        assert prev_seq is None or seq == prev_seq + 1, f"sequence {prev_seq} -> {seq}"
        prev_seq = seq
        ts, events = msgpack.unpackb(payload, raw=False)
        assert abs(ts - time.time()) < 600, ts
        for e in events:
            tag = e[0]
            if tag == "BlockStored":
                hashes, parent, toks, bs = e[1], e[2], e[3], e[4]
                assert bs == BLOCK and len(hashes) == 1 and len(toks) == BLOCK, e
                assert parent is None or isinstance(parent, int), e
                assert hashes[0] not in cached, f"stored twice: {e}"
                cached.add(hashes[0])
                tokens_of[hashes[0]] = (parent, toks)
                stored += 1
            elif tag == "BlockRemoved":
                for h in e[1]:
                    assert h in cached, f"removed a block never stored: {h}"
                    cached.discard(h)
                    removed += 1
            elif tag == "AllBlocksCleared":
                cached.clear()
            else:
                raise AssertionError(f"unknown event {e}")

    want = set(state["hashes"])
    assert cached == want, (f"replay holds {len(cached)} blocks, the server {len(want)}: "
                            f"{len(cached - want)} extra, {len(want - cached)} missing")
    assert removed > 0, "the workload evicted nothing: the test proves less than it says"
    # The shared prompt's first block: no parent, the prompt's first 16 tokens.
    first = post(base, "/tokenize", {"content": prompts[0]})["tokens"][:BLOCK]
    roots = [toks for parent, toks in tokens_of.values() if parent is None]
    assert first in roots, "the first prompt's first block was not stored with its tokens"
    print(f"KV events: {len(messages)} messages, {stored} blocks stored, {removed} removed; "
          f"the replay equals the server's {len(want)} cached blocks")


if __name__ == "__main__":
    main()
