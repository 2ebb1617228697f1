#!/usr/bin/env bash
# nucleus against llama.cpp on Q2_K, Q3_K, IQ4_NL and IQ4_XS copies of the catalog qwen: greedy
# tokens and top-8 logits on the qwen golden file's prompts (prompt as one batch, then 32 greedy
# tokens one at a time). Not run by CI (it needs llama.cpp built from the vendored source).
#
# Usage: [TYPES="Q2_K ..."] scripts/formats_vs_llama_cpp.sh [F16.gguf] [OUT_DIR]
#   F16.gguf: an F16 qwen2.5-coder-0.5b-instruct (default /tmp/spec/qwen-f16.gguf; make one with
#   `cargo run --release -p nucleus --example requantize`); OUT_DIR (default /tmp/formats) gets
#   the quantized copies, llama.cpp's references and one summary line per type, then one for
#   the catalog's Q4_K_M qwen (when pulled) as the baseline: the same comparison on a file whose
#   golden test nucleus passes bit for bit against llama.cpp's AVX-512 build.
#
# qwen's width (896) is not a multiple of 256: llama-quantize gives such tensors Q4_0 (or
# IQ4_NL for IQ4_XS) instead, so the K-quant and IQ4_XS copies hold the type in ffn_down (4864
# columns) only; `--pure` keeps the mixes from swapping it for another. llama.cpp here is its
# AVX2 build when the CPU lacks AVX-512, whose summation order nucleus's `--exact` does not
# follow: expect small logit differences, and greedy runs that part at near-ties.
set -euo pipefail
cd "$(dirname "$0")/.."
f16=${1:-/tmp/spec/qwen-f16.gguf}
out=${2:-/tmp/formats}
mkdir -p "$out"
src=$(LLAMA_CPP_ROOT=${LLAMA_CPP_ROOT:-} scripts/build_llama_cpp.sh)
g++ -O2 -std=c++17 scripts/llama_cpp_reference.cpp -I"$src/include" -I"$src/ggml/include" \
  -L"$src/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$src/build/bin" -o "$out/reference"
if [ ! -x "$src/build/bin/llama-quantize" ]; then
  cmake --build "$src/build" -j2 --target llama-quantize >&2
fi
python3 - > "$out/prompts.txt" <<'PY'
import json
for line in open("../shared/golden/qwen2.5-coder-0.5b-instruct-q4_k_m.jsonl"):
    tokens = json.loads(line)["tokens"]
    print(len(tokens), *tokens)
PY
cargo build --release -q -p nucleus --example compare_reference
for ty in ${TYPES:-Q2_K Q3_K IQ4_NL IQ4_XS}; do
  gguf=$out/qwen-$ty.gguf
  [ -f "$gguf" ] || "$src/build/bin/llama-quantize" --pure "$f16" "$gguf" "$ty" 2 > "$out/quantize-$ty.log" 2>&1
  echo "$ty tensors: $(grep -oE "converting to [A-Za-z0-9_]+" "$out/quantize-$ty.log" | sort | uniq -c | tr -s ' \n' ' ')"
  "$out/reference" "$gguf" "$out/prompts.txt" 32 > "$out/ref-$ty.jsonl"
  target/release/examples/compare_reference "$gguf" "$out/ref-$ty.jsonl"
done
baseline=${NUCLEUS_MODELS:-$HOME/.cache/nucleus/models}/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
if [ -f "$baseline" ]; then
  "$out/reference" "$baseline" "$out/prompts.txt" 32 > "$out/ref-Q4_K_M.jsonl"
  echo -n "baseline: "
  target/release/examples/compare_reference "$baseline" "$out/ref-Q4_K_M.jsonl"
fi
