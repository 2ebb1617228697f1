#!/usr/bin/env python3
"""Writes crates/nucleus/src/quant/testdata/low_bit_gguf_py.bin: random Q2_K, Q3_K, IQ4_NL and
IQ4_XS blocks and their dequantization by the `gguf` Python package (gguf-py), which
quant::tests_low_bit compares with nucleus's dequantize_row bit for bit.

Usage (in a venv with `pip install gguf numpy`): scripts/gen_low_bit_fixtures.py [OUT]

Format, per type: u32 ggml type id, u32 element count n, the row's bytes, then n f32 values
(all little-endian). The scale fields hold random f16 values of ordinary magnitude, plus one
block per type with extreme ones (largest f16, a subnormal, zero, negative).
"""
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

# (type, block bytes, block elements, byte offsets of the f16 scale fields)
TYPES = [
    (T.Q2_K, 84, 256, [80, 82]),
    (T.Q3_K, 110, 256, [108]),
    (T.IQ4_NL, 18, 32, [0]),
    (T.IQ4_XS, 136, 256, [0]),
]
EXTREME = [65504.0, 6.0e-8, 0.0, -2.0, -65504.0]


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "crates/nucleus/src/quant/testdata/low_bit_gguf_py.bin"
    rng = np.random.default_rng(20261123)
    blob = bytearray()
    for ty, bb, be, scale_at in TYPES:
        nblocks = 16 if be == 256 else 64
        raw = rng.integers(0, 256, size=(nblocks, bb), dtype=np.uint8)
        for b in range(nblocks):
            for k, at in enumerate(scale_at):
                if b == nblocks - 1:
                    v = EXTREME[k % len(EXTREME)] if k == 0 else EXTREME[(k + 2) % len(EXTREME)]
                else:
                    v = float(rng.uniform(-0.05, 0.05))
                raw[b, at:at + 2] = np.frombuffer(np.float16(v).tobytes(), dtype=np.uint8)
        data = raw.reshape(-1)
        values = quants.dequantize(data, ty).astype(np.float32).reshape(-1)
        assert values.size == nblocks * be
        blob += struct.pack("<II", int(ty), values.size)
        blob += data.tobytes()
        blob += values.astype("<f4").tobytes()
    with open(out, "wb") as f:
        f.write(blob)
    print(f"wrote {out}: {len(blob)} bytes")


if __name__ == "__main__":
    main()
