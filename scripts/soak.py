#!/usr/bin/env python3
"""Soak test of `nucleus serve` (loopback only, bounded in time and count; standard library only).

Starts the release binary on a free loopback port with the default model and a small queue
(--queue, default clients / 4, so that it fills and 429s happen), then
runs N concurrent clients (default 64) for a fixed time (default 600 s): chat and completions,
streaming and not, n = 1 to 3, prompts from a few tokens to a few hundred, small max_tokens, some
with an unknown field; clients that drop the connection mid-stream (FIN or RST) or before a
non-streamed answer; and malformed requests (see soak_requests.MALFORMED), mixed into the N
clients' requests and sent every half second by one more client. Then it waits for the
server to go idle and stops it with SIGTERM while a few short streams run.

Pass criteria (exit 1 and a line naming each failure otherwise):
  * every accepted (200) request completed (every choice has a finish_reason; a stream ends
    with [DONE]) or was cancelled by its own client; nothing hangs past --request-timeout;
  * no 5xx, no error event inside a stream, and the server's own counters agree
    (nucleus_http_requests_total{outcome="server_error"} and nucleus_sequences_failed_total are 0,
    and it cancelled no more sequences than the clients abandoned);
  * every malformed request gets the 4xx README promises, with a JSON error;
  * a 429 only when the queue was full: its code is `queue_full`, the waiting count in its
    message is at least --queue, and the clients themselves had at least --queue sequences that
    could have been waiting (the most sequences of requests in flight at any time between the
    429'd request's sending and its answer, plus those abandoned in the last ABANDON_GRACE_S
    seconds, which the server may not have noticed yet: dropped requests' sequences, and the
    choices a 429'd request had queued before the queue filled);
  * at the end, once idle, no KV block is held by a sequence: nucleus_kv_blocks_used is 0 and
    nucleus_kv_blocks_free equals nucleus_kv_blocks_capacity (prefix-cache blocks kept for reuse
    count as free: the next request may take them; they hold no sequence);
  * RSS (VmRSS of /proc/PID/status, sampled every --sample-every s) stays within --rss-tolerance
    (10 %) of its value at the end of the warm-up (--warmup, default 60 s or a quarter of the run);
  * SIGTERM, sent with --term-streams short streams in flight and --stalled connections open
    that sent half a request and went silent: the streams finish (the server lets in-flight
    requests finish for its --drain-secs, 10 s), and the server exits with status 0 within
    --term-timeout seconds after them, or after the drain and its 2 s of grace for connections
    still open when there are stalled ones; no panic in its log.

Writes DIR/soak.json (the summary and the samples), DIR/soak-rss.svg and DIR/server.log.

  scripts/soak.py                                   # the full run: 64 clients, 600 s
  scripts/soak.py --duration 45 --clients 16        # the short form (CI)
"""

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak_http import request  # noqa: E402
from soak_requests import MALFORMED, generation, malformed_ok  # noqa: E402
from soak_svg import rss_plot  # noqa: E402

HOST = "127.0.0.1"
ABANDON_GRACE_S = 30.0
DRAIN_S = 10  # the server's --drain-secs (its default)
CLOSE_GRACE_S = 2  # what the server gives connections still open after the drain
QUEUE_FULL_RE = re.compile(r"\((\d+) waiting\)")


