#!/usr/bin/env python3
"""Tiny random-weight GGUFs of the architectures nucleus runs beyond its catalog models, and
llama.cpp's outputs for them in the golden format (../shared/golden/README.md), as test fixtures
in crates/nucleus/tests/data/arch/ (read by crates/nucleus/tests/suite/golden_models.rs).

Deterministic: the same seed gives the same bytes. Needs numpy and pyyaml (for the vendored
gguf-py) and llama.cpp built from the vendored source (scripts/build_llama_cpp.sh):

    python3 -m venv target/venv && target/venv/bin/pip install numpy pyyaml
    target/venv/bin/python scripts/make_tiny_models.py            # models and references
    target/venv/bin/python scripts/make_tiny_models.py --models   # models only
    (LLAMA_CPP_SRC=DIR: the vendored llama.cpp elsewhere than .bench/, built)

Every model: 4 layers, n_embd 64, 4 query heads of 16 sharing 2 KV heads, n_ff 128, every matrix
Q8_0 and every vector F32. Why these: a head of 16 dimensions keeps llama.cpp's f16 attention
dot products and accumulations in their scalar tail on AVX2 and AVX-512 builds alike, and Q8_0
products sum their integers and blocks the same way on both, so a reference made here (an AVX2
build) is one that nucleus's `--exact` arithmetic (which follows the AVX-512 build) can
reproduce bit for bit. The one long prompt (64+ tokens: llama.cpp's tiled flash attention, which
the two builds sum differently) is the exception, held to a tolerance (golden_models.rs).

Vocabularies: llama.cpp's own vocabulary files (models/ggml-vocab-*.gguf), cut to their first
few thousand tokens so that a fixture stays near 1 MB (the 128k-token Llama 3 vocabulary alone
would make the embedding 8.7 MB at this width): a BPE vocabulary keeps the merges whose parts and
result survive, an SPM one its scores; the special tokens the prompts use are appended.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LLAMA_CPP = Path(os.environ.get(
    "LLAMA_CPP_SRC",
    ROOT / ".bench/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp"))
if not (LLAMA_CPP / "gguf-py").exists():
    sys.exit(f"llama.cpp's vendored source is not at {LLAMA_CPP}: run scripts/build_llama_cpp.sh "
             "or set LLAMA_CPP_SRC")
sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

OUT = ROOT / "crates/nucleus/tests/data/arch"
N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 4, 64, 4, 2, 16, 128
N_GREEDY = 24
# Fixtures written in F16 and quantized by llama.cpp's llama-quantize to this mix.
QUANTIZE = {"qwen3moe-q4km": "Q4_K_M"}


def read_vocab(name):
    r = gguf.GGUFReader(LLAMA_CPP / "models" / f"ggml-vocab-{name}.gguf")

    def arr(key):
        f = r.fields.get(key)
        if f is None:
            return None
        vals = [f.parts[i] for i in f.data]
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(v).decode("utf-8") for v in vals]
        return [v.tolist()[0] for v in vals]

    return {k: arr(f"tokenizer.ggml.{k}") for k in ("tokens", "token_type", "merges", "scores")}


def cut_bpe(name, n_keep, specials):
    """The first n_keep tokens of a BPE vocabulary, its merges among them, then `specials`
    (control tokens). Returns (tokens, token_types, merges, {special: id})."""
    v = read_vocab(name)
    tokens = v["tokens"][:n_keep]
    kept = set(tokens)
    merges = [m for m in v["merges"] if all(p in kept for p in m.split(" ")) and m.replace(" ", "") in kept]
    types = [1] * len(tokens)
    ids = {}
    for s in specials:
        ids[s] = len(tokens)
        tokens.append(s)
        types.append(3)
    return tokens, types, merges, ids


def cut_spm(name, n_keep, specials):
    v = read_vocab(name)
    tokens = v["tokens"][:n_keep]
    types = v["token_type"][:n_keep]
    scores = v["scores"][:n_keep]
    ids = {}
    for s in specials:
        ids[s] = len(tokens)
        tokens.append(s)
        types.append(3)
        scores.append(0.0)
    return tokens, types, scores, ids


class Builder:
    def __init__(self, arch, seed, n_layer=N_LAYER, n_head_kv=N_HEAD_KV, f16=False):
        self.arch = arch
        # f16: every matrix F16 (Q8_0 otherwise), for llama-quantize to quantize (`QUANTIZE`).
        self.f16 = f16
        self.rng = np.random.default_rng(seed)
        self.tensors = []
        self.n_layer = n_layer
        self.n_head_kv = n_head_kv

    def matrix(self, name, rows, cols, scale=1.0, ty=Q.Q8_0, n=None):
        """A rows x cols matrix (n of them, a 3-D tensor, when n is given) of type ty."""
        shape = (rows, cols) if n is None else (n, rows, cols)
        w = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale / np.sqrt(cols))
        if self.f16 and ty == Q.Q8_0:
            ty = Q.F16
        if ty == Q.F32:
            self.tensors.append((name, w, Q.F32))
        elif ty == Q.F16:
            self.tensors.append((name, w.astype(np.float16), Q.F16))
        else:
            self.tensors.append((name, gguf.quants.quantize(w, ty), ty))

    def moe_layers(self, n_expert, n_ff_exp, qk_norm=None, types=(Q.Q8_0, Q.Q8_0, Q.Q8_0)):
        """Layers whose FFN is a mixture of n_expert experts of n_ff_exp: the router
        (ffn_gate_inp, F32 as llama-quantize leaves it) and 3-D ffn_{gate,up,down}_exps of
        the given types. qk_norm: None, "head" (per head) or "all" (over all heads, OLMoE)."""
        q_dim, kv_dim = N_HEAD * HEAD_DIM, self.n_head_kv * HEAD_DIM
        for i in range(self.n_layer):
            b = f"blk.{i}."
            self.norm(b + "attn_norm.weight", N_EMBD)
            self.matrix(b + "attn_q.weight", q_dim, N_EMBD)
            self.matrix(b + "attn_k.weight", kv_dim, N_EMBD)
            self.matrix(b + "attn_v.weight", kv_dim, N_EMBD)
            if qk_norm:
                self.norm(b + "attn_q_norm.weight", HEAD_DIM if qk_norm == "head" else q_dim)
                self.norm(b + "attn_k_norm.weight", HEAD_DIM if qk_norm == "head" else kv_dim)
            self.matrix(b + "attn_output.weight", N_EMBD, q_dim)
            self.norm(b + "ffn_norm.weight", N_EMBD)
            self.matrix(b + "ffn_gate_inp.weight", n_expert, N_EMBD, scale=2.0, ty=Q.F32)
            self.matrix(b + "ffn_gate_exps.weight", n_ff_exp, N_EMBD, ty=types[0], n=n_expert)
            self.matrix(b + "ffn_up_exps.weight", n_ff_exp, N_EMBD, ty=types[1], n=n_expert)
            self.matrix(b + "ffn_down_exps.weight", N_EMBD, n_ff_exp, ty=types[2], n=n_expert)
        self.norm("output_norm.weight", N_EMBD)

    def gpt_oss_layers(self, n_expert, n_ff_exp, exp_types):
        """gpt-oss's layers (llama_model_openai_moe::load_arch_tensors): q/k/v/o with biases,
        a sink logit per head, the norm before the FFN named post_attention_norm, a biased F32
        router and biased experts; exp_types[i]: layer i's (gate, up, down) expert types."""
        q_dim, kv_dim = N_HEAD * HEAD_DIM, self.n_head_kv * HEAD_DIM
        for i in range(self.n_layer):
            b = f"blk.{i}."
            self.norm(b + "attn_norm.weight", N_EMBD)
            for name, rows in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
                self.matrix(b + name + ".weight", rows, N_EMBD)
                self.bias(b + name + ".bias", rows)
            self.matrix(b + "attn_output.weight", N_EMBD, q_dim)
            self.bias(b + "attn_output.bias", N_EMBD)
            # Sinks around the scores' size, so that some heads' sink outweighs their keys.
            self.bias(b + "attn_sinks.weight", N_HEAD, scale=2.0)
            self.norm(b + "post_attention_norm.weight", N_EMBD)
            self.matrix(b + "ffn_gate_inp.weight", n_expert, N_EMBD, scale=2.0, ty=Q.F32)
            self.bias(b + "ffn_gate_inp.bias", n_expert, scale=1.0)
            tg, tu, td = exp_types[i]
            self.matrix(b + "ffn_gate_exps.weight", n_ff_exp, N_EMBD, scale=2.0, ty=tg, n=n_expert)
            self.matrix(b + "ffn_up_exps.weight", n_ff_exp, N_EMBD, scale=2.0, ty=tu, n=n_expert)
            self.matrix(b + "ffn_down_exps.weight", N_EMBD, n_ff_exp, ty=td, n=n_expert)
            for name, rows in (("gate", n_ff_exp), ("up", n_ff_exp), ("down", N_EMBD)):
                w = (0.5 * self.rng.standard_normal((n_expert, rows))).astype(np.float32)
                self.tensors.append((b + f"ffn_{name}_exps.bias", w, Q.F32))
        self.norm("output_norm.weight", N_EMBD)

    def bias(self, name, n, scale=0.2):
        w = (scale * self.rng.standard_normal(n)).astype(np.float32)
        self.tensors.append((name, w, Q.F32))

    def norm(self, name, n):
        w = (1.0 + 0.2 * self.rng.standard_normal(n)).astype(np.float32)
        self.tensors.append((name, w, Q.F32))

    def embedding(self, n_vocab):
        w = self.rng.standard_normal((n_vocab, N_EMBD), dtype=np.float32) * np.float32(0.4)
        if self.f16:
            self.tensors.append(("token_embd.weight", w.astype(np.float16), Q.F16))
        else:
            self.tensors.append(("token_embd.weight", gguf.quants.quantize(w, Q.Q8_0), Q.Q8_0))

    def layers(self, fused_qkv=False, fused_up=False, qk_norm=False, post_norms=False):
        q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
        for i in range(N_LAYER):
            b = f"blk.{i}."
            self.norm(b + "attn_norm.weight", N_EMBD)
            if fused_qkv:
                self.matrix(b + "attn_qkv.weight", q_dim + 2 * kv_dim, N_EMBD)
            else:
                self.matrix(b + "attn_q.weight", q_dim, N_EMBD)
                self.matrix(b + "attn_k.weight", kv_dim, N_EMBD)
                self.matrix(b + "attn_v.weight", kv_dim, N_EMBD)
            if qk_norm:
                self.norm(b + "attn_q_norm.weight", HEAD_DIM)
                self.norm(b + "attn_k_norm.weight", HEAD_DIM)
            self.matrix(b + "attn_output.weight", N_EMBD, q_dim)
            if post_norms:
                self.norm(b + "post_attention_norm.weight", N_EMBD)
            self.norm(b + "ffn_norm.weight", N_EMBD)
            if fused_up:
                self.matrix(b + "ffn_up.weight", 2 * N_FF, N_EMBD)
            else:
                self.matrix(b + "ffn_gate.weight", N_FF, N_EMBD)
                self.matrix(b + "ffn_up.weight", N_FF, N_EMBD)
            self.matrix(b + "ffn_down.weight", N_EMBD, N_FF)
            if post_norms:
                self.norm(b + "post_ffw_norm.weight", N_EMBD)
        self.norm("output_norm.weight", N_EMBD)

    def write(self, path, kv, vocab):
        w = gguf.GGUFWriter(str(path), self.arch)
        a = self.arch
        w.add_name(f"tiny-{path.stem}")
        w.add_uint32(f"{a}.block_count", self.n_layer)
        w.add_uint32(f"{a}.context_length", 4096)
        w.add_uint32(f"{a}.embedding_length", N_EMBD)
        if "feed_forward_length" not in kv:
            w.add_uint32(f"{a}.feed_forward_length", N_FF)
        w.add_uint32(f"{a}.attention.head_count", N_HEAD)
        w.add_uint32(f"{a}.attention.head_count_kv", self.n_head_kv)
        w.add_uint32(f"{a}.rope.dimension_count", HEAD_DIM)
        w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
        w.add_uint32("general.file_type", 7)  # mostly Q8_0
        for key, value in kv.items():
            full = f"{a}.{key}"
            if value is None:
                continue
            if key == "chat_template":
                w.add_chat_template(value)
            elif isinstance(value, str):
                w.add_string(full, value)
            elif isinstance(value, float):
                w.add_float32(full, value)
            else:
                w.add_uint32(full, value)
        for key, value in vocab.items():
            full = f"tokenizer.ggml.{key}"
            if isinstance(value, str):
                w.add_string(full, value)
            elif isinstance(value, bool):
                w.add_bool(full, value)
            elif isinstance(value, int):
                w.add_uint32(full, value)
            elif key in ("tokens", "merges"):
                w.add_array(full, value)
            elif key == "scores":
                w.add_array(full, [float(s) for s in value])
            else:
                w.add_array(full, [int(t) for t in value])
        for name, data, ty in self.tensors:
            w.add_tensor(name, data, raw_dtype=ty)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def bpe_vocab(name, pre, specials, bos, eos, add_bos):
    tokens, types, merges, ids = cut_bpe(name, 3000, specials)
    v = {"model": "gpt2", "pre": pre, "tokens": tokens, "token_type": types, "merges": merges,
         "eos_token_id": ids[eos], "add_bos_token": add_bos}
    if bos:
        v["bos_token_id"] = ids[bos]
    return v, len(tokens)


