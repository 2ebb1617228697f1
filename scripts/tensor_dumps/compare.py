#!/usr/bin/env python3
"""Layer-by-layer comparison of llama.cpp's tensors with nucleus's (see README.md).

Usage: compare.py NUCLEUS_DIR N_LAYERS N_TOKENS [NAME,NAME,...] [POSITION]

For each layer and tensor: how many elements differ per token (or at one position) and the
largest difference relative to the tensor's largest value. llama.cpp's files are
/tmp/lcpp_NAME-LAYER.bin, nucleus's NUCLEUS_DIR/NAME-LAYER.bin.
"""
import os
import sys

import numpy as np

ours_dir, n_layers, n_tok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names = (sys.argv[4] if len(sys.argv) > 4 else "attn_norm,Qcur,Kcur,Vcur,kqv_out,l_out").split(",")
pos = int(sys.argv[5]) if len(sys.argv) > 5 else None
for il in range(n_layers):
    out = []
    for n in names:
        a, b = f"/tmp/lcpp_{n}-{il}.bin", f"{ours_dir}/{n}-{il}.bin"
        if not (os.path.exists(a) and os.path.exists(b)):
            out.append(f"{n}:?")
            continue
        x, y = np.fromfile(a, dtype=np.float32), np.fromfile(b, dtype=np.float32)
        if x.size != y.size:
            out.append(f"{n}:size {x.size}/{y.size}")
            continue
        x, y = x.reshape(n_tok, -1), y.reshape(n_tok, -1)
        rows = range(n_tok) if pos is None else [pos]
        diffs = [int((x[r] != y[r]).sum()) for r in rows]
        rel = max(float(np.abs(x[r] - y[r]).max() / (np.abs(x[r]).max() + 1e-30)) for r in rows)
        out.append(f"{n}:{diffs}/{rel:.1e}")
    print(il, " ".join(out))
