#!/usr/bin/env python3
"""Runs the shell and Python examples of README.md and the book (docs/src/*.md) against a real
server, so that the documented commands keep working.

Every ```sh / ```python block runs, except one preceded by a line
`<!-- doc-test: skip (REASON) -->` (slow, interactive or long-running ones). The server is
`target/release/nucleus serve` with the default model on a free loopback port; the examples'
`127.0.0.1:8080` is rewritten to it, and `curl` fails on an HTTP error status. Shell blocks run with `bash -euo pipefail` in a scratch
directory with target/release on PATH; Python blocks with PYTHON (default target/e2e-venv's
python, which scripts/e2e.sh sets up with the `openai` package). Each block has TIMEOUT seconds.

    python3 scripts/doc_examples.py [--list] [FILE.md ...]

Exits 1 naming each block that failed (file, line, its output).
"""
import argparse
import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = re.compile(r"<!--\s*doc-test:\s*skip\b")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def blocks(path):
    """(line, language, code) of each runnable block; skipped ones as language 'skip'."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i, prev = [], 0, ""
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                prev = lines[i]
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i + 1
        i += 1
        body = []
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        if lang in ("sh", "bash", "python"):
            out.append((start, "skip" if SKIP.search(prev) else lang, "\n".join(body) + "\n"))
        prev = ""
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port, log):
    binary = os.path.join(ROOT, "target", "release", "nucleus")
    proc = subprocess.Popen(
        [binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--threads", "2"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"doc_examples: the server exited ({proc.returncode}); see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("doc_examples: the server did not come up in 300 s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--list", action="store_true", help="list the blocks, run nothing")
    ap.add_argument("--timeout", type=int, default=int(os.environ.get("TIMEOUT", 240)))
    args = ap.parse_args()
    files = args.files or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "src", "*.md")))
    todo = [(f, *b) for f in files for b in blocks(f)]
    if args.list:
        for f, line, lang, code in todo:
            print(f"{os.path.relpath(f, ROOT)}:{line} {lang}: {code.splitlines()[0] if code.strip() else ''}")
        return
    python = os.environ.get("PYTHON") or os.path.join(ROOT, "target", "e2e-venv", "bin", "python")
    if not os.path.exists(python):
        sys.exit(f"doc_examples: no {python}: run scripts/e2e.sh first or set PYTHON")
    port = free_port()
    work = tempfile.mkdtemp(prefix="nucleus-doc-")
    env = dict(os.environ, PATH=os.path.join(ROOT, "target", "release") + os.pathsep + os.environ["PATH"])
    # The benchmark tree is this checkout's own, never a clean clone's: say so before a slow run.
    local = [f"{os.path.relpath(f, ROOT)}:{line}" for f, line, lang, code in todo
             if lang != "skip" and ".bench/" in code]
    if local:
        sys.exit("doc_examples: these blocks use .bench/, which a clean clone lacks; mark them "
                 "<!-- doc-test: skip (REASON) -->: " + ", ".join(local))
    failed, ran, skipped = [], 0, 0
    with open(os.path.join(work, "server.log"), "w") as log:
        server = start_server(port, log)
        try:
            for f, line, lang, code in todo:
                where = f"{os.path.relpath(f, ROOT)}:{line}"
                if lang == "skip":
                    skipped += 1
                    continue
                code = code.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
                # An HTTP error status fails the block (its body is still printed).
                code = re.sub(r"\bcurl -s", "curl --fail-with-body -s", code)
                cmd = ["bash", "-euo", "pipefail", "-c", code] if lang != "python" else [python, "-c", code]
                t = time.time()
                try:
                    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                                       timeout=args.timeout)
                    ok, out = r.returncode == 0, r.stdout + r.stderr
                except subprocess.TimeoutExpired as e:
                    ok, out = False, f"timed out after {args.timeout} s\n{e.stdout or ''}"
                ran += 1
                print(f"{'ok  ' if ok else 'FAIL'} {where} ({lang}, {time.time() - t:.1f} s)")
                if not ok:
                    failed.append((where, out))
        finally:
            server.terminate()
            server.wait(timeout=30)
    for where, out in failed:
        print(f"\n== {where} failed:\n{out[-3000:]}")
    print(f"\ndoc_examples: {ran} ran, {skipped} skipped, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
