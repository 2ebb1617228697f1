#!/usr/bin/env python3
"""Writes crates/nucleus/src/quant/testdata/mxfp4_quantize_gguf_py.bin: float blocks and what
the `gguf` Python package (llama.cpp's gguf-py, whose MXFP4 quantizer follows ggml's
quantize_row_mxfp4_ref) makes of them as MXFP4. Blocks: random values at magnitudes from 2^-130
to 2^20, a block of zeros, values exactly halfway between two table entries (the first index
wins), and a block whose largest magnitude is a power of two. Layout: u32 n, n f32, then the
MXFP4 bytes (17 per 32 values).

    PYTHONPATH=$LLAMA/gguf-py .bench/venv/bin/python scripts/gen_mxfp4_fixture.py
"""
import struct, sys

import numpy as np
from gguf import GGMLQuantizationType, quants

rng = np.random.default_rng(38)
blocks = []
for exp in range(-130, 21, 5):
    blocks.append(rng.standard_normal(32).astype(np.float32) * np.float32(2.0 ** exp))
blocks.append(np.zeros(32, np.float32))
# A block whose largest magnitude is 3 (e = 126, half scale d = 0.25): entries at the midpoints
# of the table's neighbours, k·d exactly.
d = np.float32(0.25)
half = np.array([0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0, -0.5, -2.5, -10.0] + [0.25] * 21 + [12.0],
                np.float32) * d
blocks.append(half.astype(np.float32))
blocks.append(np.array([4.0] + [0.3] * 31, np.float32))
x = np.concatenate(blocks).astype(np.float32)
q = quants.quantize(x.reshape(1, -1), GGMLQuantizationType.MXFP4)
out = sys.argv[1] if len(sys.argv) > 1 else "crates/nucleus/src/quant/testdata/mxfp4_quantize_gguf_py.bin"
with open(out, "wb") as f:
    f.write(struct.pack("<I", x.size))
    f.write(x.tobytes())
    f.write(q.tobytes())
print(f"{out}: {x.size} values, {q.nbytes} bytes")
