#!/usr/bin/env bash
# Checks `nucleus inspect MODEL --memory` against measured memory: `nucleus run` with a prompt
# that fills the whole context (the corpus, truncated to the window), for two context sizes;
# prints the plan's total and the peak RSS for each, and the KV pool's predicted growth beside
# the measured growth of RSS between them.
#
#   scripts/memory_check.sh [MODEL] [KV_TYPE]   (defaults: qwen2.5-coder-0.5b-instruct, f16)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-qwen2.5-coder-0.5b-instruct}
ty=${2:-f16}
bin=${NUCLEUS_BIN:-./target/release/nucleus}
[ -x "$bin" ] || cargo build --release -q -p nucleus-cli
text=$(cat ../shared/corpus/gpl-3.txt ../shared/corpus/python-stdlib.txt)
declare -A rss plan pool
for ctx in 1024 4096; do
  out=$("$bin" inspect "$model" --memory --ctx "$ctx" --kv-type "$ty")
  plan[$ctx]=$(echo "$out" | awk '/^  total of the above/ {print $5}')
  # Both pools: the global layers' and (gemma) the sliding-window layers'.
  pool[$ctx]=$(echo "$out" | awk '/^  KV (window )?pool/ {s += ($3 == "pool" ? $4 : $3)} END {print s}')
  rss[$ctx]=$( { /usr/bin/time -f '%M' "$bin" run "$model" "$text" --ctx "$ctx" --kv-type "$ty" \
      --context-policy truncate -n 1 --no-prefix-cache -t 2 >/dev/null 2>/tmp/memory_check.err; } 2>&1 |
      tail -1 )
  rss[$ctx]=$(tail -1 /tmp/memory_check.err)
  echo "ctx $ctx, $ty: plan total ${plan[$ctx]} MB (KV pool ${pool[$ctx]} MB); peak RSS $(awk -v k="${rss[$ctx]}" 'BEGIN {printf "%.1f", k * 1024 / 1e6}') MB"
done
awk -v p1="${pool[1024]}" -v p2="${pool[4096]}" -v r1="${rss[1024]}" -v r2="${rss[4096]}" \
  'BEGIN { printf "KV pool growth 1024 -> 4096: predicted %.1f MB, measured RSS growth %.1f MB\n", p2 - p1, (r2 - r1) * 1024 / 1e6 }'
