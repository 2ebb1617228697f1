#!/usr/bin/env python3
"""Prefix caching: two chat requests that share a ~2,000-token system prompt, on a fresh
server, one after the other (loopback only). With the prefix cache the second should cost
only its own tokens. Prints each request's wall time, its prompt and cached token counts, and
the ratio second/first, for:
  nucleus serve                      (prefix cache on, the default)
  nucleus serve --no-prefix-cache
  llama.cpp's llama-server           (one slot; `cache_prompt` on, its default)

  scripts/bench_prefix_cache.py --model ~/.cache/nucleus/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf

The system prompt is the start of ../shared/corpus/gpl-3.txt (--system-chars picks how much).
Same GGUF, same threads (2). llama-server: --llama-server PATH or $LLAMA_SERVER, else built by
scripts/build_llama_cpp.sh (once); --skip-llama leaves it out.
"""

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_server import build_llama_server, free_port, wait_healthy  # noqa: E402

QUESTIONS = ["Summarise the preamble in one sentence.", "What does section 2 grant?"]


def ask(port, system, question, max_tokens, completions):
    if completions:  # a model without a chat template: the same shared start as plain text
        path = "/v1/completions"
        body = {"prompt": f"{system}\n\nQuestion: {question}\nAnswer:"}
    else:
        path = "/v1/chat/completions"
        body = {"messages": [{"role": "system", "content": system},
                             {"role": "user", "content": question}]}
    body = json.dumps({"model": "m", "max_tokens": max_tokens, "temperature": 0, **body})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.monotonic()
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    wall = time.monotonic() - t0
    if resp.status != 200:
        sys.exit(f"HTTP {resp.status}: {data}")
    usage = data.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None and "timings" in data:  # llama-server reports it in its timings
        cached = data["timings"].get("cache_n")
    return wall, usage.get("prompt_tokens"), cached


def pair(name, cmd, port, system, max_tokens, log_dir, completions):
    log = open(os.path.join(log_dir, f"prefix-{name}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(port, proc)
        rows = [ask(port, system, q, max_tokens, completions) for q in QUESTIONS]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    (w1, p1, c1), (w2, p2, c2) = rows
    print(f"{name:<32} first {w1:7.2f} s ({p1} prompt, {c1} cached)   "
          f"second {w2:7.2f} s ({p2} prompt, {c2} cached)   second/first {w2 / w1:.3f}",
          flush=True)
    return {"first_s": w1, "second_s": w2, "prompt_tokens": [p1, p2], "cached_tokens": [c1, c2],
            "ratio": w2 / w1}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--nucleus", default=os.path.join(here, "..", "target", "release", "nucleus"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--system-chars", type=int, default=9300)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--completions", action="store_true",
                    help="use /v1/completions (for a model without a chat template)")
    ap.add_argument("--json")
    args = ap.parse_args()
    corpus = os.path.join(here, "..", "..", "shared", "corpus", "gpl-3.txt")
    with open(corpus) as f:
        system = f.read()[: args.system_chars]
    results = {}
    base = [args.nucleus, "serve", args.model, "--threads", str(args.threads), "--ctx", "4096",
            "--max-running", "1"]
    port = free_port()
    results["nucleus"] = pair("nucleus", base + ["--port", str(port)], port, system,
                              args.max_tokens, args.log_dir, args.completions)
    port = free_port()
    results["nucleus_no_cache"] = pair("nucleus --no-prefix-cache",
                                       base + ["--port", str(port), "--no-prefix-cache"], port,
                                       system, args.max_tokens, args.log_dir, args.completions)
    if not args.skip_llama:
        ls = args.llama_server or shutil.which("llama-server") or build_llama_server()
        port = free_port()
        results["llama.cpp"] = pair("llama-server (cache_prompt)",
                                    [ls, "-m", args.model, "--host", "127.0.0.1", "--port",
                                     str(port), "-t", str(args.threads), "-np", "1", "-c", "4096"],
                                    port, system, args.max_tokens, args.log_dir, args.completions)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
