#!/usr/bin/env bash
# nucleus's own arithmetic (the default) against llama.cpp's (`--exact`) on ../shared/corpus,
# llama-perplexity's windows of 512: perplexity of each, the ratio, mean KL divergence from the
# exact run (over its top 32 tokens plus the rest) and top-1 agreement. Prints a markdown table.
# The issue's bounds: KL <= 0.005, top-1 agreement >= 98.5 %, perplexity within 1 %.
#
#   scripts/arithmetic_quality.sh
#   SPECS="MODEL:TEXT ..." scripts/arithmetic_quality.sh   (MODEL: a catalog name or a GGUF path;
#                                                           TEXT: a file of ../shared/corpus)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${NUCLEUS_BIN:-./target/release/nucleus}
[ -x "$bin" ] || cargo build --release -q -p nucleus-cli
corpus=../shared/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| model | text | PPL --exact | PPL default | ratio | mean KL vs --exact | top-1 agreement |"
echo "|---|---|---:|---:|---:|---:|---:|"
specs=${SPECS:-"qwen2.5-coder-0.5b-instruct:python-stdlib.txt gemma-3-270m:gpl-3.txt"}
for spec in $specs; do
  set -- "${spec%%:*}" "${spec#*:}"
  model=$1 text=$corpus/$2 name=$(basename "$1" .gguf)
  "$bin" perplexity "$model" "$text" -t 2 --json --exact --kl-divergence-base "$tmp/$name.kld" >"$tmp/exact.json"
  "$bin" perplexity "$model" "$text" -t 2 --json --kl-divergence "$tmp/$name.kld" >"$tmp/fast.json"
  python3 - "$tmp/exact.json" "$tmp/fast.json" "$name" "$2" <<'PY'
import json, sys
e, f = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
k = f["kl_divergence"]
print(f"| {sys.argv[3]} | {sys.argv[4]} | %.4f ± %.4f | %.4f ± %.4f | %.4f | %.5f ± %.5f | %.2f %% |"
      % (e["ppl"], e["ppl_stderr"], f["ppl"], f["ppl_stderr"], f["ppl"] / e["ppl"], k["mean"], k["stderr"],
         100 * k["top1_agreement"]))
PY
done
