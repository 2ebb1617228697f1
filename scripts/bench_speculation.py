#!/usr/bin/env python3
"""Speculative decoding, plain against `--speculate ngram` (and `--speculate draft` with
--draft-model/--target), greedy, on the coder model: code edits that repeat a function from the
corpus (CPython's textwrap.py and shlex.py in ../shared/corpus), and open-ended stories.

For each prompt: generation tokens/s without and with speculation (best of --reps runs each,
alternating), the speed-up, the tokens proposed and accepted; the outputs must be the same
tokens (the script fails otherwise).

    scripts/bench_speculation.py [--reps 2] [--max-tokens 384] [--method ngram]
    scripts/bench_speculation.py --method draft --target TARGET.gguf --draft-model DRAFT.gguf
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "..", "shared", "corpus", "python-stdlib.txt")

# (first line of the function in the corpus, its last line (1-based, inclusive), instruction)
EDITS = [
    (143, 154, "Add type hints to this method and return the whole method."),
    (157, 177, "Rename the parameter `text` to `source` everywhere and return the whole method."),
    (179, 195, "Add a docstring line that says what `patsearch` is for, and return the whole method."),
    (197, 236, "Rename `cur_line` to `current_line` everywhere and return the whole method."),
    (419, 468, "Change every single-quoted string to a double-quoted one and return the whole function."),
    (569, 582, "Add type hints to this method and return the whole method."),
    (779, 785, "Rewrite the return statement with an f-string and return the whole method."),
    (796, 808, "Add a comment above each statement and return the whole function."),
]

STORIES = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a short story about a robot learning to paint.",
]


def chat(user):
    return (
        "<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )


def run(binary, model, prompt, max_tokens, threads, extra):
    cmd = [binary, "run", model, prompt, "--temperature", "0", "-n", str(max_tokens),
           "-t", str(threads), "--json", "--no-prefix-cache"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("NUCLEUS_BIN", os.path.join(ROOT, "target/release/nucleus")))
    ap.add_argument("--target", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--method", default="ngram", choices=["ngram", "draft"])
    ap.add_argument("--draft-model")
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["edits", "stories"])
    args = ap.parse_args()
    lines = open(CORPUS, encoding="utf-8").read().split("\n")
    prompts = []
    if args.only != "stories":
        for first, last, instr in EDITS:
            code = "\n".join(lines[first - 1:last])
            prompts.append(("edit", f"{instr} (line {first})", chat(f"{instr}\n\n```python\n{code}\n```")))
    if args.only != "edits":
        for s in STORIES:
            prompts.append(("story", s[:40], chat(s)))
    spec = ["--speculate", args.method, "--draft-max", str(args.draft_max)]
    if args.method == "draft":
        spec += ["--draft-model", args.draft_model]
    print(f"| kind | prompt | tokens | plain tok/s | {args.method} tok/s | speed-up | proposed | accepted |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    totals = {"edit": [0.0, 0.0, 0], "story": [0.0, 0.0, 0]}
    for kind, name, prompt in prompts:
        best_plain = best_spec = 0.0
        for _ in range(args.reps):
            a = run(args.bin, args.target, prompt, args.max_tokens, args.threads, ["--speculate", "off"])
            b = run(args.bin, args.target, prompt, args.max_tokens, args.threads, spec)
            if a["tokens"] != b["tokens"]:
                sys.exit(f"the outputs differ on {name!r}")
            best_plain = max(best_plain, a["timings"]["generate_tokens_per_s"])
            best_spec = max(best_spec, b["timings"]["generate_tokens_per_s"])
        n = len(b["tokens"])
        s = b["speculation"]
        print(f"| {kind} | {name} | {n} | {best_plain:.1f} | {best_spec:.1f} | "
              f"{best_spec / best_plain:.2f}x | {s['proposed']} | {s['accepted']} |", flush=True)
        t = totals[kind]
        t[0] += n / best_plain
        t[1] += n / best_spec
        t[2] += n
    for kind, (plain_s, spec_s, n) in totals.items():
        if n:
            print(f"\n{kind}s: {n} tokens, plain {n / plain_s:.1f} tok/s, {args.method} "
                  f"{n / spec_s:.1f} tok/s, speed-up {plain_s / spec_s:.2f}x (total time)")


if __name__ == "__main__":
    main()