def spm_vocab(specials, eos=2):
    tokens, types, scores, ids = cut_spm("phi-3", 4000, specials)
    v = {"model": "llama", "pre": "default", "tokens": tokens, "scores": scores, "token_type": types,
         "bos_token_id": 1, "eos_token_id": ids.get(eos, eos), "unknown_token_id": 0,
         "add_bos_token": True, "add_eos_token": False}
    return v, len(tokens)


PROSE = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog, and then it runs back home again.",
    "Once upon a time, in a land far away, there lived a king who had three daughters.",
    "int main() { return 0; } // 12345 + 678 = 13023",
    # Over 64 tokens: the prompt goes through llama.cpp's tiled flash attention.
    "Once upon a time, in a land far away, there lived a king who had three daughters. The eldest "
    "was wise, the second was brave, and the youngest could speak with the birds of the forest "
    "and the fish of the river, which made her father proud and worried at once.",
]


def models():
    """(file stem, builder, metadata, vocabulary, prompts with add_special)."""
    out = []

    # Llama 3.x: the llama architecture with the llama-bpe vocabulary (tiktoken-style BPE,
    # ignore_merges, BOS added), its rope_freqs tensor and a 500k RoPE base.
    b = Builder("llama", 301)
    voc, nv = bpe_vocab("llama-bpe", "llama-bpe",
                        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                         "<|end_header_id|>", "<|eot_id|>"],
                        "<|begin_of_text|>", "<|end_of_text|>", True)
    b.embedding(nv)
    b.layers()
    b.tensors.append(("rope_freqs.weight",
                      np.array([1.0, 1.0, 1.0, 1.5, 2.0, 4.0, 8.0, 8.0], dtype=np.float32), Q.F32))
    chat = "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    out.append(("llama3-bpe", b, {"rope.freq_base": 500000.0}, voc,
                [(p, True) for p in PROSE] + [(chat, True)]))

    # SmolLM2: the llama architecture with a GPT-2 style vocabulary whose pre-tokenizer is
    # "smollm" (digits one by one, no BOS added by default).
    b = Builder("llama", 302)
    voc, nv = bpe_vocab("llama-bpe", "smollm", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                        "<|im_start|>", "<|im_end|>", False)
    b.embedding(nv)
    b.layers()
    chat = "<|im_start|>user\nCount: 1 22 333 4444 55555<|im_end|>\n<|im_start|>assistant\n"
    out.append(("smollm2", b, {"rope.freq_base": 100000.0}, voc,
                [(p, False) for p in PROSE] + [(chat, False)]))

    # Qwen3: per-head RMS norms of q and k before RoPE, no q/k/v biases, NeoX RoPE.
    b = Builder("qwen3", 303)
    voc, nv = bpe_vocab("qwen2", "qwen2", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                        "<|endoftext|>", "<|im_end|>", False)
    b.embedding(nv)
    b.layers(qk_norm=True)
    b.matrix("output.weight", nv, N_EMBD)
    chat = "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"
    out.append(("qwen3", b, {"rope.freq_base": 1000000.0}, voc,
                [(p, False) for p in PROSE] + [(chat, False)]))

    # Gemma 2: soft-capped attention and output logits, post-attention and post-FFN norms,
    # every other layer a sliding window (8 here, shorter than the prompts), GELU FFN,
    # embeddings times sqrt(n_embd), queries scaled by query_pre_attn_scalar^-1/2 before
    # attention. Small caps so that tanh bends the values.
    b = Builder("gemma2", 304)
    voc, nv = spm_vocab(["<start_of_turn>", "<end_of_turn>"])
    b.embedding(nv)
    b.layers(post_norms=True)
    out.append(("gemma2", b, {"attention.sliding_window": 8, "attn_logit_softcapping": 5.0,
                              "final_logit_softcapping": 15.0,
                              "attention.key_length": HEAD_DIM, "attention.value_length": HEAD_DIM},
                voc, [(p, True) for p in PROSE]))

    # Phi-3: q, k and v in one matrix (attn_qkv), gate and up in one (ffn_up, gate first),
    # NeoX RoPE, queries scaled before attention. Its sliding window is in the metadata, and
    # llama.cpp ignores it (llama_model_phi3::load_arch_hparams: "Phi SWA is currently
    # disabled"), so nucleus does.
    b = Builder("phi3", 305)
    voc, nv = spm_vocab(["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>"], eos="<|endoftext|>")
    b.embedding(nv)
    b.layers(fused_qkv=True, fused_up=True)
    b.matrix("output.weight", nv, N_EMBD)
    chat = "<|user|>\nWhat is the capital of France?<|end|>\n<|assistant|>\n"
    out.append(("phi3", b, {"attention.sliding_window": 8, "rope.freq_base": 10000.0,
                            "rope.scaling.original_context_length": 4096}, voc,
                [(p, True) for p in PROSE] + [(chat, True)]))

    # Mistral 7B v0.1 style: the llama architecture with a sliding window of 8 in the metadata.
    # llama.cpp's llama architecture reads no sliding window (llama_model_llama::
    # load_arch_hparams), so every layer attends to the whole context; nucleus matches it.
    b = Builder("llama", 306)
    voc, nv = spm_vocab([])
    b.embedding(nv)
    b.layers()
    b.matrix("output.weight", nv, N_EMBD)
    out.append(("mistral-swa", b, {"attention.sliding_window": 8, "rope.freq_base": 10000.0}, voc,
                [(p, True) for p in PROSE]))

    # Mixtures of experts (llama.cpp's build_moe_ffn, softmax gating): 3 layers of 8 experts,
    # 2 used per token, the router F32. Their expert tensors mix Q8_0 with F16, which
    # llama.cpp's mul_mat_id computes row by row with its one-row kernels.
    #
    # Qwen3-MoE: Qwen3's attention, experts of expert_feed_forward_length (32, not the
    # feed_forward_length of 128), top-2 weights renormalised.
    b = Builder("qwen3moe", 307, n_layer=3)
    voc, nv = bpe_vocab("qwen2", "qwen2", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                        "<|endoftext|>", "<|im_end|>", False)
    b.embedding(nv)
    b.moe_layers(8, 32, qk_norm="head", types=(Q.Q8_0, Q.Q8_0, Q.F16))
    b.matrix("output.weight", nv, N_EMBD)
    chat = "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"
    out.append(("qwen3moe", b, {"rope.freq_base": 1000000.0, "expert_count": 8,
                                "expert_used_count": 2, "expert_feed_forward_length": 32}, voc,
                [(p, False) for p in PROSE] + [(chat, False)]))

    # Qwen3-MoE as llama-quantize's Q4_K_M writes it (QUANTIZE): experts of 256, so that the
    # expert down projections are whole 256-blocks (Q4_K, and Q6_K in the layers its
    # use_more_bits picks), every 64-wide matrix in its fallbacks (Q5_0, Q8_0); written in F16
    # and quantized by llama-quantize itself. The expert types of the real Q4_K_M files.
    b = Builder("qwen3moe", 311, n_layer=3, f16=True)
    voc, nv = bpe_vocab("qwen2", "qwen2", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                        "<|endoftext|>", "<|im_end|>", False)
    b.embedding(nv)
    b.moe_layers(8, 256, qk_norm="head")
    b.matrix("output.weight", nv, N_EMBD)
    out.append(("qwen3moe-q4km", b, {"rope.freq_base": 1000000.0, "expert_count": 8,
                                     "expert_used_count": 2, "expert_feed_forward_length": 256},
                voc, [(p, False) for p in PROSE]))

    # Mixtral: the llama architecture with experts (ffn_gate_inp, ffn_*_exps) of
    # feed_forward_length, top-2 weights renormalised.
    b = Builder("llama", 308, n_layer=3)
    voc, nv = spm_vocab([])
    b.embedding(nv)
    b.moe_layers(8, 64, types=(Q.F16, Q.Q8_0, Q.Q8_0))
    b.matrix("output.weight", nv, N_EMBD)
    out.append(("mixtral", b, {"rope.freq_base": 1000000.0, "feed_forward_length": 64,
                               "expert_count": 8, "expert_used_count": 2}, voc,
                [(p, True) for p in PROSE]))

    # OLMoE: no GQA (llama.cpp's olmoe shapes k like q), RMS norms of q and k over all heads,
    # NeoX RoPE, top-2 weights as the softmax gives them (not renormalised).
    b = Builder("olmoe", 309, n_layer=3, n_head_kv=N_HEAD)
    voc, nv = bpe_vocab("gpt-2", "olmo", ["<|endoftext|>", "<|padding|>"],
                        None, "<|endoftext|>", False)
    b.embedding(nv)
    b.moe_layers(8, 64, qk_norm="all")
    b.matrix("output.weight", nv, N_EMBD)
    out.append(("olmoe", b, {"rope.freq_base": 10000.0, "feed_forward_length": 64,
                             "expert_count": 8, "expert_used_count": 2}, voc,
                [(p, False) for p in PROSE]))

    # gpt-oss (llama.cpp's openai-moe): 8 experts of 64, 4 used, chosen by their biased logits
    # and weighed by the softmax of the chosen ones (not of all), biased experts with the
    # clamped SwiGLU, MXFP4 experts (one layer's gate Q8_0), attention sinks, a sliding window
    # of 8 on the even layers, YaRN (factor 32 over 4096 positions, as gpt-oss's). Harmony's
    # special tokens; the vocabulary is Llama 3's cut, pre-tokenized as gpt-4o (o200k's).
    b = Builder("gpt-oss", 310, n_layer=3)
    voc, nv = bpe_vocab("llama-bpe", "gpt-4o",
                        ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                         "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"],
                        "<|startoftext|>", "<|return|>", False)
    b.embedding(nv)
    b.gpt_oss_layers(8, 64, [(Q.Q8_0, Q.MXFP4, Q.MXFP4), (Q.MXFP4, Q.MXFP4, Q.MXFP4),
                             (Q.MXFP4, Q.MXFP4, Q.MXFP4)])
    b.matrix("output.weight", nv, N_EMBD)
    template = (LLAMA_CPP / "models/templates/openai-gpt-oss-120b.jinja").read_text()
    chat = ("<|start|>system<|message|>You are ChatGPT.<|end|><|start|>user<|message|>"
            "What is 2+2?<|end|><|start|>assistant")
    out.append(("gpt-oss", b, {"rope.freq_base": 150000.0, "expert_count": 8,
                               "expert_used_count": 4, "expert_feed_forward_length": 64,
                               "attention.sliding_window": 8, "rope.scaling.type": "yarn",
                               "rope.scaling.factor": 32.0,
                               "rope.scaling.original_context_length": 4096,
                               "chat_template": template}, voc,
                [(p, False) for p in PROSE] + [(chat, False)]))
    return out


