#!/usr/bin/env bash
# KV cache storage types: bytes per token, and the quality they cost against f16 on
# ../shared/corpus (llama-perplexity's windows of 512): perplexity, mean KL divergence from the
# f16 run (over its top 32 tokens plus the rest) and top-1 agreement. Prints a markdown table.
# Perplexity and KL are deterministic: the machine's load changes only the time taken.
#
#   scripts/kv_quant_table.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${NUCLEUS_BIN:-./target/release/nucleus}
[ -x "$bin" ] || cargo build --release -q -p nucleus-cli
corpus=../shared/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| model | text | KV type | bytes/token | PPL | mean KL vs f16 | top-1 agreement |"
echo "|---|---|---|---:|---:|---:|---:|"
for spec in "qwen2.5-coder-0.5b-instruct python-stdlib.txt" "gemma-3-270m gpl-3.txt"; do
  set -- $spec
  model=$1 text=$corpus/$2
  for ty in f16 q8_0 q4_0; do
    bytes=$("$bin" bench "$model" -p 16 -g 2 -t 2 --kv-type "$ty" --json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["kv_bytes_per_token"])')
    if [ "$ty" = f16 ]; then
      "$bin" perplexity "$model" "$text" -t 2 --json --kl-divergence-base "$tmp/$model.kld" >"$tmp/out.json"
      python3 - "$tmp/out.json" "$model" "$2" "$ty" "$bytes" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | %.4f ± %.4f | 0 | 100 %% |" % (v["ppl"], v["ppl_stderr"]))
PY
    else
      "$bin" perplexity "$model" "$text" -t 2 --json --kv-type "$ty" --kl-divergence "$tmp/$model.kld" >"$tmp/out.json"
      python3 - "$tmp/out.json" "$model" "$2" "$ty" "$bytes" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
k = v["kl_divergence"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | %.4f ± %.4f | %.5f ± %.5f | %.2f %% |"
      % (v["ppl"], v["ppl_stderr"], k["mean"], k["stderr"], 100 * k["top1_agreement"]))
PY
    fi
  done
done
