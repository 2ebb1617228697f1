#!/usr/bin/env bash
# Memory of a generation that runs far past its window with --context-policy stream: RSS
# sampled every second while `nucleus run --ctx 256 --context-policy stream -n N --ignore-eos`
# generates, then the spread of RSS after the window filled (it should stay flat).
#
#   scripts/stream_rss.sh [MODEL] [N]     (defaults: qwen2.5-coder-0.5b-instruct, 2000)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-qwen2.5-coder-0.5b-instruct}
n=${2:-2000}
bin=${NUCLEUS_BIN:-./target/release/nucleus}
[ -x "$bin" ] || cargo build --release -q -p nucleus-cli
out=$(mktemp)
"$bin" run "$model" "Write a very long story about a lighthouse keeper." --ctx 256 \
  --context-policy stream -n "$n" --ignore-eos --temperature 0 -t 2 --json >"$out" &
pid=$!
samples=()
t=0
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  if [ -n "$rss" ]; then
    samples+=("$rss")
    awk -v t="$t" -v r="$rss" 'BEGIN { printf "t=%3ds rss=%6.1f MiB\n", t, r / 1024 }'
  fi
  sleep 1
  t=$((t + 1))
done
wait "$pid"
python3 - "$out" "${samples[@]}" <<'PY'
import json, sys
gen = json.load(open(sys.argv[1]))
rss = [int(x) / 1024 for x in sys.argv[2:]]
# The window (256 tokens) fills within the first seconds; judge the rest.
after = rss[len(rss) // 4:] or rss
print(f"generated {len(gen['tokens'])} tokens, finish {gen['finish_reason']}, "
      f"dropped {gen.get('dropped_tokens')} from the context")
print(f"RSS after the first quarter of the run: min {min(after):.1f} MiB, max {max(after):.1f} MiB, "
      f"spread {max(after) - min(after):.1f} MiB over {len(after)} samples")
PY