def build_dumper():
    exe = ROOT / ".bench/golden_dump"
    src = ROOT / "scripts/golden_dump.cpp"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        exe.parent.mkdir(exist_ok=True)
        subprocess.run(["g++", "-O2", "-std=c++17", str(src), f"-I{LLAMA_CPP}/include",
                        f"-I{LLAMA_CPP}/ggml/include", f"-L{LLAMA_CPP}/build/bin", "-lllama", "-lggml",
                        "-lggml-base", f"-Wl,-rpath,{LLAMA_CPP}/build/bin", "-o", str(exe)], check=True)
    return exe


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", action="store_true", help="write the GGUFs only")
    ap.add_argument("only", nargs="*", help="file stems to make (default: all)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    dumper = None if args.models else build_dumper()
    for stem, b, kv, voc, prompts in models():
        if args.only and stem not in args.only:
            continue
        path = OUT / f"{stem}.gguf"
        b.write(path, kv, voc)
        if stem in QUANTIZE:
            f16 = path.with_suffix(".f16.gguf")
            path.rename(f16)
            subprocess.run([str(LLAMA_CPP / "build/bin/llama-quantize"), str(f16), str(path),
                            QUANTIZE[stem]], check=True, capture_output=True)
            f16.unlink()
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size} bytes")
        if dumper:
            plist = OUT / f"{stem}.prompts.jsonl"
            plist.write_text("".join(json.dumps({"prompt": p, "add_special": s}) + "\n" for p, s in prompts))
            # A greedy text may end inside a UTF-8 sequence (byte tokens): invalid bytes become
            # U+FFFD, as nucleus's decode (Rust's from_utf8_lossy) makes them.
            res = subprocess.run([str(dumper), str(path), str(plist), str(N_GREEDY)],
                                 stdout=subprocess.PIPE, check=True)
            (OUT / f"{stem}.jsonl").write_text(res.stdout.decode("utf-8", errors="replace"))
            plist.unlink()


if __name__ == "__main__":
    main()
