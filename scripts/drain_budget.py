#!/usr/bin/env python3
"""The longest a request can live in one replica at the shipped Deployment's limits, measured,
and the drain settings derived from it (issue 30: `preStop` and `terminationGracePeriodSeconds`
sized from a measured worst case).

One `nucleus serve` of the catalog model runs with the serve flags of
deploy/kubernetes/nucleus-deployment.yaml, as they are (--threads, --ctx, --max-running,
--queue, --max-tokens, --kv-tokens ...). The heaviest load a replica takes is every decode
slot and every queue place filled (--max-running + --queue requests; one more gets 429, so
no HPA lag can put more in one pod), each request generating the most the flags allow:
`max_tokens` far above --max-tokens with `ignore_eos`, so it generates exactly --max-tokens
tokens, after a prompt of --prompt-tokens distinct tokens (no prefix-cache hits; default: the
Deployment's --max-prompt-tokens, the longest prompt a replica accepts, so that the default run
measures the worst case). That many clients send such
requests back to back for --rounds rounds; each request's lifetime is from its send to its
last byte (queue wait + prefill + generation), the time to its first token is printed beside.

From the p100 lifetime L (the p99 is printed too):
  --drain-secs    >= L x 1.25, rounded up to a minute: a request accepted in the last instant of
                  the unready window still finishes inside the drain;
  preStop sleep    = the time endpoint removal takes to reach the gateway and the picker
                  (a few seconds; the Deployment's value is taken and checked to be >= 5 s);
  terminationGracePeriodSeconds >= preStop + --unready-secs + --drain-secs + 2 s (connections
                  still open after the drain are dropped 2 s later) + 5 s margin.
The script fails when the Deployment's values are below these.

    python3 scripts/drain_budget.py              # needs target/release/nucleus and pyyaml
"""
import argparse
import concurrent.futures
import json
import math
import pathlib
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPLOYMENT = ROOT / "deploy" / "kubernetes" / "nucleus-deployment.yaml"
MODEL = "qwen2.5-coder-0.5b-instruct"
CLOSE_GRACE_S = 2  # nucleus drops connections still open this long after the drain
MARGIN_S = 5
MIN_PRESTOP_S = 5


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def deployment_settings(path=DEPLOYMENT):
    """The container's serve flags ({"--ctx": "4096", ...}), preStop sleep and grace period."""
    pod = yaml.safe_load(path.read_text())["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "nucleus")
    flags = {}
    for a in container["args"]:
        if a.startswith("--"):
            k, _, v = a.partition("=")
            flags[k] = v
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
    return flags, pre_stop.get("seconds", 0), pod.get("terminationGracePeriodSeconds", 30)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def prompt_of(port, n_tokens, rng):
    """Random words, tokenized by the server and cut to exactly `n_tokens` token ids."""
    words = [f"w{rng.randrange(10**6)}" for _ in range(n_tokens)]
    with post(port, "/tokenize", {"content": " ".join(words)}, 60) as r:
        tokens = json.loads(r.read())["tokens"]
    if len(tokens) < n_tokens:
        fail(f"/tokenize gave {len(tokens)} tokens for {n_tokens} words")
    return tokens[:n_tokens]


def one_request(port, prompt, max_tokens):
    """(lifetime s, time to first token s, completion tokens) of one streamed request."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1_000_000, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    while True:  # a 429 (the queue is full at this instant) is retried, as a router would
        t0 = time.monotonic()
        try:
            r = post(port, "/v1/completions", body, 3600)
            break
        except urllib.error.HTTPError as e:
            if e.code != 429:
                fail(f"HTTP {e.code}: {e.read()[:300]!r}")
            time.sleep(0.2)
    ttft, tokens = None, None
    with r:
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                fail(f"an error event: {event}")
            if ttft is None and event.get("choices"):
                ttft = time.monotonic() - t0
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    if tokens != max_tokens:
        fail(f"a request generated {tokens} tokens, not --max-tokens={max_tokens}")
    return time.monotonic() - t0, ttft, tokens


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(p / 100 * len(xs)) - 1)]


def measure(binary, flags, prompt_tokens, rounds):
    port = free_port()
    args = [binary, "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    args += [f"{k}={v}" if v else k for k, v in flags.items()]
    log = tempfile.NamedTemporaryFile(prefix="drain-budget-", suffix=".log", delete=False)
    proc = subprocess.Popen(args, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                fail(f"the server did not start (log: {log.name})")
            try:
                health = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                if health.status == 200:
                    break
            except OSError:
                time.sleep(0.3)
        clients = int(flags["--max-running"]) + int(flags["--queue"])
        max_tokens = int(flags["--max-tokens"])
        rng = random.Random(30)
        prompts = [[prompt_of(port, prompt_tokens, rng) for _ in range(rounds)]
                   for _ in range(clients)]
        print(f"== {clients} clients (--max-running {flags['--max-running']} + --queue "
              f"{flags['--queue']}), {rounds} rounds, prompts of {prompt_tokens} tokens, "
              f"{max_tokens} tokens each (--max-tokens), --threads {flags['--threads']}")

        def client(i):
            return [one_request(port, p, max_tokens) for p in prompts[i]]

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            results = [x for xs in pool.map(client, range(clients)) for x in xs]
        wall = time.monotonic() - t0
    finally:
        proc.kill()  # not SIGTERM: that would run the Deployment's drain
        proc.wait()
    pathlib.Path(log.name).unlink()  # kept when the run fails, for its reasons
    return results, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "nucleus"))
    ap.add_argument("--prompt-tokens", type=int,
                    help="prompt length (default: the Deployment's --max-prompt-tokens, the "
                    "longest it accepts)")
    ap.add_argument("--rounds", type=int, default=1, help="requests per client")
    ap.add_argument("--set", action="append", default=[], metavar="FLAG=VALUE",
                    help="try another serve flag than the Deployment's (e.g. --set "
                    "max-tokens=128); the check against the Deployment is then skipped")
    args = ap.parse_args()
    flags, pre_stop, grace = deployment_settings()
    for s in args.set:
        k, _, v = s.partition("=")
        flags["--" + k.lstrip("-")] = v
    for f in ("--max-running", "--queue", "--max-tokens", "--max-prompt-tokens", "--ctx",
              "--threads", "--unready-secs", "--drain-secs"):
        if f not in flags:
            fail(f"the Deployment's serve args have no {f}: nothing bounds the drain")
    room = min(int(flags["--ctx"]) - int(flags["--max-tokens"]), int(flags["--max-prompt-tokens"]))
    prompt_tokens = args.prompt_tokens or room
    if not 1 <= prompt_tokens <= room:
        fail(f"--prompt-tokens must be 1 to {room} (--max-prompt-tokens, within the window "
             "less --max-tokens)")
    results, wall = measure(args.binary, flags, prompt_tokens, args.rounds)
    life = [r[0] for r in results]
    ttft = [r[1] for r in results]
    tokens = sum(r[2] for r in results)
    print(f"   {len(results)} requests, {tokens} tokens generated in {wall:.1f} s")
    print(f"   time to first token: p50 {percentile(ttft, 50):.1f} s, p99 "
          f"{percentile(ttft, 99):.1f} s, p100 {max(ttft):.1f} s")
    p99, p100 = percentile(life, 99), max(life)
    print(f"worst-case request lifetime: p99 {p99:.1f} s, p100 {p100:.1f} s "
          f"(p50 {percentile(life, 50):.1f} s)")
    unready, drain = int(flags["--unready-secs"]), int(flags["--drain-secs"])
    need_drain = 60 * math.ceil(p100 * 1.25 / 60)
    need_grace = max(pre_stop, MIN_PRESTOP_S) + unready + need_drain + CLOSE_GRACE_S + MARGIN_S
    print(f"derived: --drain-secs >= {need_drain} (p100 x 1.25, up to a minute); preStop sleep >= "
          f"{MIN_PRESTOP_S}; terminationGracePeriodSeconds >= preStop {pre_stop} + unready "
          f"{unready} + drain {need_drain} + {CLOSE_GRACE_S} + {MARGIN_S} = {need_grace}")
    print(f"shipped: preStop sleep {pre_stop}, --unready-secs {unready}, --drain-secs {drain}, "
          f"terminationGracePeriodSeconds {grace}")
    if args.set:
        print("(serve flags other than the Deployment's: not checked against it)")
        return
    if drain < need_drain or pre_stop < MIN_PRESTOP_S or grace < pre_stop + unready + drain + \
            CLOSE_GRACE_S + MARGIN_S or grace < need_grace:
        fail("the Deployment's drain settings are below the measured worst case")
    print("ok: the Deployment's drain covers the measured worst case")


if __name__ == "__main__":
    main()
