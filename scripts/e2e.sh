#!/usr/bin/env bash
# End-to-end test of `nucleus serve` with the official `openai` and `anthropic` Python clients.
#
# Creates a venv (python3 -m venv), installs openai + pytest from PyPI, starts the real server on
# a free loopback port, waits for /health, runs pytest on tests/e2e, and stops the server
# (SIGTERM, graceful). Exits non-zero on any failure, including "no tests collected" (pytest 5).
#
# Environment: NUCLEUS_BIN (default $CARGO_TARGET_DIR/release/nucleus, built if absent),
# E2E_MODEL (default qwen2.5-coder-0.5b-instruct), E2E_VENV (default <target>/e2e-venv),
# E2E_THREADS (forward threads, default 0 = all cores).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=${CARGO_TARGET_DIR:-target}
BIN=${NUCLEUS_BIN:-$TARGET/release/nucleus}
MODEL=${E2E_MODEL:-qwen2.5-coder-0.5b-instruct}
VENV=${E2E_VENV:-$TARGET/e2e-venv}
THREADS=${E2E_THREADS:-0}
mkdir -p "$TARGET"
LOG=$TARGET/e2e-server.log

if [[ ! -x $BIN ]]; then
    echo "== building $BIN"
    cargo build --release -p nucleus-cli
fi

echo "== python venv at $VENV"
if [[ ! -x $VENV/bin/python ]]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check openai anthropic pydantic pytest

PORT=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
BASE=http://127.0.0.1:$PORT

echo "== starting $BIN serve $MODEL on $BASE (log: $LOG)"
"$BIN" serve "$MODEL" --host 127.0.0.1 --port "$PORT" --threads "$THREADS" >"$LOG" 2>&1 &
SERVER=$!
stop_server() {
    if kill -0 "$SERVER" 2>/dev/null; then
        kill -TERM "$SERVER" 2>/dev/null || true
        for _ in $(seq 1 150); do
            kill -0 "$SERVER" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVER" 2>/dev/null || true
    fi
    wait "$SERVER" 2>/dev/null || true
}
trap stop_server EXIT

up=0
for _ in $(seq 1 600); do
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "error: the server exited early:" >&2
        cat "$LOG" >&2
        exit 1
    fi
    if "$VENV/bin/python" -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('$BASE/health', timeout=2).status == 200 else 1)" 2>/dev/null; then
        up=1
        break
    fi
    sleep 0.2
done
if [[ $up != 1 ]]; then
    echo "error: the server did not become healthy in 120 s:" >&2
    cat "$LOG" >&2
    exit 1
fi
echo "== server up"

set +e
NUCLEUS_BASE_URL=$BASE NUCLEUS_MODEL_ID=$MODEL "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/e2e
rc=$?
set -e
if [[ $rc == 5 ]]; then
    echo "error: pytest collected no tests" >&2
    rc=1
fi

echo "== stopping the server (SIGTERM)"
kill -TERM "$SERVER"
server_rc=0
wait "$SERVER" || server_rc=$?
trap - EXIT
tail -n 3 "$LOG"
if [[ $server_rc != 0 ]]; then
    echo "error: the server exited with status $server_rc after SIGTERM" >&2
    [[ $rc != 0 ]] || rc=1
fi
if [[ $rc != 0 ]]; then
    echo "e2e: FAILED (pytest status $rc); server log: $LOG" >&2
else
    echo "e2e: ok"
fi
exit "$rc"
