#!/usr/bin/env python3
"""Makes the fixtures of `crates/nucleus/tests/suite/quantize.rs`: a tiny random llama-shaped GGUF
(F16 and a few F32 tensors, rows of 256, 512, 96 and 80 to hit llama-quantize's fallbacks,
blocks of zeros, constants, outliers and near-zero values to hit the quantizers' edge cases),
and, for every type nucleus writes, what llama.cpp's llama-quantize makes of it: the whole
file's sha256 and each tensor's type and sha256, in file order.

    PYTHONPATH=$LLAMA/gguf-py target/venv/bin/python scripts/make_quantize_fixture.py $LLAMA/build/bin/llama-quantize

With `--moe`, the expert fixture instead: `tiny-moe-f16.gguf`, the gpt-oss fixture of
tests/data/arch dequantized to F16 by nucleus (`cargo run --release -p nucleus --example
requantize -- crates/nucleus/tests/data/arch/gpt-oss.gguf OUT f16`: 3-D expert tensors, biases,
sinks), and llama-quantize's output for the mixes with rules for expert tensors
(`llama_quantize_moe.json`).
"""
import hashlib, json, os, subprocess, sys, tempfile

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType

OUT = os.path.join(os.path.dirname(__file__), "..", "crates", "nucleus", "tests", "data", "quantize")
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
         "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4_MOE", "F16", "BF16", "F32"]
MOE_TYPES = ["MXFP4_MOE", "Q4_K_M", "Q2_K", "Q3_K_M", "IQ4_XS", "Q8_0"]
N_EMBD, N_LAYER = 256, 4

rng = np.random.default_rng(13)


def matrix(cols, rows):
    x = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
    x[0, :32] = 0.0                      # an all-zero block
    x[min(1, rows - 1), 32:64] = 0.125   # a constant block
    x[:, 7] *= 40.0                      # an outlier column
    if rows > 2:
        x[2, :] *= 1e-18                 # below GROUP_MAX_EPS
    if rows > 3:
        x[3, 64:96] = np.abs(x[3, 64:96])  # positive-only block (minimum clamps to 0)
    return x


def main():
    quantize = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    src = os.path.join(OUT, "tiny-f16.gguf")
    w = GGUFWriter(src, "llama")
    w.add_context_length(64)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1)

    def f16(name, cols, rows):
        w.add_tensor(name, matrix(cols, rows).astype(np.float16))

    def f32(name, cols, rows=None):
        w.add_tensor(name, matrix(cols, rows) if rows else np.ones(cols, np.float32))

    f16("token_embd.weight", N_EMBD, 48)
    f16("output.weight", N_EMBD, 32)
    f32("output_norm.weight", N_EMBD)
    down_cols = [96, 96, 80, 512]
    for i in range(N_LAYER):
        b = f"blk.{i}."
        f32(b + "attn_norm.weight", N_EMBD)
        f32(b + "ffn_norm.weight", N_EMBD)
        f16(b + "attn_q.weight", N_EMBD, 16)
        f16(b + "attn_k.weight", N_EMBD, 8)
        f16(b + "attn_v.weight", N_EMBD, 8)
        f16(b + "attn_output.weight", 512 if i == 1 else N_EMBD, 8 if i == 1 else 16)
        f16(b + "ffn_gate.weight", N_EMBD, 24)
        (f32 if i == 2 else f16)(b + "ffn_up.weight", N_EMBD, 24)
        f16(b + "ffn_down.weight", down_cols[i], 16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    write_expected(quantize, src, TYPES, "llama_quantize.json")
    print(f"{src}: {os.path.getsize(src)} bytes; {len(TYPES)} types")


def write_expected(quantize, src, types, name):
    expected = {}
    with tempfile.TemporaryDirectory() as tmp:
        for t in types:
            dst = os.path.join(tmp, t + ".gguf")
            subprocess.run([quantize, src, dst, t], check=True, capture_output=True)
            with open(dst, "rb") as f:
                whole = hashlib.sha256(f.read()).hexdigest()
            r = GGUFReader(dst)
            expected[t] = {
                "file_sha256": whole,
                "tensors": [[x.name, x.tensor_type.name, hashlib.sha256(x.data.tobytes()).hexdigest()]
                            for x in r.tensors],
            }
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if "--moe" in sys.argv:
        sys.argv.remove("--moe")
        write_expected(sys.argv[1], os.path.join(OUT, "tiny-moe-f16.gguf"), MOE_TYPES,
                       "llama_quantize_moe.json")
    else:
        main()
