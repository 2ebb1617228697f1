#!/usr/bin/env bash
# llama.cpp on the GGUFs `nucleus quantize DIR OUT TYPE` writes from the tiny checkpoints of
# crates/nucleus/tests/data/hf: token ids against the Hugging Face tokenizers library and
# nucleus, greedy tokens and logits against nucleus, greedy tokens against transformers'
# reference (see scripts/hf_gguf_llama_cpp.py). Builds llama.cpp's llama-tokenize and
# scripts/golden_dump.cpp when missing, and installs the tokenizers package from PyPI into
# target/tok-venv (small, once). Not used by CI.
#
#   scripts/hf_gguf_llama_cpp.sh     (LLAMA_CPP_ROOT=... as for scripts/build_llama_cpp.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${NUCLEUS_BIN:-./target/release/nucleus}
[ -x "$bin" ] || nice -n 19 cargo build --release -q -p nucleus-cli
src=$(scripts/build_llama_cpp.sh)
[ -x "$src/build/bin/llama-tokenize" ] ||
  nice -n 19 cmake --build "$src/build" --target llama-tokenize -j2 >&2
dump=target/golden_dump
if [ ! -x "$dump" ] || [ scripts/golden_dump.cpp -nt "$dump" ]; then
  nice -n 19 g++ -O2 -std=c++17 scripts/golden_dump.cpp -I"$src/include" -I"$src/ggml/include" \
    -L"$src/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$src/build/bin" -o "$dump"
fi
venv=target/tok-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q tokenizers
fi
exec nice -n 19 "$venv/bin/python" scripts/hf_gguf_llama_cpp.py --nucleus "$bin" \
  --llama-cpp "$src/build/bin" --dump "$dump"
