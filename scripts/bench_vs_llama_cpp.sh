#!/usr/bin/env bash
# Side-by-side speed of nucleus and llama.cpp on the same GGUF files with the same thread count,
# in one run: prefill (pp512, one 512-token batch) and decode (tg128, 128 single-token steps after
# a one-token prompt) in tokens/s, and the ratios nucleus / llama.cpp, for nucleus's default
# arithmetic and for `--exact` (llama.cpp's, bit for bit). Prints a markdown table.
# Not run in CI.
#
# Usage: scripts/bench_vs_llama_cpp.sh [LLAMA_BENCH] [MODEL.gguf ...]
#
# Environment:
#   LLAMA_BENCH  path to llama-bench (or the first argument). When unset, scripts/build_llama_cpp.sh
#                builds it (once) from the vendored source of the llama-cpp-python==0.3.36 sdist,
#                -DGGML_NATIVE=ON, Release, under $LLAMA_CPP_ROOT (default .bench/llama.cpp).
#   NUCLEUS      path to the nucleus binary (default: built with cargo --release here)
#   THREADS      threads for both engines (default 2)
#   REPS         repetitions, best reported by nucleus and mean by llama-bench (default 3)
#   MODELS       space-separated GGUF paths (or pass them as arguments after LLAMA_BENCH);
#                default: the qwen2.5-coder-0.5b-instruct and gemma-3-270m Q4_K_M files in
#                ~/.cache/nucleus/models
#   NICE         a niceness for both engines, e.g. -10 on a shared machine (default: none)
#   DEPTH        tokens of context already in the KV cache when each measurement starts
#                (llama-bench's -d, nucleus bench's --depth; default 0)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THREADS="${THREADS:-2}"
REPS="${REPS:-3}"
DEPTH="${DEPTH:-0}"

if [[ $# -ge 1 && "$1" != *.gguf ]]; then
    LLAMA_BENCH="$1"
    shift
fi
if [[ $# -ge 1 ]]; then
    MODELS="$*"
fi
MODELS="${MODELS:-$HOME/.cache/nucleus/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf $HOME/.cache/nucleus/models/gemma-3-270m-q4_k_m.gguf}"

if [[ -z "${LLAMA_BENCH:-}" ]]; then
    LLAMA_BENCH="$("$ROOT/scripts/build_llama_cpp.sh")/build/bin/llama-bench"
fi
if [[ ! -x "$LLAMA_BENCH" ]]; then
    echo "llama-bench not found at $LLAMA_BENCH" >&2
    exit 1
fi

if [[ -z "${NUCLEUS:-}" ]]; then
    (cd "$ROOT" && cargo build --release -q -p nucleus-cli)
    NUCLEUS="${CARGO_TARGET_DIR:-$ROOT/target}/release/nucleus"
fi

RUN=()
if [[ -n "${NICE:-}" ]]; then
    RUN=(nice -n "$NICE")
fi

rows=()
for model in $MODELS; do
    name="$(basename "$model" .gguf)"
    echo "== $name" >&2
    echo "   load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    lj="$("${RUN[@]}" "$LLAMA_BENCH" -m "$model" -t "$THREADS" -p 512 -n 128 -d "$DEPTH" -r "$REPS" -o json 2>/dev/null)"
    nj="$("${RUN[@]}" "$NUCLEUS" bench "$model" -t "$THREADS" -p 512 -g 128 -d "$DEPTH" -r "$REPS" --json)"
    ej="$("${RUN[@]}" "$NUCLEUS" bench "$model" -t "$THREADS" -p 512 -g 128 -d "$DEPTH" -r "$REPS" --json --exact)"
    echo "   load after:  $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    rows+=("$(python3 - "$name" "$lj" "$nj" "$ej" <<'EOF'
import json, sys
name, lj, nj, ej = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
pp = next(r["avg_ts"] for r in lj if r["n_prompt"] > 0 and r["n_gen"] == 0)
tg = next(r["avg_ts"] for r in lj if r["n_gen"] > 0 and r["n_prompt"] == 0)
npp, ntg = nj["prefill_tokens_per_s"], nj["decode_tokens_per_s"]
epp, etg = ej["prefill_tokens_per_s"], ej["decode_tokens_per_s"]
print(f"| {name} | {pp:.1f} | {tg:.1f} | {npp:.1f} | {ntg:.1f} | {npp / pp:.2f}x | {ntg / tg:.2f}x "
      f"| {epp:.1f} | {etg:.1f} | {epp / pp:.2f}x | {etg / tg:.2f}x |")
EOF
)")
done

echo
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $THREADS threads, load $(cut -d' ' -f1-3 /proc/loadavg), context depth $DEPTH"
echo
echo "| model | llama.cpp pp512 | llama.cpp tg128 | nucleus pp512 | nucleus tg128 | prefill ratio | decode ratio | --exact pp512 | --exact tg128 | --exact prefill ratio | --exact decode ratio |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for r in "${rows[@]}"; do
    echo "$r"
done
