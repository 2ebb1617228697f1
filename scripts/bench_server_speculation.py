#!/usr/bin/env python3
"""`nucleus serve` with and without `--speculate ngram` (or, with `--method draft`, `--speculate
draft --draft-model D`), at 1 and 8 concurrent streams: the
code edits of bench_speculation.py (the coder model repeats a function from the corpus) and
open-ended stories, greedy, through /v1/completions. Prints aggregate generation tokens/s
(completion tokens of the round / its wall time) for each server and the speed-up; the answers
of the two nucleus servers must be the same (the script fails otherwise).

With --llama-server PATH (or $LLAMA_SERVER), llama.cpp's llama-server runs the same rounds in
the same run, plain and with `--spec-type ngram-simple` (its prompt lookup, its default sizes;
with `--method draft`, `-md D`), `-np 8`; its answers are reported, not compared (its batched
arithmetic differs from its one-token arithmetic). `--skip-llama` leaves it out even when
$LLAMA_SERVER is set.

    scripts/bench_server_speculation.py [--model qwen2.5-coder-0.5b-instruct] [--max-tokens 256]
        [--method ngram|draft] [--target T --draft-model D] [--skip-llama]
        [--llama-server .bench/llama.cpp/.../build/bin/llama-server]
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_server import free_port, wait_healthy  # noqa: E402
from bench_speculation import CORPUS, EDITS, ROOT, chat  # noqa: E402

STORIES = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a short story about a robot learning to paint.",
    "Write a short story about a lost dog finding its way home in winter.",
    "Write a short story about two rival bakers in a small town.",
    "Write a short story about a child who discovers a door in the garden wall.",
    "Write a short story about the last day of a travelling circus.",
    "Write a short story about an astronaut who hears music on the radio.",
    "Write a short story about a clockmaker who can stop time for one minute.",
]


def complete(port, prompt, max_tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1200) as r:
        v = json.load(r)
    return v["choices"][0]["text"], v["usage"]["completion_tokens"]


def round_(port, prompts, conc, max_tokens):
    """Runs `prompts` with `conc` in flight at once: (texts, completion tokens, seconds)."""
    out = [None] * len(prompts)
    it = iter(range(len(prompts)))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            out[i] = complete(port, prompts[i], max_tokens)

    t0 = time.monotonic()
    ts = [threading.Thread(target=worker) for _ in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    secs = time.monotonic() - t0
    return [o[0] for o in out], sum(o[1] for o in out), secs


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines()
            if l.startswith("nucleus_spec_decode")}


def gguf_path(model):
    """A catalog name's file (for llama-server), or the path as given."""
    return model if os.path.exists(model) else os.path.join(
        os.path.expanduser(os.environ.get("NUCLEUS_MODELS", "~/.cache/nucleus/models")),
        f"{model}-q4_k_m.gguf")


def serve(args, extra, llama=False):
    port = free_port()
    if llama:
        gguf = gguf_path(args.model)
        cmd = [args.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
               "-t", str(args.threads), "-np", "8", "-cb", "-c", str(8 * 2048)] + extra
    else:
        cmd = [args.bin, "serve", args.model, "--port", str(port), "-t", str(args.threads),
               "--max-running", "8", "--no-prefix-cache"] + extra
    log = open(os.path.join(args.log_dir, "bench-spec-server.log"), "a")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    wait_healthy(port, proc)
    return proc, port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("NUCLEUS_BIN", os.path.join(ROOT, "target/release/nucleus")))
    ap.add_argument("--model", "--target", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--method", choices=["ngram", "draft"], default="ngram")
    ap.add_argument("--draft-model", help="the draft for --method draft (catalog name or GGUF)")
    ap.add_argument("--skip-llama", action="store_true", help="no llama-server, even with $LLAMA_SERVER")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    args = ap.parse_args()
    if args.method == "draft" and not args.draft_model:
        ap.error("--method draft needs --draft-model")
    if args.skip_llama:
        args.llama_server = None
    method = args.method
    lines = open(CORPUS, encoding="utf-8").read().split("\n")
    sets = {
        "edits": [chat(f"{instr}\n\n```python\n{chr(10).join(lines[a - 1:b])}\n```")
                  for a, b, instr in EDITS],
        "stories": [chat(s) for s in STORIES],
    }
    results = {}
    spec_args = ["--speculate", method, "--draft-max", str(args.draft_max)]
    llama_spec = ["--spec-type", "ngram-simple"]
    if method == "draft":
        spec_args += ["--draft-model", args.draft_model]
        llama_spec = ["-md", gguf_path(args.draft_model)]
    servers = [("plain", ["--speculate", "off"], False), (method, spec_args, False)]
    if args.llama_server:
        servers += [("llama", [], True), ("llama-spec", llama_spec, True)]
    for name, extra, llama in servers:
        proc, port = serve(args, extra, llama)
        try:
            complete(port, chat("Say hi."), 4)  # warm up
            for kind, prompts in sets.items():
                for conc in (1, 8):
                    before = {} if llama else metrics(port)
                    texts, n, secs = round_(port, prompts, conc, args.max_tokens)
                    after = {} if llama else metrics(port)
                    spec = {k.replace("nucleus_spec_decode_num_", "").replace("_total", ""): int(after[k] - before.get(k, 0))
                            for k in after}
                    results[(name, kind, conc)] = (texts, n, secs, spec)
                    print(f"  {name:>11} {kind:>7} c={conc}: {n} tokens in {secs:.1f} s, {n / secs:.1f} tok/s {spec}",
                          flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    llama = args.llama_server is not None
    llama_name = "ngram-simple" if method == "ngram" else "-md"
    print(f"\n| prompts | streams | tokens | plain tok/s | {method} tok/s | speed-up | drafts | proposed | accepted |"
          + (f" llama-server tok/s | {llama_name} tok/s | llama speed-up | same answers (llama) |" if llama else ""))
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|---|" if llama else ""))
    for kind in sets:
        for conc in (1, 8):
            a = results[("plain", kind, conc)]
            b = results[(method, kind, conc)]
            if a[0] != b[0]:
                sys.exit(f"the answers differ: {kind}, {conc} streams")
            pa, pb = a[1] / a[2], b[1] / b[2]
            row = (f"| {kind} | {conc} | {b[1]} | {pa:.1f} | {pb:.1f} | {pb / pa:.2f}x | "
                   f"{b[3].get('drafts', 0)} | {b[3].get('draft_tokens', 0)} | {b[3].get('accepted_tokens', 0)} |")
            if llama:
                c, d = results[("llama", kind, conc)], results[("llama-spec", kind, conc)]
                pc, pd = c[1] / c[2], d[1] / d[2]
                same = sum(x == y for x, y in zip(c[0], d[0]))
                row += f" {pc:.1f} | {pd:.1f} | {pd / pc:.2f}x | {same} of {len(c[0])} |"
            print(row)


if __name__ == "__main__":
    main()
