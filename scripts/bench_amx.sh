#!/usr/bin/env bash
# AMX prompt products on a machine that has them (Intel Xeon from Sapphire Rapids on), 2 threads
# pinned to CPUS (default 0,1):
#   1. the tile kernels' bits: the kernel unit tests, which compare the hardware tiles with the
#      vector and scalar kernels and the one-token (decode) kernels;
#   2. the products' speed by token count, tiles (NUCLEUS_AMX=all: every type with a tile kernel
#      on tiles) beside the 512-bit vector kernels (NUCLEUS_AMX=0), on both shapes of a 7B's FFN,
#      Q4_K in the chain nucleus's prompts take on tiles (MATMUL_CHAIN, default "default": one FMA
#      a super-block; "pairs": one a pair of sub-blocks); OLD_MATMUL, a matmul_bench
#      of another build, runs the tiles too (a before and after);
#   3. the machine's ceilings (scripts/machine_limits.c); where one thread's tile kernels spend
#      their time (the unit test tile_costs: whole, folds alone, tiles alone) and what the tile
#      instruction mixes cost with operands in L1 (scripts/amx_loops.c);
#   4. prefill and decode of the 7B and 8B Q4_K_M shapes (scripts/real_shapes.py), nucleus with
#      the thresholds of choice.rs, and in the first round with each NUCLEUS_AMX value of MODES
#      (default "all 0": every product on tiles, and none), beside llama.cpp's llama-bench
#      (LLAMA_BENCH_DIR: its native build, with its own AMX kernels since
#      scripts/build_llama_cpp.sh turns off GCC's dead-store passes that broke them, or a build
#      without AMX) and OLD_NUCLEUS (a build before, where given); ROUNDS rounds, the second and
#      later of nucleus (thresholds), llama.cpp and the build before alone, in the other order,
#      round by round over the files. ONLY_MODELS=1 runs step 4 alone.
# Not run in CI (no AMX there). The figures in BENCHMARKS.md came from these steps on the lent
# device machine, which has no Rust: BIN names a folder of binaries built elsewhere (nucleus,
# matmul_bench, and the library's unit tests as nucleus-lib-tests); without it cargo builds them.
#
#   LLAMA_BENCH_DIR=DIR [BIN=DIR] [OLD_MATMUL=FILE] [OLD_NUCLEUS=FILE] [ROUNDS=1] [MODES="all 0"]
#     [FILES="NAME ..."] [ONLY_MODELS=1] [MM_TYPES=TYPES] [MM_TYPES_TALL=TYPES] [SKIP_COSTS=1]
#     [WRITE_CPUS=4-15]
#     scripts/bench_amx.sh
#
# MM_TYPES and MM_TYPES_TALL: the types of step 2 on the 3584×18944 and 18944×3584 shapes;
# SKIP_COSTS=1 leaves out the one-thread timings of steps 2 and 3; WRITE_CPUS: where the files
# are written, beside the unit tests (not on CPUS).
#
# Writing the files needs numpy and the vendored llama.cpp source (scripts/real_shapes.py;
# LLAMA_CPP_SRC and QWEN_VOCAB where the catalog model and .bench/ are not at hand: the latter
# written beforehand by `real_shapes.py --qwen-vocab FILE`).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${BIN:-}" ]; then
  nucleus=$BIN/nucleus matmul=$BIN/matmul_bench unit=$BIN/nucleus-lib-tests
