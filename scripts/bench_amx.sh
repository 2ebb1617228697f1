#!/usr/bin/env bash
# AMX prompt products on a machine that has them (Intel Xeon from Sapphire Rapids on): the tile
# kernels' bits (the kernel unit tests, which compare tiles with the vector and scalar kernels),
# their speed by token count beside the 512-bit vector kernels (`matmul_bench`, NUCLEUS_AMX=all:
# every type with a tile kernel on tiles, and NUCLEUS_AMX=0), on both shapes of a 7B's FFN,
# and prefill of the 7B Q4_K_M and 1.5B Q8_0 shapes beside llama.cpp, 2 threads pinned to cores
# 0-1, two alternating rounds. Not run in CI (no AMX there). The figures in BENCHMARKS.md came
# from these steps on the lent device machine, with the binaries built here and carried there.
#
#   LLAMA_CPP_AMX=DIR LLAMA_CPP_AVX512=DIR scripts/bench_amx.sh   # DIRs holding llama-bench
#
# Needs .bench/venv (numpy) and the vendored llama.cpp source for scripts/real_shapes.py.
set -uo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p nucleus-cli -p nucleus --examples
unit=$(cargo test --release -q -p nucleus --lib --no-run --message-format=json 2>/dev/null \
  | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
py=${PYTHON:-.bench/venv/bin/python}
out=${OUT_DIR:-.bench/real-shapes}
$py scripts/real_shapes.py --out "$out" qwen2.5-7b-q4_k_m qwen2.5-1.5b-q8_0 >/dev/null && sync
echo "== tile kernels against the vector and scalar kernels (bits)"
"$unit" --test-threads 2 kernels:: quant:: 2>&1 | grep -E "FAILED|panicked|test result"
"$unit" --nocapture amx_is_used 2>&1 | grep -E "AMX:"
for shape in 3584,18944 18944,3584; do
  for amx in all 0; do
    echo "== matmul_bench $shape, NUCLEUS_AMX=$amx"
    NUCLEUS_AMX=$amx MATMUL_FAST_ONLY=1 MATMUL_SHAPE=$shape MATMUL_ROWS=32,128,512 \
      taskset -c 0,1 target/release/examples/matmul_bench 2 Q4_K,Q6_K,Q8_0,Q4_0,IQ4_NL | grep -v peak
  done
done
lb() { # llama-bench from dir $1 on file $2
  [ -n "$1" ] || return 0
  LD_LIBRARY_PATH=$1 timeout 200 taskset -c 0,1 "$1/llama-bench" -m "$2" -t 2 -p 512 -n 0 -r 1 \
    >/tmp/lb.log 2>&1; echo "llama.cpp $1: exit $?"; grep -E "pp512" /tmp/lb.log
}
nb() { # nucleus with NUCLEUS_AMX=$1 on file $2
  NUCLEUS_AMX=$1 taskset -c 0,1 target/release/nucleus bench "$2" -t 2 -p 512 -g 16 \
    | grep -E "AMX|prefill|decode|loaded" | tr '\n' ' '; echo
}
for f in "$out/qwen2.5-7b-q4_k_m-random.gguf" "$out/qwen2.5-1.5b-q8_0-random.gguf"; do
  cat "$f" >/dev/null
  for round in 1 2; do
    echo "== $f, round $round"
    nb 1 "$f"; nb 0 "$f"
    lb "${LLAMA_CPP_AMX:-}" "$f"; lb "${LLAMA_CPP_AVX512:-}" "$f"
  done
done
