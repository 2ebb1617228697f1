#!/usr/bin/env python3
"""Load test of `nucleus serve` (loopback only, bounded in time and count; stdlib only).

N concurrent streaming clients (default 32) send chat completions with mixed prompt lengths for
a fixed duration (default 60 s). Reports requests completed, errors by kind, p50/p95 time to
first token, aggregate generated tokens/s and the server's peak RSS (VmHWM). Fails (exit 1) on
any 5xx, any lost request (a stream that ends without a finish_reason and [DONE]), any error
other than 429 "queue full", or a server that does not return to idle (KV blocks all freed).

  scripts/load_test.py --start target/release/nucleus qwen2.5-coder-0.5b-instruct --duration 60
  scripts/load_test.py --url http://127.0.0.1:8080 --pid 12345
"""

import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter

WORDS = (
    "the quick brown fox jumps over a lazy dog while the compiler checks every borrow and the "
    "scheduler batches decode tokens with prefill chunks so that long prompts never stall "
    "running streams of tokens from many users at once"
).split()


def make_prompt(rng, kind):
    n = {"short": rng.randint(3, 12), "medium": rng.randint(60, 120), "long": rng.randint(300, 500)}[kind]
    body = " ".join(rng.choice(WORDS) for _ in range(n))
    return f"Summarise this text in one sentence: {body}"


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.completed = 0
        self.errors = Counter()
        self.ttft = []
        self.tokens = 0
        self.sent = 0

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                if k == "error":
                    self.errors[v] += 1
                elif k == "ttft":
                    self.ttft.append(v)
                else:
                    setattr(self, k, getattr(self, k) + v)


def one_request(host, port, rng, args, stats):
    kind = rng.choice(["short", "short", "medium", "medium", "long"])
    body = {
        "model": "any",
        "messages": [{"role": "user", "content": make_prompt(rng, kind)}],
        "max_tokens": rng.randint(args.min_tokens, args.max_tokens),
        "temperature": 0.7,
        "seed": rng.randint(0, 1 << 30),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.monotonic()
    stats.add(sent=1)
    conn = http.client.HTTPConnection(host, port, timeout=args.request_timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            data = resp.read()
            code = None
            try:
                code = json.loads(data)["error"].get("code")
            except Exception:
                pass
            stats.add(error=f"http_{resp.status}" + (f"_{code}" if code else ""))
            return resp.status
        first = None
        finished = done = False
        usage = None
        for raw in resp:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                stats.add(error="stream_error:" + str(ev["error"].get("message"))[:60])
                return 500
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                if first is None and ch.get("delta", {}).get("content"):
                    first = time.monotonic() - t0
                if ch.get("finish_reason"):
                    finished = True
        if not (finished and done):
            stats.add(error="lost_stream")
            return 0
        if first is not None:
            stats.add(ttft=first)
        stats.add(completed=1, tokens=(usage or {}).get("completion_tokens", 0))
        return 200
    except (OSError, http.client.HTTPException) as e:
        stats.add(error=f"connection:{type(e).__name__}")
        return 0
    finally:
        conn.close()


def worker(i, host, port, args, stats, deadline, budget):
    rng = random.Random(args.seed * 1000 + i)
    while time.monotonic() < deadline:
        with budget["lock"]:
            if budget["left"] <= 0:
                return
            budget["left"] -= 1
        status = one_request(host, port, rng, args, stats)
        if status == 429:
            time.sleep(0.2 + rng.random() * 0.3)


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def peak_rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def wait_healthy(url, proc, timeout=180):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"the server exited early with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("the server did not become healthy")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (loopback only)")
    ap.add_argument("--pid", type=int, help="pid of the running server (for its peak RSS)")
    ap.add_argument("--start", nargs=2, metavar=("BIN", "MODEL"), help="start BIN serve MODEL on a free port")
    ap.add_argument("--server-args", default="", help="extra arguments for `serve` with --start")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load (new requests stop after this)")
    ap.add_argument("--max-requests", type=int, default=2000)
    ap.add_argument("--min-tokens", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the report as JSON here")
    args = ap.parse_args()

    proc = None
    if args.start:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        url = f"http://127.0.0.1:{port}"
        cmd = [args.start[0], "serve", args.start[1], "--host", "127.0.0.1", "--port", str(port)]
        cmd += args.server_args.split()
        log = open(os.environ.get("LOAD_TEST_LOG", "/tmp/nucleus-load-test-server.log"), "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        pid = proc.pid
    elif args.url:
        url = args.url.rstrip("/")
        pid = args.pid
    else:
        ap.error("give --url or --start")
    host = urllib.parse.urlparse(url).hostname
    port = urllib.parse.urlparse(url).port or 80
    if host not in ("127.0.0.1", "localhost", "::1"):
        ap.error("loopback servers only")

    try:
        wait_healthy(url, proc)
        stats = Stats()
        budget = {"lock": threading.Lock(), "left": args.max_requests}
        t0 = time.monotonic()
        deadline = t0 + args.duration
        threads = [threading.Thread(target=worker, args=(i, host, port, args, stats, deadline, budget))
                   for i in range(args.clients)]
        peak_running = peak_waiting = 0
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            try:
                m = metrics(url)
                peak_running = max(peak_running, m.get("nucleus_requests_running", 0))
                peak_waiting = max(peak_waiting, m.get("nucleus_requests_waiting", 0))
            except OSError:
                pass
            time.sleep(0.5)
        wall = time.monotonic() - t0
        m = metrics(url)
        rss = peak_rss_mib(pid) if pid else None
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    bad = {k: v for k, v in stats.errors.items() if not k.startswith("http_429_queue_full")}
    idle = (m.get("nucleus_requests_running") == 0 and m.get("nucleus_requests_waiting") == 0
            and m.get("nucleus_kv_blocks_used") == 0)
    report = {
        "clients": args.clients,
        "duration_s": round(wall, 1),
        "requests_sent": stats.sent,
        "requests_completed": stats.completed,
        "errors": dict(stats.errors),
        "ttft_p50_s": round(percentile(stats.ttft, 50), 3),
        "ttft_p95_s": round(percentile(stats.ttft, 95), 3),
        "generated_tokens": stats.tokens,
        "aggregate_tokens_per_s": round(stats.tokens / wall, 1),
        "peak_rss_mib": round(rss, 1) if rss else None,
        "peak_running": peak_running,
        "peak_waiting": peak_waiting,
        "preemptions": m.get("nucleus_preemptions_total"),
        "server_idle_after": idle,
        "server_exit_status": proc.returncode if proc is not None else None,
    }
    for k, v in report.items():
        print(f"{k:>24}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    lost = stats.sent - stats.completed - sum(stats.errors.values())
    ok = not bad and lost == 0 and idle and stats.completed > 0
    print("load test:", "ok" if ok else f"FAILED (unexpected errors {bad}, lost {lost}, idle {idle})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
