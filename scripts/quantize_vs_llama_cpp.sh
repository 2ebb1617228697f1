#!/usr/bin/env bash
# Quantizes one F16 GGUF with `nucleus quantize` and with llama.cpp's llama-quantize (built
# from the vendored source, no importance matrix) to every type nucleus writes, and compares
# every tensor's bytes. Prints a markdown table: type, both file sizes, identical tensors,
# whether the whole files are identical.
#
#   scripts/quantize_vs_llama_cpp.sh [F16.gguf] [TYPE...]
#
# Default input: /tmp/spec/qwen-f16.gguf (the catalog qwen dequantized to F16 with
# `cargo run --release --example requantize -- QWEN.gguf /tmp/spec/qwen-f16.gguf f16`).
set -euo pipefail
cd "$(dirname "$0")/.."
IN=${1:-/tmp/spec/qwen-f16.gguf}
shift || true
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(Q4_K_M Q2_K Q3_K_M Q5_K_M Q6_K IQ4_XS IQ4_NL Q3_K_S Q3_K_L Q4_K_S Q5_K_S Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 F16 BF16 F32)
LLAMA=${LLAMA_CPP:-.bench/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp}
[ -d "$LLAMA" ] || LLAMA=/work/main/.bench/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp
QUANTIZE=$LLAMA/build/bin/llama-quantize
[ -x "$QUANTIZE" ] || { echo "no $QUANTIZE: build llama.cpp first (scripts/build_llama_cpp.sh)" >&2; exit 1; }
PY=${PYTHON:-target/venv/bin/python}
[ -x "$PY" ] || { echo "no $PY: python3 -m venv target/venv && target/venv/bin/pip install numpy" >&2; exit 1; }
export PYTHONPATH=$LLAMA/gguf-py LD_LIBRARY_PATH=$LLAMA/build/bin
nice -n 19 cargo build --release -q -p nucleus-cli
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "input: $IN ($(stat -c %s "$IN") bytes)"
echo
echo "| type | nucleus bytes | llama-quantize bytes | identical tensors | whole file |"
echo "|---|---:|---:|---:|---|"
status=0
for T in "${TYPES[@]}"; do
  nice -n 19 target/release/nucleus quantize "$IN" "$WORK/n.gguf" "$T" 2>/dev/null
  nice -n 19 "$QUANTIZE" "$IN" "$WORK/l.gguf" "$T" >"$WORK/l.log" 2>&1 || { echo "llama-quantize failed on $T" >&2; tail -3 "$WORK/l.log" >&2; status=1; continue; }
  if cmp -s "$WORK/n.gguf" "$WORK/l.gguf"; then
    # Identical files: every tensor is; only count them.
    whole=yes
    n=$("$PY" -c 'import sys; from gguf import GGUFReader; print(len(GGUFReader(sys.argv[1]).tensors))' "$WORK/n.gguf")
    same=$n
  else
    whole=no
    line=$("$PY" scripts/quantize_compare.py "$WORK/n.gguf" "$WORK/l.gguf" --label "$T" || true)
    n=$(sed -E 's/.*tensors= *([0-9]+).*/\1/' <<<"$line")
    same=$(sed -E 's/.*identical= *([0-9]+).*/\1/' <<<"$line")
  fi
  [ "$same" = "$n" ] || status=1
  echo "| $T | $(stat -c %s "$WORK/n.gguf") | $(stat -c %s "$WORK/l.gguf") | $same / $n | $whole |"
  rm -f "$WORK/n.gguf" "$WORK/l.gguf"
done
exit $status
