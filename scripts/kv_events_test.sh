#!/usr/bin/env bash
# Runs scripts/kv_events_test.py in a venv with pyzmq and msgpack from PyPI (loopback only).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KV_EVENTS_VENV:-${CARGO_TARGET_DIR:-target}/kv-events-venv}
if [[ ! -x $VENV/bin/python ]]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check pyzmq==27.3.0 msgpack==1.2.4
"$VENV/bin/python" scripts/kv_events_test.py
