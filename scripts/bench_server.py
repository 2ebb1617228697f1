#!/usr/bin/env python3
"""Aggregate decode throughput of nucleus serve vs llama.cpp's llama-server (continuous
batching) at 1, 4 and 16 concurrent streams, same GGUF, same threads, loopback only.

Each round starts C streaming /v1/completions requests at once (same short prompt, greedy,
`ignore_eos`, exactly G tokens each) and reports:
  total tok/s  = C*G / wall time of the round (includes the prefill of the prompts)
  decode tok/s = C*(G-1) / (last token time - first "first token" time)
  ttft         = mean time to first token

  scripts/bench_server.py --model ~/.cache/nucleus/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
      --threads 2 --llama-server /path/to/llama-server

llama-server: --llama-server PATH or $LLAMA_SERVER; if neither exists, it is built from the
`llama-cpp-python==0.3.36` sdist's vendored llama.cpp by scripts/build_llama_cpp.sh (once).
--skip-llama benchmarks nucleus alone.
"""

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle. Once upon a time"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_healthy(port, proc, timeout=300):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"server exited early ({proc.returncode}); see its log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    sys.exit("server not healthy in time")


def stream_one(port, gen, out, i, barrier):
    body = json.dumps({"model": "m", "prompt": PROMPT, "max_tokens": gen, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    barrier.wait()
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    first = None
    finish = None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            break
        ev = json.loads(line[6:])
        for ch in ev.get("choices", []):
            if first is None and ch.get("text"):
                first = time.monotonic()
            finish = ch.get("finish_reason") or finish
    end = time.monotonic()
    conn.close()
    out[i] = (t0, first or end, end, finish)


def run_round(port, conc, gen):
    out = [None] * conc
    barrier = threading.Barrier(conc)
    ts = [threading.Thread(target=stream_one, args=(port, gen, out, i, barrier)) for i in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    start = min(o[0] for o in out)
    first = min(o[1] for o in out)
    end = max(o[2] for o in out)
    bad = [o[3] for o in out if o[3] != "length"]
    return {
        "total_tps": conc * gen / (end - start),
        "decode_tps": conc * (gen - 1) / max(end - first, 1e-9),
        "ttft": sum(o[1] - o[0] for o in out) / conc,
        "not_length": len(bad),
    }


def bench(name, cmd, port, concs, gen, log_dir):
    log = open(os.path.join(log_dir, f"bench-{name}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(port, proc)
        run_round(port, 1, 8)  # warm up
        res = {}
        for c in concs:
            r = run_round(port, c, gen)
            res[c] = r
            print(f"  {name:>8} c={c:>2}: total {r['total_tps']:7.1f} tok/s, decode {r['decode_tps']:7.1f} tok/s,"
                  f" mean ttft {r['ttft']:6.2f} s" + (f"  ({r['not_length']} not 'length'!)" if r["not_length"] else ""),
                  flush=True)
        return res
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def build_llama_server():
    """llama-server from scripts/build_llama_cpp.sh (built once, from the same vendored source)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_llama_cpp.sh")
    src = subprocess.check_output([script], text=True).strip()
    return os.path.join(src, "build", "bin", "llama-server")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF file (both servers load it)")
    ap.add_argument("--nucleus", default=os.environ.get("NUCLEUS_BIN", "target/release/nucleus"))
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--gen", type=int, default=64, help="tokens per stream")
    ap.add_argument("--conc", default="1,4,16")
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--json")
    ap.add_argument("--nucleus-args", default="",
                    help="extra flags for nucleus serve, e.g. '--speculate off' or '--exact'")
    args = ap.parse_args()
    concs = [int(c) for c in args.conc.split(",")]
    ctx = 512
    results = {}

    port = free_port()
    print(f"nucleus ({args.nucleus} serve {args.nucleus_args}), {args.threads} threads, {args.gen} tokens per stream:", flush=True)
    results["nucleus"] = bench("nucleus", [args.nucleus, "serve", args.model, "--port", str(port),
                                           "--threads", str(args.threads), "--max-running", "16",
                                           "--ctx", str(ctx), "--kv-tokens", str(16 * ctx)]
                               + args.nucleus_args.split(),
                               port, concs, args.gen, args.log_dir)
    if not args.skip_llama:
        ls = args.llama_server
        if not ls or not os.path.exists(ls):
            ls = shutil.which("llama-server") or build_llama_server()
        port = free_port()
        print(f"llama.cpp ({ls}), -np 16 -cb:", flush=True)
        results["llama.cpp"] = bench("llama", [ls, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
                                               "-t", str(args.threads), "-np", "16", "-cb", "-c", str(16 * ctx)],
                                     port, concs, args.gen, args.log_dir)
    print()
    print("| streams | " + " | ".join(f"{k} total tok/s | {k} decode tok/s" for k in results) + " |")
    print("|---|" + "---|---|" * len(results))
    for c in concs:
        row = " | ".join(f"{results[k][c]['total_tps']:.1f} | {results[k][c]['decode_tps']:.1f}" for k in results)
        print(f"| {c} | {row} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
