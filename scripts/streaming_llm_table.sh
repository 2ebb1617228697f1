#!/usr/bin/env bash
# StreamingLLM's comparison (Xiao et al. 2023, table 1 / figure 3) on our models: perplexity on
# ../shared/corpus with fresh windows (llama-perplexity's method), a plain window of recent
# tokens without sinks, and attention sinks plus the recent window, at windows 256 and 512.
# Prints a markdown table. Perplexity is deterministic, so the load of the machine does not
# change the figures (only the time they take).
#
#   scripts/streaming_llm_table.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${NUCLEUS_BIN:-./target/release/nucleus}
[ -x "$bin" ] || cargo build --release -q -p nucleus-cli
corpus=../shared/corpus
ppl() { "$bin" perplexity "$@" -t 2 --json | python3 -c 'import json,sys; v=json.load(sys.stdin); print("%.3f ± %.3f" % (v["ppl"], v["ppl_stderr"]))'; }
echo "| model | text | window | fresh windows | recent window, no sinks | sinks + recent window |"
echo "|---|---|---:|---:|---:|---:|"
for spec in "qwen2.5-coder-0.5b-instruct python-stdlib.txt" "gemma-3-270m gpl-3.txt"; do
  set -- $spec
  model=$1 text=$corpus/$2
  for ctx in 256 512; do
    fresh=$(ppl "$model" "$text" --ctx "$ctx")
    plain=$(ppl "$model" "$text" --ctx "$ctx" --context-policy stream --stream-sinks 0)
    sinks=$(ppl "$model" "$text" --ctx "$ctx" --context-policy stream)
    echo "| $model | $2 | $ctx | $fresh | $plain | $sinks |"
  done
done
