#!/usr/bin/env bash
# How far llama.cpp's own build on this machine is from nucleus's two arithmetics, measured by
# llama.cpp's tool: nucleus writes its distributions on ../shared/corpus as llama.cpp's KL base
# (`nucleus perplexity --kl-divergence-base-llama`), then `llama-perplexity --kl-divergence`
# runs llama.cpp's build on the same windows and reports mean KL divergence and top-1 agreement
# ("same top p"). nucleus --exact reproduces llama.cpp's AVX-512 build, so on a CPU without
# AVX-512 the first row is llama.cpp's AVX2 build against its AVX-512 build.
#
#   scripts/llama_cpp_drift.sh            (LLAMA_PERPLEXITY=... to use another build)
#   SPECS="MODEL:TEXT ..." scripts/llama_cpp_drift.sh   (MODEL: a catalog name or a GGUF path)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${NUCLEUS_BIN:-./target/release/nucleus}
[ -x "$bin" ] || cargo build --release -q -p nucleus-cli
lp=${LLAMA_PERPLEXITY:-$(scripts/build_llama_cpp.sh)/build/bin/llama-perplexity}
[ -x "$lp" ] || { echo "no llama-perplexity at $lp (build it: cmake --build ... --target llama-perplexity)" >&2; exit 1; }
models=${NUCLEUS_MODELS:-$HOME/.cache/nucleus/models}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| model | text | nucleus run (base) | llama.cpp here: mean KL | top-1 agreement |"
echo "|---|---|---|---:|---:|"
specs=${SPECS:-"qwen2.5-coder-0.5b-instruct:python-stdlib.txt gemma-3-270m:gpl-3.txt"}
for spec in $specs; do
  set -- "${spec%%:*}" "${spec#*:}"
  model=$1 text=../shared/corpus/$2 gguf=$models/$1-q4_k_m.gguf
  case $model in *.gguf) gguf=$model; model=$(basename "$model" .gguf) ;; esac
  for arith in exact default; do
    flag=; [ $arith = exact ] && flag=--exact
    "$bin" perplexity "${1}" "$text" -t 2 --json $flag --kl-divergence-base-llama "$tmp/base.kld" >/dev/null
    "$lp" -m "$gguf" -t 2 -c 512 --kl-divergence-base "$tmp/base.kld" \
      --kl-divergence >"$tmp/out.txt" 2>&1
    kl=$(grep -E "^Mean +KLD:" "$tmp/out.txt" | awk '{print $3, $4, $5}')
    top=$(grep -E "^Same top p:" "$tmp/out.txt" | awk '{print $4, $5, $6, $7}')
    echo "| $model | $2 | --$arith | $kl | $top |"
  done
done
