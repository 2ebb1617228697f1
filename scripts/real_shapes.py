#!/usr/bin/env python3
"""Random-weight GGUFs with the exact shapes and quantization mixes of models people run, for
speed measurements at real sizes (scripts/bench_real_shapes.sh). A random file costs what the
real one costs: the same tensors, types, byte counts and layout; only the values differ (and a
forward pass reads every byte whatever its value).

    python3 -m venv .bench/venv && .bench/venv/bin/pip install numpy pyyaml
    .bench/venv/bin/python scripts/real_shapes.py [--out DIR] [NAME ...]   # default: all
    .bench/venv/bin/python scripts/real_shapes.py --list

Each NAME is `<shape>-<mix>`: shapes qwen2.5-1.5b, qwen2.5-7b, llama-3.1-8b, and the mixtures
of experts qwen3-30b-a3b-24l (24 of its 48 layers), olmoe-1b-7b (and olmoe-1b-7b-2l: 2 of its
layers) and gpt-oss-20b (hyper-parameters from the models' config.json), mixes q4_k_m, q5_k_m,
q6_k, q8_0, mxfp4 (gpt-oss's: MXFP4 experts, Q8_0 for the other matrices) and f16 (normally
distributed weights, the input of a quantization). `--moe` writes the two MoE Q4_K_M files and gpt-oss-20b-mxfp4. The Q4_K_M mix is llama-quantize's
(`llama_tensor_get_type` in the vendored src/llama-quant.cpp): Q4_K everywhere but attn_v and
ffn_down in the layers `use_more_bits` picks (Q6_K), the output matrix (Q6_K; the token
embeddings too where they are tied to it); norms and biases F32. Q5_K_M (`q5_k_m`): the same
with Q5_K for Q4_K. Q6_K and Q8_0: every matrix. `iq4_xs` and `q3_k_m`: the f16 file quantized
by `nucleus quantize FILE OUT IQ4_XS` (or `Q3_K_M`; its types per tensor as llama-quantize
chooses them, without an importance matrix).

Values: quantized blocks of random bytes with block scales of a sane size (f16 around 2^-10), so
no NaN or infinity reaches the arithmetic. Vocabulary: the catalog Qwen2.5-Coder file's
(~/.cache/nucleus/models; padded with unused tokens to the embedding's rows, as Qwen's own GGUFs
are) for the Qwen shapes, llama.cpp's models/ggml-vocab-llama-bpe.gguf (Llama 3's 128,256
tokens) for Llama. Deterministic for a given seed. Needs the vendored llama.cpp source (for
gguf-py): scripts/build_llama_cpp.sh, or LLAMA_CPP_SRC=DIR.
"""

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def find_llama_cpp():
    if "LLAMA_CPP_SRC" in os.environ:
        return Path(os.environ["LLAMA_CPP_SRC"])
    for root in (".bench/llama.cpp", ".bench/llama.cpp-avx512"):
        p = ROOT / root / "llama_cpp_python-0.3.36/vendor/llama.cpp"
        if (p / "gguf-py").exists():
            return p
    sys.exit("llama.cpp's vendored source was not found under .bench/: run "
             "scripts/build_llama_cpp.sh or set LLAMA_CPP_SRC")


LLAMA_CPP = find_llama_cpp()
sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