else
  cargo build --release -q -p nucleus-cli -p nucleus --examples
  nucleus=target/release/nucleus matmul=target/release/examples/matmul_bench
  unit=$(cargo test --release -q -p nucleus --lib --no-run --message-format=json 2>/dev/null \
    | grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
fi
py=${PYTHON:-.bench/venv/bin/python}
out=${OUT_DIR:-.bench/real-shapes}
cpus=${CPUS:-0,1}
pin() { taskset -c "$cpus" "$@"; }

echo "== machine ($(date -u +%H:%M) UTC)"
lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Core|^Socket|^L1d|^L2|^L3|^NUMA node0"
grep -o -w -E "avx512[a-z_0-9]*|amx[a-z_0-9]*|avx_vnni" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
lscpu -e=CPU,CORE,SOCKET,L2 2>/dev/null | head -5

# The files are written first, on the CPUs the timings do not use, while the unit tests run;
# every timing waits for them (a file being written back slows what runs beside it).
files=${FILES:-qwen2.5-7b-q4_k_m llama-3.1-8b-q4_k_m}
echo "== files: writing $files ($(date -u +%H:%M) UTC)"
for f in $files; do
  [ -f "$out/$f-random.gguf" ] || taskset -c "${WRITE_CPUS:-4-15}" \
    $py scripts/real_shapes.py --out "$out" "$f" &
done

if [ -z "${ONLY_MODELS:-}" ]; then
echo "== tile kernels against the vector, scalar and one-token kernels (bits)"
"$unit" --test-threads 4 kernels:: quant:: 2>&1 | grep -E "FAILED|panicked|test result"
"$unit" --nocapture amx_is_used 2>&1 | grep -E "AMX:"

mm() { # NUCLEUS_AMX value, shape, types, binary
  echo "-- NUCLEUS_AMX=$1 $2 $3 ($4)"
  NUCLEUS_AMX=$1 MATMUL_CHAIN=${MATMUL_CHAIN:-default} MATMUL_FAST_ONLY=1 MATMUL_SHAPE=$2 \
    MATMUL_ROWS=${MATMUL_ROWS:-32,128,512} pin timeout 120 "$4" 2 "$3" | grep -E "rows="
}
wait
sync
echo "== products: G MAC/s, tiles (all) and vectors (0) ($(date -u +%H:%M) UTC)"
for amx in all 0; do mm $amx 3584,18944 "${MM_TYPES:-Q4_K,Q6_K,Q8_0,MXFP4}" "$matmul"; done
[ -n "${OLD_MATMUL:-}" ] && mm all 3584,18944 Q4_K,Q6_K,Q8_0 "$OLD_MATMUL"
for amx in all 0; do mm $amx 18944,3584 "${MM_TYPES_TALL:-Q4_K,Q6_K}" "$matmul"; done
if [ -z "${SKIP_COSTS:-}" ]; then
echo "-- one thread, tiles: NUCLEUS_AMX=all 3584,18944 Q6_K,Q4_K, 512 tokens"
NUCLEUS_AMX=all MATMUL_CHAIN=${MATMUL_CHAIN:-default} MATMUL_FAST_ONLY=1 MATMUL_SHAPE=3584,18944 MATMUL_ROWS=512 \
  taskset -c "${cpus%%,*}" timeout 60 "$matmul" 1 Q6_K,Q4_K | grep -E "rows="
fi
echo "== ceilings"
if cc -O3 -march=native -pthread scripts/machine_limits.c -o /tmp/machine_limits; then
  pin timeout 60 /tmp/machine_limits 2 | tail -4
fi
if [ -z "${SKIP_COSTS:-}" ]; then
echo "== one thread: the tile kernels' parts (G MAC/s), and the tile instruction mixes"
taskset -c "${cpus%%,*}" timeout 120 "$unit" --ignored --nocapture tile_costs 2>&1 | grep -E "Q4_K|Q6_K"
if cc -O2 -march=native scripts/amx_loops.c -o /tmp/amx_loops; then
  taskset -c "${cpus%%,*}" timeout 60 /tmp/amx_loops
fi
fi
fi

wait
sync
echo "== models ($(date -u +%H:%M) UTC)"

nb() { # NUCLEUS_AMX value (empty: unset), file[, binary]
  echo -n "nucleus${3:+ ($3)} AMX=${1:-default}: "
  NUCLEUS_AMX=$1 pin timeout 200 "${3:-$nucleus}" bench "$2" -t 2 -p 512 -g 32 2>&1 \
    | grep -E "loaded|AMX|prefill|decode" | tr '\n' ' '; echo
}
old() { # file: the build before, where given
  [ -z "${OLD_NUCLEUS:-}" ] || nb "" "$1" "$OLD_NUCLEUS"
}
lb() { # file
  [ -n "${LLAMA_BENCH_DIR:-}" ] || return 0
  echo -n "llama.cpp: "
  LD_LIBRARY_PATH=$LLAMA_BENCH_DIR pin timeout 240 "$LLAMA_BENCH_DIR/llama-bench" -m "$1" -t 2 \
    -p 512 -n 32 -r 1 2>&1 | grep -E "pp512|tg32" | awk -F'|' '{print $(NF-2), $(NF-1)}' | tr '\n' ' '
  echo
}
for f in $files; do cat "$out/$f-random.gguf" >/dev/null; done
for round in $(seq "${ROUNDS:-1}"); do
  for f in $files; do
    path=$out/$f-random.gguf
    echo "== $f, round $round ($(date -u +%H:%M:%S) UTC)"
    if [ $((round % 2)) = 1 ]; then
      nb "" "$path"; lb "$path"; old "$path"
      for mode in ${MODES-all 0}; do nb "$mode" "$path"; done
    else
      lb "$path"; nb "" "$path"; old "$path"
    fi
  done
done
echo "== done ($(date -u +%H:%M:%S) UTC)"
