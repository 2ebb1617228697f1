#!/usr/bin/env bash
# The catalog qwen (dequantized to F16) quantized by `nucleus quantize` to each type: file size,
# `nucleus perplexity` on ../shared/corpus/python-stdlib.txt (windows of 512), and prefill/decode
# speed beside llama.cpp's on the same files (scripts/bench_vs_llama_cpp.sh). Prints two tables.
# Not run in CI.
#
#   scripts/quantize_table.sh [F16.gguf]      TYPES="Q4_K_M Q8_0 ..." to choose; REPS, NICE as
#                                             bench_vs_llama_cpp.sh takes them
set -euo pipefail
cd "$(dirname "$0")/.."
f16=${1:-/tmp/spec/qwen-f16.gguf}
[ -f "$f16" ] || { echo "no $f16: make it with cargo run --release -p nucleus --example requantize" >&2; exit 1; }
bin=${NUCLEUS:-./target/release/nucleus}
[ -x "$bin" ] || cargo build --release -q -p nucleus-cli
types=${TYPES:-Q2_K Q3_K_M Q4_0 IQ4_NL IQ4_XS Q4_K_M Q5_K_M Q6_K Q8_0}
out=${OUT_DIR:-/tmp/quantize-table}
mkdir -p "$out"
echo "| type | file bytes | PPL (python-stdlib.txt) |"
echo "|---|---:|---:|"
models=()
for t in $types; do
  f="$out/qwen2.5-coder-0.5b-$t.gguf"
  [ -f "$f" ] || "$bin" quantize "$f16" "$f" "$t" -t 2 >/dev/null
  ppl=$("$bin" perplexity "$f" ../shared/corpus/python-stdlib.txt -t 2 --json |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.4f ± %.4f" % (j["ppl"], j["ppl_stderr"]))')
  echo "| $t | $(stat -c %s "$f") | $ppl |"
  models+=("$f")
done
NUCLEUS=$bin scripts/bench_vs_llama_cpp.sh "${models[@]}"
