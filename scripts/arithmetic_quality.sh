#!/usr/bin/env bash
# nucleus's own arithmetic (the default) against llama.cpp's (`--exact`) on ../shared/corpus,
# llama-perplexity's windows of 512, and beside it the bound: how far llama.cpp's other build
# (LLAMA_PERPLEXITY, its AVX2 build by default) is from the same `--exact` run. Both distances
# are measured against one base, the `--exact` run's distributions in llama.cpp's KL-base format
# (every token of the vocabulary), with llama.cpp's formula: nucleus's default by `nucleus
# perplexity --kl-divergence-llama`, llama.cpp's build by `llama-perplexity --kl-divergence`.
# Prints a markdown table: perplexity of each arithmetic and the ratio, mean KL divergence from
# the exact run and top-1 agreement ("same top p") for the default and for llama.cpp's build.
# The bound: the default no farther from --exact than llama.cpp's build, in KL and in top-1.
#
#   scripts/arithmetic_quality.sh
#   SPECS="MODEL:TEXT ..." scripts/arithmetic_quality.sh   (MODEL: a catalog name or a GGUF path;
#                                                           TEXT: a file of ../shared/corpus)
#   LLAMA_PERPLEXITY=none scripts/arithmetic_quality.sh    (the default's columns only)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${NUCLEUS_BIN:-./target/release/nucleus}
[ -x "$bin" ] || cargo build --release -q -p nucleus-cli
lp=${LLAMA_PERPLEXITY:-.bench/llama.cpp-avx2/build/bin/llama-perplexity}
if [ "$lp" != none ] && [ ! -x "$lp" ]; then
  echo "no llama-perplexity at $lp (LLAMA_PERPLEXITY=none to skip llama.cpp's column)" >&2
  exit 1
fi
models=${NUCLEUS_MODELS:-$HOME/.cache/nucleus/models}
corpus=../shared/corpus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "llama.cpp's build: $lp"
echo
echo "| model | text | PPL --exact | PPL default | ratio | default: mean KL | top-1 | llama.cpp's build: mean KL | top-1 |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
specs=${SPECS:-"qwen2.5-coder-0.5b-instruct:python-stdlib.txt gemma-3-270m:gpl-3.txt"}
for spec in $specs; do
  set -- "${spec%%:*}" "${spec#*:}"
  model=$1 text=$corpus/$2 gguf=$models/$1-q4_k_m.gguf name=$1
  case $model in *.gguf) gguf=$model name=$(basename "$model" .gguf) ;; esac
  "$bin" perplexity "$model" "$text" -t 2 --json --exact --kl-divergence-base-llama "$tmp/base.kld" >"$tmp/exact.json"
  "$bin" perplexity "$model" "$text" -t 2 --json --kl-divergence-llama "$tmp/base.kld" >"$tmp/fast.json"
  llama="– | –"
  if [ "$lp" != none ]; then
    "$lp" -m "$gguf" -t 2 -c 512 --kl-divergence-base "$tmp/base.kld" --kl-divergence >"$tmp/llama.txt" 2>&1
    kl=$(grep -E "^Mean +KLD:" "$tmp/llama.txt" | awk '{printf "%.6f ± %.6f", $3, $5}')
    top=$(grep -E "^Same top p:" "$tmp/llama.txt" | awk '{print $4, $5, $6, $7}')
    llama="$kl | $top"
  fi
  python3 - "$tmp/exact.json" "$tmp/fast.json" "$name" "$2" "$llama" <<'PY'
import json, sys
e, f = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
k = f["kl_divergence"]
assert k["method"] == "llama.cpp, whole vocabulary", k
cells = "| %.4f ± %.4f | %.4f ± %.4f | %.4f | %.6f ± %.6f | %.3f %% |" % (
    e["ppl"], e["ppl_stderr"], f["ppl"], f["ppl_stderr"], f["ppl"] / e["ppl"], k["mean"], k["stderr"],
    100 * k["top1_agreement"])
print(f"| {sys.argv[3]} | {sys.argv[4]} {cells} {sys.argv[5]} |")
PY
done
