#!/usr/bin/env python3
"""The chat page at `/` in headless Chromium, driven through the DevTools protocol.

Starts `nucleus serve MODEL` on a free loopback port and a headless Chromium, loads the page,
sends a message, checks that the answer streams in (its tokens appear while the page says it
is generating, colored, with their alternatives in the side panel when clicked), saves a
screenshot mid-generation, stops the generation with the Stop button (the page goes idle, the
text stops growing, the server counts a cancelled sequence), then sends a second message that
runs to its end. Any JavaScript exception on the page fails the test.

Needs: a built `nucleus` (NUCLEUS_BIN, default target/release/nucleus), the model pulled
(BROWSER_MODEL, default qwen2.5-coder-0.5b-instruct), Chromium (CHROMIUM, default the first of
chromium, chromium-browser, google-chrome on PATH) and the `websockets` package.

    python3 scripts/browser_test.py [--screenshot PATH]   (default target/chat-page.png)
"""

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import websockets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
BIN = os.environ.get("NUCLEUS_BIN", os.path.join(TARGET, "release", "nucleus"))
MODEL = os.environ.get("BROWSER_MODEL", "qwen2.5-coder-0.5b-instruct")
LONG_ANSWER = 400  # max tokens of the message that is stopped: far more than it gets to


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def find_chromium():
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("error: no Chromium found (apt-get install chromium, or set CHROMIUM)")


class Page:
    """One page target over the DevTools protocol."""

    def __init__(self, ws):
        self.ws = ws
        self.next_id = 0
        self.waiting = {}
        self.errors = []
        self.task = asyncio.create_task(self._read())

    async def _read(self):
        try:
            await self._dispatch()
        except websockets.ConnectionClosed:
            pass

    async def _dispatch(self):
        async for raw in self.ws:
            msg = json.loads(raw)
            if "id" in msg:
                fut = self.waiting.pop(msg["id"], None)
                if fut and not fut.done():
                    fut.set_result(msg)
            elif msg.get("method") == "Runtime.exceptionThrown":
                d = msg["params"]["exceptionDetails"]
                self.errors.append(d.get("exception", {}).get("description") or d.get("text"))

    async def call(self, method, **params):
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[self.next_id] = fut
        await self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        msg = await asyncio.wait_for(fut, 30)
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return msg["result"]

    async def eval(self, expr):
        r = await self.call(
            "Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr!r} threw: {r['exceptionDetails']}")
        return r["result"].get("value")

    async def wait(self, expr, what, timeout=60):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = await self.eval(expr)
            if value:
                return value
            await asyncio.sleep(0.05)
        state = await self.eval(
            "document.body.dataset.state + ' | ' + document.getElementById('log').innerText"
        )
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; page: {state}")


LAST = "[...document.querySelectorAll('.msg.assistant')].pop()"
N_TOKENS = f"{LAST}.querySelectorAll('.tok').length"
STATE = "document.body.dataset.state"


async def set_value(page, id_, value):
    await page.eval(
        f"(() => {{ const e = document.getElementById({json.dumps(id_)});"
        f" e.value = {json.dumps(str(value))}; e.dispatchEvent(new Event('change')); }})()"
    )


async def send(page, text):
    await set_value(page, "input", text)
    await page.eval("document.getElementById('send').click()")


def cancelled(base):
    _, text = http_get(base + "/metrics")
    for line in text.splitlines():
        if line.startswith("nucleus_sequences_cancelled_total"):
            return int(float(line.split()[-1]))
    raise AssertionError("no nucleus_sequences_cancelled_total in /metrics")