def percentile(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def proc_status(pid, field):
    """A kB field of /proc/PID/status, in MiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def load_average():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class Soak:
    def __init__(self, args, port):
        self.args = args
        self.port = port
        self.rng = random.Random(args.seed)
        self.outcomes = Counter()  # by kind of request and outcome
        self.failures = []  # one line each
        self.ttft = []
        self.tokens = 0
        self.completed_seqs = 0
        self.abandoned_seqs = 0  # sequences of requests the clients dropped
        self.rejected_partial_seqs = 0  # choices of a 429'd request the engine may have taken
        self.in_flight_seqs = 0
        self.in_flight_before_end = []  # (time, in_flight_seqs just before a request ended)
        self.abandoned_at = []  # (time, sequences) of recent abandons, and of 429'd requests' choices
        self.sent = 0
        self.next_malformed = 0
        self.stalled = []  # sockets of the stalled connections
        self.peak_waiting = 0
        self.peak_running = 0

    def fail(self, what):
        if len(self.failures) < 200:
            self.failures.append(what)

    def could_be_waiting(self, since):
        """Sequences that could have been waiting at some moment after `since` (when the request
        now answered was sent; the server decided in between): the most in flight at any time
        since then (a request may have ended after the server counted it but before its 429 was
        read), plus those abandoned lately (the server drops them at its next step)."""
        now = time.monotonic()
        self.abandoned_at = [(t, n) for t, n in self.abandoned_at if now - t < ABANDON_GRACE_S]
        keep = now - self.args.request_timeout
        self.in_flight_before_end = [(t, n) for t, n in self.in_flight_before_end if t >= keep]
        peak = max([self.in_flight_seqs] + [n for t, n in self.in_flight_before_end if t >= since])
        return peak + sum(n for _, n in self.abandoned_at)

    def abandon(self, n):
        self.abandoned_seqs += n
        self.abandoned_at.append((time.monotonic(), n))

    async def metrics(self):
        r = await request(HOST, self.port, "GET", "/metrics")
        text = (await r.body()).decode()
        r.close()
        out = {}
        for line in text.splitlines():
            m = re.match(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    async def check_429(self, kind, data, n, sent_at):
        # The server submits a request's choices one by one; those it took before the queue
        # filled are cancelled with the refusal, and wait, as abandoned ones, for its next step.
        self.rejected_partial_seqs += n - 1
        try:
            err = json.loads(data)["error"]
        except (ValueError, KeyError, TypeError):
            self.fail(f"{kind}: a 429 without a JSON error: {data[:80]!r}")
            return
        m = QUEUE_FULL_RE.search(err.get("message", ""))
        bound = self.could_be_waiting(sent_at)
        if n > 1:
            self.abandoned_at.append((time.monotonic(), n - 1))
        if err.get("code") != "queue_full":
            self.fail(f"{kind}: a 429 with code {err.get('code')!r}, not queue_full")
        elif not m or int(m.group(1)) < self.args.queue:
            self.fail(f"{kind}: a 429 whose message does not show a full queue: {err.get('message')!r}")
        elif bound < self.args.queue:
            self.fail(f"{kind}: a 429 while the clients had only {bound} sequences that could wait "
                      f"(queue {self.args.queue})")

    async def generation(self, stream, drop):
        """One chat or completion request. `drop`: None, or how its client abandons it: "fin"
        (close) or "rst" (reset), after a few events of a stream, or after a random wait for a
        plain answer."""
        path, body, n = generation(self.rng, stream)
        kind = ("stream" if stream else "plain") + ("_dropped" if drop else "")
        self.sent += 1
        self.in_flight_seqs += n
        holder = {}
        try:
            exchange = self.exchange(path, body, n, stream, kind, drop, holder)
            if drop and not stream:
                try:
                    return await asyncio.wait_for(exchange, self.rng.uniform(0.2, 20.0))
                except asyncio.TimeoutError:
                    self.abandon(n)
                    self.outcomes[(kind, "cancelled_by_client")] += 1
                    return None
            return await exchange
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
            self.fail(f"{kind}: {type(e).__name__}: {e}"[:200])
            self.outcomes[(kind, "connection_error")] += 1
            return None
        finally:
            self.in_flight_before_end.append((time.monotonic(), self.in_flight_seqs))
            self.in_flight_seqs -= n
            if "resp" in holder:
                holder["resp"].close(abort=drop == "rst")

    async def exchange(self, path, body, n, stream, kind, drop, holder):
        """Sends the request and checks the answer; returns the HTTP status."""
        t0 = time.monotonic()
        resp = holder["resp"] = await request(HOST, self.port, "POST", path, body)
        if resp.status != 200:
            data = await resp.body()
            if resp.status == 429:
                await self.check_429(kind, data, n, t0)
                self.outcomes[(kind, "rejected_429")] += 1
            else:
                self.fail(f"{kind}: status {resp.status} for a well-formed request: {data[:160]!r}")
                self.outcomes[(kind, f"http_{resp.status}")] += 1
            return resp.status
        if not stream:
            data = json.loads(await resp.body())
            choices = data.get("choices", [])
            if len(choices) != n or not all(c.get("finish_reason") in ("stop", "length") for c in choices):
                self.fail(f"{kind}: incomplete answer: {json.dumps(data)[:160]}")
                self.outcomes[(kind, "incomplete")] += 1
                return 200
            self.tokens += data["usage"]["completion_tokens"]
            self.completed_seqs += n
            self.outcomes[(kind, "completed")] += 1
            return 200
        drop_after = self.rng.randint(1, 6)
        first, done, usage, finished, events = None, False, None, set(), 0
        async for line in resp.lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                done = True
                break
            ev = json.loads(payload)
            if "error" in ev:
                self.fail(f"{kind}: error event in the stream: {payload[:160]}")
                self.outcomes[(kind, "stream_error")] += 1
                return 200
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                text = c.get("text") or (c.get("delta") or {}).get("content")
                if first is None and text:
                    first = time.monotonic() - t0
                if c.get("finish_reason"):
                    finished.add(c.get("index"))
            events += 1
            if drop and events >= drop_after:
                self.abandon(n)
                self.outcomes[(kind, "cancelled_by_client")] += 1
                return 200
        if not done or len(finished) != n or usage is None:
            self.fail(f"{kind}: a stream ended without all {n} finish_reasons, usage and [DONE] "
                      f"(finished {sorted(finished)}, done {done})")
            self.outcomes[(kind, "incomplete")] += 1
            return 200
        if first is not None:
            self.ttft.append(first)
        self.tokens += usage["completion_tokens"]
        self.completed_seqs += n
        self.outcomes[(kind, "completed")] += 1
        return 200

    async def malformed(self):
        """The next malformed case (in turn, so that a short run still covers them all)."""
        name, method, path, body, ctype, allowed = MALFORMED[self.next_malformed % len(MALFORMED)]
        self.next_malformed += 1
        self.sent += 1
        try:
            resp = await request(HOST, self.port, method, path, body, content_type=ctype or "application/json")
            data = await resp.body()
            resp.close()
        except (OSError, ConnectionError, asyncio.IncompleteReadError) as e:
            self.fail(f"malformed {name}: {type(e).__name__}: {e}")
            self.outcomes[("malformed", "connection_error")] += 1
            return
        wrong = malformed_ok(resp.status, allowed, data)
        if wrong:
            self.fail(f"malformed {name}: {wrong}")
            self.outcomes[("malformed", f"wrong_{resp.status}")] += 1
        else:
            self.outcomes[("malformed", f"rejected_{resp.status}")] += 1

    async def one(self):
        r = self.rng.random()
        if r < 0.12:
            await self.malformed()
            return None
        stream = r < 0.62
        drop = None
        if self.rng.random() < (0.2 if stream else 0.08):
            drop = self.rng.choice(["fin", "rst"])
        return await self.generation(stream, drop)

    async def client(self, deadline, budget):
        while time.monotonic() < deadline and budget[0] > 0:
            budget[0] -= 1
            try:
                status = await asyncio.wait_for(self.one(), self.args.request_timeout)
            except asyncio.TimeoutError:
                self.fail(f"a request took longer than {self.args.request_timeout} s (a hang?)")
                self.outcomes[("any", "timeout")] += 1
                continue
            if status == 429:
                # As a polite client would: back off a random second or three.
                await asyncio.sleep(1.0 + 2.0 * self.rng.random())

    async def malformed_client(self, deadline, budget):
        """One more client, beside the N: a malformed request every half second."""
        while time.monotonic() < deadline and budget[0] > 0:
            budget[0] -= 1
            await asyncio.wait_for(self.malformed(), self.args.request_timeout)
            await asyncio.sleep(0.5)

    async def watch(self, pid, t0, stop, samples):
        while not stop.is_set():
            t = time.monotonic() - t0
            rss = proc_status(pid, "VmRSS")
            try:
                m = await self.metrics()
                self.peak_running = max(self.peak_running, m.get("nucleus_requests_running", 0))
                self.peak_waiting = max(self.peak_waiting, m.get("nucleus_requests_waiting", 0))
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                m = {}
            if rss is not None:
                samples.append({"t": round(t, 1), "rss_mib": round(rss, 1), "load1": load_average(),
                                "running": m.get("nucleus_requests_running"),
                                "waiting": m.get("nucleus_requests_waiting"),
                                "kv_used": m.get("nucleus_kv_blocks_used")})
            try:
                await asyncio.wait_for(stop.wait(), self.args.sample_every)
            except asyncio.TimeoutError:
                pass

    async def stall(self):
        """Connections that send half a request and go silent (half a head, or a head and half
        its body), held open to the end: the server must still stop on SIGTERM."""
        heads = [b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\n",
                 b"POST /v1/chat/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"messages\": ["]
        loop = asyncio.get_running_loop()
        for i in range(self.args.stalled):
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, (HOST, self.port))
            await loop.sock_sendall(sock, heads[i % 2])
            self.stalled.append(sock)

    async def run(self, pid):
        args = self.args
        await self.stall()
        before = await self.metrics()
        t0 = time.monotonic()
        stop = asyncio.Event()
        samples = []
        watcher = asyncio.ensure_future(self.watch(pid, t0, stop, samples))
        budget = [args.max_requests]
        deadline = t0 + args.duration
        clients = [self.client(deadline, budget) for _ in range(args.clients)]
        await asyncio.gather(self.malformed_client(deadline, budget), *clients)
        wall = time.monotonic() - t0
        # Idle: nothing running or waiting (abandoned sequences are dropped at the next step).
        idle_deadline = time.monotonic() + 60
        while True:
            after = await self.metrics()
            if after.get("nucleus_requests_running") == 0 and after.get("nucleus_requests_waiting") == 0:
                break
            if time.monotonic() > idle_deadline:
                self.fail(f"not idle 60 s after the load: {after.get('nucleus_requests_running')} "
                          f"running, {after.get('nucleus_requests_waiting')} waiting")
                break
            await asyncio.sleep(0.5)
        stop.set()
        await watcher
        return before, after, wall, samples


async def stop_server(soak, proc, streams, drain, timeout):
    """SIGTERM while `streams` short streams are running and the stalled connections are open:
    the streams must still finish (the server lets in-flight requests finish for `drain`
    seconds), and the server must exit 0 within `timeout` seconds of the last one ending, or,
    with stalled connections, of the drain and the server's 2 s of grace after it (it waits that
    long for open connections). Returns (exit status, seconds after SIGTERM)."""
    tasks, holders = [], []
    for i in range(streams):
        body = {"model": "any", "prompt": f"Count from {i + 1} upwards:", "max_tokens": 6,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        holder = {}
        holders.append(holder)
        tasks.append(asyncio.ensure_future(soak.exchange("/v1/completions", body, 1, True, "at_sigterm", None, holder)))
    deadline = time.monotonic() + 120
    while streams and time.monotonic() < deadline and not all(t.done() for t in tasks):
        m = await soak.metrics()
        if m.get("nucleus_requests_running", 0) + m.get("nucleus_requests_waiting", 0) >= streams:
            break
        await asyncio.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    for r in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(r, BaseException):
            soak.fail(f"a stream in flight at SIGTERM: {type(r).__name__}: {r}")
    for h in holders:
        if "resp" in h:
            h["resp"].close()
    ended = time.monotonic()
    if ended - t0 > drain:
        soak.fail(f"the streams in flight at SIGTERM took {ended - t0:.1f} s, more than the drain of {drain} s")
    limit = (t0 + drain + CLOSE_GRACE_S if soak.stalled else ended) + timeout
    while proc.poll() is None and time.monotonic() < limit:
        await asyncio.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        soak.fail(f"the server still ran {time.monotonic() - t0:.1f} s after SIGTERM")
        return None, None
    if proc.returncode != 0:
        soak.fail(f"the server exited with status {proc.returncode} after SIGTERM")
    for sock in soak.stalled:
        sock.close()
    return proc.returncode, round(time.monotonic() - t0, 2)


def free_port():
    s = socket.socket()
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()
    return port


async def wait_healthy(port, proc, timeout=300):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"soak: the server exited early with status {proc.returncode}")
        try:
            r = await request(HOST, port, "GET", "/health")
            await r.body()
            r.close()
            if r.status == 200:
                return
        except (OSError, ConnectionError, asyncio.IncompleteReadError):
            pass
        await asyncio.sleep(0.2)
    sys.exit("soak: the server did not become healthy")


def counter_checks(soak, before, after):
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    if d.get('nucleus_http_requests_total{outcome="server_error"}', 0) != 0:
        soak.fail("the server counted server errors (5xx)")
    if d.get("nucleus_sequences_failed_total", 0) != 0:
        soak.fail(f"{d['nucleus_sequences_failed_total']:.0f} sequences failed in the engine")
    cancelled = d.get("nucleus_sequences_cancelled_total", 0)
    if cancelled > soak.abandoned_seqs + soak.rejected_partial_seqs:
        soak.fail(f"the engine cancelled {cancelled:.0f} sequences; the clients abandoned only "
                  f"{soak.abandoned_seqs} (+{soak.rejected_partial_seqs} choices of 429'd requests)")
    finished = d.get("nucleus_sequences_finished_total", 0)
    if finished < soak.completed_seqs:
        soak.fail(f"the engine finished {finished:.0f} sequences; the clients saw {soak.completed_seqs}")
    if after.get("nucleus_kv_blocks_used") != 0:
        soak.fail(f"{after.get('nucleus_kv_blocks_used')} KV blocks still held by sequences when idle")
    if after.get("nucleus_kv_blocks_free") != after.get("nucleus_kv_blocks_capacity"):
        soak.fail(f"KV blocks free {after.get('nucleus_kv_blocks_free')} of "
                  f"{after.get('nucleus_kv_blocks_capacity')} when idle")
    return d


def rss_checks(soak, samples, warmup, tolerance):
    after = [s for s in samples if s["t"] >= warmup]
    if not after:
        soak.fail("no RSS sample after the warm-up")
        return None
    base = after[0]["rss_mib"]
    worst = max(after, key=lambda s: abs(s["rss_mib"] - base))
    if abs(worst["rss_mib"] - base) > tolerance * base:
        soak.fail(f"RSS {worst['rss_mib']} MiB at {worst['t']} s is more than {tolerance:.1%} away "
                  f"from {base} MiB at the end of the warm-up")
    return base


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "nucleus"))
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load (no new request after)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-requests", type=int, default=100000, help="requests at most, all clients together")
    ap.add_argument("--queue", type=int, help="the server's --queue (default: clients / 4, small so that it fills)")
    ap.add_argument("--max-running", type=int, default=16, help="the server's --max-running")
    ap.add_argument("--threads", type=int, default=0, help="the server's --threads")
    ap.add_argument("--warmup", type=float, help="seconds before the RSS baseline (default: min(60, duration/4))")
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--sample-every", type=float, default=2.0, help="seconds between RSS samples")
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--term-timeout", type=float, default=5.0, help="seconds the server has to exit on SIGTERM")
    ap.add_argument("--term-streams", type=int, default=4, help="streams in flight when SIGTERM is sent")
    ap.add_argument("--stalled", type=int, default=4, help="connections that send half a request and go silent")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "soak"))
    args = ap.parse_args()
    if args.queue is None:
        args.queue = max(2, args.clients // 4)
    warmup = args.warmup if args.warmup is not None else min(60.0, args.duration / 4)
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"soak: {args.bin} is not an executable; build it with `cargo build --release -p nucleus-cli`")
    os.makedirs(args.out, exist_ok=True)

    port = free_port()
    cmd = [args.bin, "serve", args.model, "--host", HOST, "--port", str(port), "--threads", str(args.threads),
           "--queue", str(args.queue), "--max-running", str(args.max_running), "--drain-secs", str(DRAIN_S)]
    log_path = os.path.join(args.out, "server.log")
    log = open(log_path, "w")
    print("soak: starting", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    soak = Soak(args, port)
    load_before = load_average()
    try:
        asyncio.run(wait_healthy(port, proc))
        print(f"soak: {args.clients} clients for {args.duration:.0f} s", flush=True)
        before, after, wall, samples = asyncio.run(soak.run(proc.pid))
    except BaseException:
        proc.kill()
        raise
    d = counter_checks(soak, before, after)
    vm_hwm = proc_status(proc.pid, "VmHWM")
    base = rss_checks(soak, samples, warmup, args.rss_tolerance)
    by_outcome = Counter()
    for (_, outcome), c in soak.outcomes.items():
        by_outcome[outcome] += c
    completed, tokens, ttft = by_outcome["completed"], soak.tokens, list(soak.ttft)
    exit_code, exit_s = asyncio.run(stop_server(soak, proc, args.term_streams, DRAIN_S, args.term_timeout))
    log.close()
    with open(log_path, errors="replace") as f:
        server_log = f.read()
    if "panicked" in server_log:
        soak.fail(f"a panic in the server's log ({log_path})")
    if "nucleus serve: stopped" not in server_log:
        soak.fail(f"the server's log does not end with `nucleus serve: stopped` ({log_path})")

    loads = [s["load1"] for s in samples]
    rss = [s["rss_mib"] for s in samples]
    summary = {
        "command": " ".join([sys.argv[0]] + sys.argv[1:]),
        "server": " ".join(cmd),
        "clients": args.clients,
        "duration_s": round(wall, 1),
        "requests_sent": soak.sent,
        "outcomes": dict(sorted(by_outcome.items())),
        "outcomes_by_kind": {f"{k}/{o}": c for (k, o), c in sorted(soak.outcomes.items())},
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "completed_requests_per_s": round(completed / wall, 2),
        "completion_tokens_of_completed": tokens,
        "completed_tokens_per_s": round(tokens / wall, 1),
        "server_generated_tokens_per_s": round(d.get("nucleus_generation_tokens_total", 0) / wall, 1),
        "server_sequences": {k.removeprefix("nucleus_sequences_").removesuffix("_total"): d.get(k, 0)
                             for k in ("nucleus_sequences_finished_total", "nucleus_sequences_cancelled_total",
                                       "nucleus_sequences_failed_total")},
        "preemptions": d.get("nucleus_preemptions_total", 0),
        "peak_running": soak.peak_running,
        "peak_waiting": soak.peak_waiting,
        "queue": args.queue,
        "kv_blocks_idle": {k: after.get(f"nucleus_kv_blocks_{k}") for k in ("used", "free", "cached", "total")},
        "warmup_s": warmup,
        "rss_mib": {"start": rss[0] if rss else None, "baseline": base, "end": rss[-1] if rss else None,
                    "max": max(rss, default=None), "vm_hwm": round(vm_hwm, 1) if vm_hwm else None},
        "load_average_1m": {"before": load_before, "mean": round(sum(loads) / len(loads), 2) if loads else None,
                            "max": max(loads, default=None)},
        "sigterm": {"exit_status": exit_code, "seconds": exit_s, "streams_in_flight": args.term_streams,
                    "stalled_connections": args.stalled},
        "failures": soak.failures,
        "samples": samples,
    }
    for k in ("ttft_p50_s", "ttft_p99_s"):
        if summary[k] is not None:
            summary[k] = round(summary[k], 3)
    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump(summary, f, indent=1)
    title = f"nucleus serve RSS: {args.clients} clients, {args.duration:.0f} s of load, then idle"
    with open(os.path.join(args.out, "soak-rss.svg"), "w") as f:
        f.write(rss_plot([(s["t"], s["rss_mib"]) for s in samples], warmup, base, args.rss_tolerance, title))
    for k, v in summary.items():
        if k not in ("samples", "failures", "outcomes_by_kind"):
            print(f"{k:>32}: {v}")
    for line in soak.failures:
        print("FAIL:", line)
    ok = not soak.failures and completed > 0
    print(f"soak: {'ok' if ok else 'FAILED'} (results in {args.out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