# QWEN_VOCAB: another file with the same tokenizer fields (a vocabulary-only copy, where the
# catalog model is not at hand: the device machine of scripts/bench_amx.sh).
CATALOG_QWEN = Path(os.environ.get(
    "QWEN_VOCAB", Path.home() / ".cache/nucleus/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))

# config.json of Qwen/Qwen2.5-1.5B-Instruct, Qwen/Qwen2.5-7B-Instruct, meta-llama/Llama-3.1-8B.
SHAPES = {
    "qwen2.5-1.5b": dict(arch="qwen2", n_layer=28, n_embd=1536, n_head=12, n_head_kv=2,
                         n_ff=8960, n_vocab=151936, tied=True, qkv_bias=True,
                         rope_theta=1e6, eps=1e-6, ctx=32768),
    "qwen2.5-7b": dict(arch="qwen2", n_layer=28, n_embd=3584, n_head=28, n_head_kv=4,
                       n_ff=18944, n_vocab=152064, tied=False, qkv_bias=True,
                       rope_theta=1e6, eps=1e-6, ctx=32768),
    "llama-3.1-8b": dict(arch="llama", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8,
                         n_ff=14336, n_vocab=128256, tied=False, qkv_bias=False,
                         rope_theta=5e5, eps=1e-5, ctx=131072),
    # Mixtures of experts (config.json of Qwen/Qwen3-30B-A3B, allenai/OLMoE-1B-7B-0924).
    # Qwen3-30B-A3B keeps 24 of its 48 layers (9.4 GB of 18.6): the file and nucleus's repacked
    # copy of it must fit in this machine's 24 GB together while the engines alternate.
    "qwen3-30b-a3b-24l": dict(arch="qwen3moe", n_layer=24, n_embd=2048, n_head=32, n_head_kv=4,
                              head_dim=128, n_ff=6144, n_vocab=151936, tied=False,
                              qkv_bias=False, qk_norm="head", n_expert=128, n_expert_used=8,
                              n_ff_exp=768, rope_theta=1e6, eps=1e-6, ctx=40960),
    "olmoe-1b-7b": dict(arch="olmoe", n_layer=16, n_embd=2048, n_head=16, n_head_kv=16,
                        n_ff=1024, n_vocab=50304, tied=False, qkv_bias=False, qk_norm="all",
                        n_expert=64, n_expert_used=8, n_ff_exp=1024, rope_theta=1e4, eps=1e-5,
                        ctx=4096),
    # OLMoE at real width with 2 of its 16 layers, for `nucleus quantize` against llama-quantize
    # on real-width expert tensors (its F16 mix: 2.0 GB; scripts/quantize_experts_real_width.sh).
    "olmoe-1b-7b-2l": dict(arch="olmoe", n_layer=2, n_embd=2048, n_head=16, n_head_kv=16,
                           n_ff=1024, n_vocab=50304, tied=False, qkv_bias=False, qk_norm="all",
                           n_expert=64, n_expert_used=8, n_ff_exp=1024, rope_theta=1e4,
                           eps=1e-5, ctx=4096),
    # openai/gpt-oss-20b's config.json; its GGUF (ggml-org/gpt-oss-20b-GGUF, 12.1 GB) keeps the
    # experts in MXFP4 and the other matrices in Q8_0 (the "mxfp4" mix here).
    "gpt-oss-20b": dict(arch="gpt-oss", n_layer=24, n_embd=2880, n_head=64, n_head_kv=8,
                        head_dim=64, n_ff=2880, n_vocab=201088, tied=False, qkv_bias=True,
                        n_expert=32, n_expert_used=4, n_ff_exp=2880, rope_theta=150000.0,
                        eps=1e-5, ctx=131072, sliding_window=128, yarn=(32.0, 4096)),
}
MIXES = {"q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "q8_0": 7, "mxfp4": 38, "f16": 1}  # llama_ftype of each mix
DEFAULT = ["qwen2.5-1.5b-q4_k_m", "qwen2.5-7b-q4_k_m", "llama-3.1-8b-q4_k_m",
           "qwen2.5-1.5b-q8_0", "qwen2.5-1.5b-q6_k", "qwen2.5-1.5b-q5_k_m"]
MOE = ["qwen3-30b-a3b-24l-q4_k_m", "olmoe-1b-7b-q4_k_m", "gpt-oss-20b-mxfp4"]


def use_more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def matrix_type(mix, name, layer, n_layer, tied):
    """llama-quantize's choice for a 2-D weight of a llama/qwen2 model (rows a multiple of 256)."""
    if mix == "mxfp4":
        return Q.MXFP4 if name.endswith("_exps.weight") else Q.Q8_0
    if mix == "f16":
        return Q.F16
    if mix == "q8_0":
        return Q.Q8_0
    if mix == "q6_k":
        return Q.Q6_K
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return Q.Q6_K
    if name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")) and \
            use_more_bits(layer, n_layer):
        return Q.Q6_K
    return Q.Q5_K if mix == "q5_k_m" else Q.Q4_K


def random_blocks(rng, ty, n_blocks):
    """n_blocks blocks of `ty` of random bytes, their f16 scales set to about 2^-10."""
    size = gguf.GGML_QUANT_SIZES[ty][1]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)

    def scales(col):
        d = (rng.random(n_blocks, dtype=np.float32) * 0.75 + 0.25) * np.float32(2 ** -10)
        b[:, col:col + 2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)

    if ty == Q.Q8_0:
        scales(0)
    elif ty in (Q.Q4_K, Q.Q5_K):
        scales(0)
        scales(2)
    elif ty == Q.Q6_K:
        scales(208)
        b[:, 192:208] &= 0x3F  # int8 sub-block scales: 0..63
    elif ty == Q.MXFP4:
        b[:, 0] = rng.integers(119, 123, size=n_blocks, dtype=np.uint8)  # 2^-9 .. 2^-6
    else:
        raise ValueError(ty)
    return b


def tensors(shape, mix):
    """(name, rows, cols, type, experts) of every tensor, in llama.cpp's order (experts: the
    count of a 3-D expert tensor, else 0)."""
    s = shape
    head = s.get("head_dim", s["n_embd"] // s["n_head"])
    q, kv = s["n_head"] * head, s["n_head_kv"] * head
    out = []

    def mat(name, rows, cols, layer=-1, experts=0):
        ty = matrix_type(mix, name, layer, s["n_layer"], s["tied"])
        out.append((name, rows, cols, ty, experts))

    def vec(name, n):
        out.append((name, 1, n, Q.F32, 0))

    mat("token_embd.weight", s["n_vocab"], s["n_embd"])
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        vec(b + "attn_norm.weight", s["n_embd"])
        mat(b + "attn_q.weight", q, s["n_embd"], i)
        mat(b + "attn_k.weight", kv, s["n_embd"], i)
        mat(b + "attn_v.weight", kv, s["n_embd"], i)
        if s["qkv_bias"]:
            for n, rows in (("q", q), ("k", kv), ("v", kv)):
                vec(b + f"attn_{n}.bias", rows)
        if s.get("qk_norm") == "head":
            vec(b + "attn_q_norm.weight", head)
            vec(b + "attn_k_norm.weight", head)
        elif s.get("qk_norm") == "all":
            vec(b + "attn_q_norm.weight", q)
            vec(b + "attn_k_norm.weight", kv)
        mat(b + "attn_output.weight", s["n_embd"], q, i)
        gpt_oss = s["arch"] == "gpt-oss"
        if gpt_oss:
            vec(b + "attn_output.bias", s["n_embd"])
            vec(b + "attn_sinks.weight", s["n_head"])
        vec(b + ("post_attention_norm.weight" if gpt_oss else "ffn_norm.weight"), s["n_embd"])
        if "n_expert" in s:
            ne, ff = s["n_expert"], s["n_ff_exp"]
            # The router stays F32, as llama-quantize leaves it (a 1-D-like small matrix).
            out.append((b + "ffn_gate_inp.weight", ne, s["n_embd"], Q.F32, 0))
            mat(b + "ffn_gate_exps.weight", ff, s["n_embd"], i, ne)
            mat(b + "ffn_up_exps.weight", ff, s["n_embd"], i, ne)
            mat(b + "ffn_down_exps.weight", s["n_embd"], ff, i, ne)
            if gpt_oss:
                vec(b + "ffn_gate_inp.bias", ne)
                out.append((b + "ffn_gate_exps.bias", ne, ff, Q.F32, 0))
                out.append((b + "ffn_up_exps.bias", ne, ff, Q.F32, 0))
                out.append((b + "ffn_down_exps.bias", ne, s["n_embd"], Q.F32, 0))
        else:
            mat(b + "ffn_gate.weight", s["n_ff"], s["n_embd"], i)
            mat(b + "ffn_up.weight", s["n_ff"], s["n_embd"], i)
            mat(b + "ffn_down.weight", s["n_embd"], s["n_ff"], i)
    vec("output_norm.weight", s["n_embd"])
    if not s["tied"]:
        mat("output.weight", s["n_vocab"], s["n_embd"])
    return out


def read_vocab(path):
    r = gguf.GGUFReader(path)

    def field(key):
        f = r.fields.get(key)
        if f is None:
            return None
        vals = [f.parts[i] for i in f.data]
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(v).decode("utf-8") for v in vals]
        return [v.tolist()[0] for v in vals]

    keys = ("model", "pre", "tokens", "token_type", "merges", "eos_token_id", "bos_token_id")
    return {k: field(f"tokenizer.ggml.{k}") for k in keys}


def vocabulary(shape_name, n_vocab):
    if shape_name.startswith("qwen"):
        if not CATALOG_QWEN.exists():
            sys.exit(f"{CATALOG_QWEN} is missing: run `nucleus pull qwen2.5-coder-0.5b-instruct`")
        v = read_vocab(CATALOG_QWEN)
    else:
        v = read_vocab(LLAMA_CPP / "models/ggml-vocab-llama-bpe.gguf")
    if len(v["tokens"]) > n_vocab:
        # OLMoE's 50,304 rows: Llama 3's first tokens, with the merges among them.
        v["tokens"], v["token_type"] = v["tokens"][:n_vocab], v["token_type"][:n_vocab]
        kept = set(v["tokens"])
        v["merges"] = [m for m in v["merges"]
                       if all(p in kept for p in m.split(" ")) and m.replace(" ", "") in kept]
        for k in ("eos_token_id", "bos_token_id"):
            v[k] = 0
    pad = n_vocab - len(v["tokens"])
    v["tokens"] += [f"[PAD{i}]" for i in range(pad)]
    v["token_type"] += [5] * pad  # unused
    return v


def add_vocab(w, v):
    """The tokenizer fields of `v` (read_vocab's) into the writer `w`."""
    one = lambda x: x[0] if isinstance(x, list) else x  # noqa: E731
    w.add_string("tokenizer.ggml.model", one(v["model"]))
    if v["pre"]:
        w.add_string("tokenizer.ggml.pre", one(v["pre"]))
    w.add_array("tokenizer.ggml.tokens", v["tokens"])
    w.add_array("tokenizer.ggml.token_type", v["token_type"])
    w.add_array("tokenizer.ggml.merges", v["merges"])
    for k in ("eos_token_id", "bos_token_id"):
        if v[k] is not None:
            w.add_uint32(f"tokenizer.ggml.{k}", one(v[k]))


def write_qwen_vocab(path):
    """A vocabulary-only GGUF of the catalog Qwen's tokenizer (QWEN_VOCAB where the catalog
    file does not travel: scripts/bench_amx.sh's device machine)."""
    w = gguf.GGUFWriter(str(path), "qwen2")
    add_vocab(w, read_vocab(CATALOG_QWEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


# Mixes made by `nucleus quantize` from the shape's f16 file (the types this script does not
# write itself): mix -> nucleus quantize's type name.
QUANTIZED = {"iq4_xs": "IQ4_XS", "q3_k_m": "Q3_K_M"}


def write_quantized(shape_name, mix, out_dir, seed):
    """`<shape>-<mix>` quantized by nucleus (NUCLEUS, default target/release/nucleus) from the
    shape's f16 file, which is written first when missing."""
    import subprocess
    src = out_dir / f"{shape_name}-f16-random.gguf"
    if not src.exists():
        write(f"{shape_name}-f16", out_dir, seed)
    path = out_dir / f"{shape_name}-{mix}-random.gguf"
    nucleus = os.environ.get("NUCLEUS", str(ROOT / "target/release/nucleus"))
    subprocess.run([nucleus, "quantize", str(src), str(path), QUANTIZED[mix]], check=True)
    return path


def write(name, out_dir, seed):
    shape_name, mix = name.rsplit("-", 1)
    if shape_name in SHAPES and mix in QUANTIZED:
        return write_quantized(shape_name, mix, out_dir, seed)
    if shape_name not in SHAPES or mix not in MIXES:
        sys.exit(f"unknown file {name!r}: shapes {list(SHAPES)}, "
                 f"mixes {list(MIXES) + list(QUANTIZED)}")
    s = SHAPES[shape_name]
    path = out_dir / f"{name}-random.gguf"
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), s["arch"])
    a = s["arch"]
    w.add_name(f"{shape_name} random weights ({mix})")
    w.add_file_type(MIXES[mix])
    w.add_quantization_version(2)
    w.add_uint32(f"{a}.block_count", s["n_layer"])
    w.add_uint32(f"{a}.context_length", s["ctx"])
    w.add_uint32(f"{a}.embedding_length", s["n_embd"])
    w.add_uint32(f"{a}.feed_forward_length", s["n_ff"])
    w.add_uint32(f"{a}.attention.head_count", s["n_head"])
    w.add_uint32(f"{a}.attention.head_count_kv", s["n_head_kv"])
    w.add_float32(f"{a}.rope.freq_base", s["rope_theta"])
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s["eps"])
    if "head_dim" in s:
        w.add_uint32(f"{a}.attention.key_length", s["head_dim"])
        w.add_uint32(f"{a}.attention.value_length", s["head_dim"])
    if "sliding_window" in s:
        w.add_uint32(f"{a}.attention.sliding_window", s["sliding_window"])
    if "yarn" in s:
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", s["yarn"][0])
        w.add_uint32(f"{a}.rope.scaling.original_context_length", s["yarn"][1])
    if "n_expert" in s:
        w.add_uint32(f"{a}.expert_count", s["n_expert"])
        w.add_uint32(f"{a}.expert_used_count", s["n_expert_used"])
        w.add_uint32(f"{a}.expert_feed_forward_length", s["n_ff_exp"])
    add_vocab(w, vocabulary(shape_name, s["n_vocab"]))
    plan = tensors(s, mix)
    for tname, rows, cols, ty, ne in plan:
        if ty == Q.F32:
            shape = (cols,) if rows == 1 else (rows, cols)
            w.add_tensor_info(tname, shape, np.dtype(np.float32), 4 * rows * cols)
        elif ty == Q.F16:
            shape = (rows, cols) if not ne else (ne, rows, cols)
            w.add_tensor_info(tname, shape, np.dtype(np.float16), 2 * max(ne, 1) * rows * cols)
        else:
            block, size = gguf.GGML_QUANT_SIZES[ty]
            shape = (rows, cols) if not ne else (ne, rows, cols)
            w.add_tensor_info(tname, shape, np.dtype(np.float32),
                              max(ne, 1) * rows * cols // block * size, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for tname, rows, cols, ty, ne in plan:
        if ty == Q.F32:
            if tname.endswith(("bias", "sinks.weight")) or rows > 1:  # biases, sinks, routers
                data = (0.02 * rng.standard_normal(rows * cols)).astype(np.float32)
            else:
                data = np.ones(cols, dtype=np.float32)
        elif ty == Q.F16:
            # Weights of a trained model's size (about 0.02), normally distributed.
            n = max(ne, 1) * rows * cols
            data = (0.02 * rng.standard_normal(n, dtype=np.float32)).astype(np.float16)
        else:
            block, _ = gguf.GGML_QUANT_SIZES[ty]
            # A tensor at a time: the largest is a few hundred MB.
            data = random_blocks(rng, ty, max(ne, 1) * rows * cols // block)
        w.write_tensor_data(data)
        total += data.nbytes
    w.close()
    counts = {}
    for _, _, _, ty, _ in plan:
        counts[ty.name] = counts.get(ty.name, 0) + 1
    print(f"{path}: {total / 1e9:.2f} GB of tensors, {counts}", file=sys.stderr)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="files to write (default: %s)" % " ".join(DEFAULT))
    ap.add_argument("--out", type=Path, default=ROOT / ".bench/real-shapes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--list", action="store_true", help="print the default names and exit")
    ap.add_argument("--moe", action="store_true", help="the MoE files: %s" % " ".join(MOE))
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    ap.add_argument("--qwen-vocab", type=Path, metavar="OUT",
                    help="write the catalog Qwen's vocabulary alone to OUT (for QWEN_VOCAB) and exit")
    args = ap.parse_args()
    if args.qwen_vocab:
        print(write_qwen_vocab(args.qwen_vocab))
        return
    if args.list:
        print("\n".join(DEFAULT))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or (MOE if args.moe else DEFAULT):
        path = args.out / f"{name}-random.gguf"
        if path.exists() and not args.force:
            print(path)
            continue
        print(write(name, args.out, args.seed))


if __name__ == "__main__":
    main()
