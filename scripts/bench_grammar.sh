#!/usr/bin/env bash
# Decode tokens/s with and without a JSON-schema constraint on the catalog models (the grammar
# stage's cost): crates/nucleus/examples/grammar_bench.rs on each. Usage:
#   scripts/bench_grammar.sh [tokens] [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=${NUCLEUS_MODELS:-$HOME/.cache/nucleus/models}
cargo build --release -p nucleus --example grammar_bench
BIN=${CARGO_TARGET_DIR:-target}/release/examples/grammar_bench
for m in qwen2.5-coder-0.5b-instruct-q4_k_m gemma-3-270m-q4_k_m; do
    "$BIN" "$MODELS/$m.gguf" "${1:-128}" "${2:-3}"
done