async def run(base, devtools_port, shot):
    _, targets = http_get(f"http://127.0.0.1:{devtools_port}/json/list")
    target = next(t for t in json.loads(targets) if t["type"] == "page")
    url = target["webSocketDebuggerUrl"]
    async with websockets.connect(url, max_size=None, ping_interval=None) as ws:
        page = Page(ws)
        await page.call("Runtime.enable")
        await page.call("Page.enable")
        await page.call(
            "Emulation.setDeviceMetricsOverride",
            width=1280, height=820, deviceScaleFactor=1, mobile=False,
        )
        await page.call("Page.navigate", url=base + "/")
        await page.wait("document.readyState === 'complete'", "the page to load")
        model = await page.wait(
            "(t => t.includes('context') && t)(document.getElementById('model').textContent)",
            "the model's name",
        )
        print(f"page loaded; header: {model}")

        # 1. A long answer: streamed, then stopped.
        await set_value(page, "max_tokens", LONG_ANSWER)
        await set_value(page, "seed", 1)
        await send(page, "Write a long story about a lighthouse keeper and a storm.")
        await page.wait(f"{STATE} === 'generating'", "the page to say it is generating")
        first = await page.wait(f"{N_TOKENS} >= 3 && {N_TOKENS}", "the first tokens", 120)
        more = await page.wait(
            f"{STATE} === 'generating' && {N_TOKENS} > {first} && {N_TOKENS}",
            "more tokens while generating",
        )
        print(f"streaming: {first} tokens, then {more}, while generating")
        await page.wait(f"{N_TOKENS} >= 14", "14 tokens")
        # A token's view: its probability and the alternatives, colored by probability.
        await page.eval(f"{LAST}.querySelectorAll('.tok')[3].click()")
        alts = await page.wait(
            "document.querySelectorAll('#detail .alt').length", "the token's alternatives"
        )
        colored = await page.eval(
            f"[...{LAST}.querySelectorAll('.tok')].every(s => s.style.background.startsWith('rgb'))"
        )
        assert colored, "every token is colored by its probability"
        shot_png = await page.call("Page.captureScreenshot", format="png")
        still = await page.eval(STATE)
        assert still == "generating", f"the screenshot was to be mid-generation ({still})"
        os.makedirs(os.path.dirname(os.path.abspath(shot)), exist_ok=True)
        with open(shot, "wb") as f:
            f.write(base64.b64decode(shot_png["data"]))
        print(f"token view: {alts} alternatives; screenshot mid-generation: {shot}")

        before = cancelled(base)
        await page.eval("document.getElementById('stop').click()")
        await page.wait(f"{STATE} === 'idle'", "the page to go idle after Stop", 10)
        assert await page.eval(f"{LAST}.dataset.stopped === 'true'"), "marked as stopped"
        n_stopped = await page.eval(N_TOKENS)
        text = await page.eval(f"{LAST}.querySelector('.body').textContent")
        await asyncio.sleep(1.0)
        assert await page.eval(f"{LAST}.querySelector('.body').textContent") == text
        assert n_stopped < LONG_ANSWER, n_stopped
        end = time.monotonic() + 10
        while cancelled(base) <= before:
            assert time.monotonic() < end, "the server never saw the generation cancelled"
            await asyncio.sleep(0.1)
        print(f"stopped after {n_stopped} tokens; the server cancelled the sequence")

        # 2. A short answer that runs to its end, in the same conversation.
        await set_value(page, "max_tokens", 8)
        await send(page, "Now say hello in French.")
        await page.wait(
            f"document.querySelectorAll('.msg').length === 4 && {STATE} === 'idle'"
            f" && {LAST}.querySelector('.note') !== null",
            "the second answer to end",
            120,
        )
        note = await page.eval(f"{LAST}.querySelector('.note').textContent")
        assert note.startswith(("length", "stop")), note
        assert await page.eval(N_TOKENS) >= 1
        print(f"second answer: {note}")

        assert not page.errors, f"JavaScript errors on the page: {page.errors}"
        page.task.cancel()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--screenshot", default=os.path.join(TARGET, "chat-page.png"))
    args = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit(f"error: {BIN} is not built (cargo build --release -p nucleus-cli)")
    chromium = find_chromium()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(TARGET, "browser-server.log"), "w")
    server = subprocess.Popen(
        [BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    profile = tempfile.mkdtemp(prefix="nucleus-chromium-")
    browser = None
    try:
        end = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                sys.exit(f"error: the server exited early; see {log.name}")
            try:
                if http_get(base + "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > end:
                sys.exit("error: the server did not come up in 120 s")
            time.sleep(0.2)
        browser = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
             "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        port_file = os.path.join(profile, "DevToolsActivePort")
        end = time.monotonic() + 60
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if browser.poll() is not None or time.monotonic() > end:
                sys.exit("error: Chromium did not start")
            time.sleep(0.1)
        devtools_port = int(open(port_file).read().split()[0])
        asyncio.run(run(base, devtools_port, args.screenshot))
        print("browser test: ok")
    finally:
        for p in (browser, server):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
