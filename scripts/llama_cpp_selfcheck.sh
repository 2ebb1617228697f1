#!/usr/bin/env bash
# How closely llama.cpp itself, on this CPU, reproduces its own golden files. The golden files
# were made on an AVX-512 machine; on other CPUs ggml's kernels sum in another order and the
# logits drift (nucleus reproduces the AVX-512 build's arithmetic on every CPU, so it does not).
# Usage: scripts/llama_cpp_selfcheck.sh [MODE]   (MODE 0 = as the golden files were made)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-0}
src=$(LLAMA_CPP_ROOT=${LLAMA_CPP_ROOT:-} scripts/build_llama_cpp.sh)
out=.bench/selfcheck; mkdir -p "$out"
g++ -O2 -std=c++17 scripts/llama_cpp_selfcheck.cpp -I"$src/include" -I"$src/ggml/include" \
  -L"$src/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$src/build/bin" -o "$out/selfcheck"
models=${NUCLEUS_MODELS:-$HOME/.cache/nucleus/models}
for name in tiny-llama-random qwen2.5-coder-0.5b-instruct-q4_k_m gemma-3-270m-q4_k_m; do
  gguf=../shared/golden/$name.gguf; [ -f "$gguf" ] || gguf=$models/$name.gguf
  python3 - "$name" > "$out/$name.ref" <<'PY'
import json, sys
for line in open(f"../shared/golden/{sys.argv[1]}.jsonl"):
    c = json.loads(line)
    steps = c["prompt_logits"] + c["greedy_steps"]
    toks = c["tokens"] + c["greedy_tokens"]
    n = min(len(toks), len(steps))
    row = [len(c["tokens"]), n] + toks[:n]
    for s in steps[:n]:
        for i, v in s["top"]:
            row += [i, v]
    print(" ".join(map(str, row)))
PY
  "$out/selfcheck" "$gguf" "$out/$name.ref" "$mode" 2>/dev/null | sed "s/^/$name: /"
done
