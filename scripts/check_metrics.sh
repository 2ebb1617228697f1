#!/usr/bin/env bash
# /metrics as Prometheus's own linter reads it: starts `nucleus serve` on the default model
# (loopback, a free port), sends one completion and one chat request so that every family has
# samples, and runs `promtool check metrics` (Debian's `prometheus` package, installed when
# absent) on the page. Exits non-zero on any finding.
#
# Environment: NUCLEUS_BIN (default target/release/nucleus), MODEL (default
# qwen2.5-coder-0.5b-instruct).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${NUCLEUS_BIN:-${CARGO_TARGET_DIR:-target}/release/nucleus}
MODEL=${MODEL:-qwen2.5-coder-0.5b-instruct}

if ! command -v promtool >/dev/null; then
    SUDO=""
    if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus
fi

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
LOG=$(mktemp)
"$BIN" serve "$MODEL" --host 127.0.0.1 --port "$PORT" --threads 2 >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 $SERVER 2>/dev/null || { cat "$LOG"; exit 1; }
    sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
    -d '{"prompt": "def add(a, b):", "max_tokens": 4}' >/dev/null
curl -sf "http://127.0.0.1:$PORT/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}' >/dev/null
PAGE=$(curl -sf "http://127.0.0.1:$PORT/metrics")
echo "$PAGE" | promtool check metrics
echo "promtool check metrics: clean ($(echo "$PAGE" | grep -c '^# TYPE') metric families)"
