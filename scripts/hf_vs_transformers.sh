#!/usr/bin/env bash
# nucleus against Hugging Face transformers (CPU) on tiny random Llama and Qwen2 checkpoints
# that transformers creates: prints the table of logit gaps and greedy agreement (see
# scripts/hf_vs_transformers.py). Not run in CI: it installs torch, transformers, safetensors
# and tokenizers from PyPI into target/hf-venv (large, once).
#
#   scripts/hf_vs_transformers.sh                      # compare
#   scripts/hf_vs_transformers.sh --write-fixtures crates/nucleus/tests/data/hf
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/hf-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, transformers' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch transformers safetensors tokenizers
fi
nice -n 19 cargo build --release -q -p nucleus-cli
exec nice -n 19 "$venv/bin/python" scripts/hf_vs_transformers.py "$@"
