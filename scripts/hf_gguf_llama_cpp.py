"""llama.cpp on the GGUF files `nucleus quantize DIR OUT TYPE` writes from the tiny checkpoints
of crates/nucleus/tests/data/hf (and from their tokenizer.json with Llama 3's, Qwen2's and
SmolLM's pre-tokenizers swapped in). Run by scripts/hf_gguf_llama_cpp.sh; not CI.

For each written file:
- token ids of TEXTS (BOS as the vocabulary adds it, special-token text parsed): the Hugging
  Face `tokenizers` library on the checkpoint's tokenizer.json (what transformers' fast tokenizer
  runs), llama.cpp's llama-tokenize on the file, and `nucleus tokenize` on the file;
- for each of PROMPTS, llama.cpp's prompt ids, greedy tokens and logits (scripts/golden_dump.cpp)
  against `nucleus run --exact` on the same file: the greedy tokens, and the largest difference
  of the top-8 log-probabilities along the shared greedy path;
- for the four committed checkpoints, llama.cpp's prompt ids and greedy tokens against what
  transformers computed on the checkpoint (reference.json).
"""

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tokenizers

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "crates/nucleus/tests/data/hf"

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def main():\n    return 42\n",
    "  spaces,\ttabs and numbers 12345 67 ",
    "héllo wörld ✓ 日本語 🤖",
    "It's 'quoted', isn't it? DON'T!",
    "a\n\n\nb\r\nc",
    "3 33 333 3333 33333 3.14",
    "<|im_start|>user\nhi<|im_end|>",
    "This License applies to any program or other work which contains a notice",
]
PROMPTS = ["The quick brown fox", "def main():\n    return", "This License applies to any program"]
N_GREEDY = 12

LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def split_then_bytes(regex):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def llama3(tj):
    tj["pre_tokenizer"] = split_then_bytes(LLAMA3)
    tj["model"]["ignore_merges"] = True


def qwen2(tj):
    tj["pre_tokenizer"] = split_then_bytes(QWEN2)
    tj["normalizer"] = {"type": "NFC"}


def smollm(tj):
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


# (name, weights from, tokenizer from, tokenizer.json edit, type written, transformers reference)
CASES = [
    ("llama-f32", "llama-f32", "llama-f32", None, "F32", "llama-f32"),
    ("llama-f32 Q8_0", "llama-f32", "llama-f32", None, "Q8_0", None),
    ("llama-bf16", "llama-bf16", "llama-bf16", None, "BF16", "llama-bf16"),
    ("qwen2-f32", "qwen2-f32", "qwen2-f32", None, "F32", "qwen2-f32"),
    ("qwen2-bf16", "qwen2-bf16", "qwen2-bf16", None, "BF16", "qwen2-bf16"),
    ("spm (llama-bf16 weights)", "llama-bf16", "spm-tokenizer", None, "BF16", None),
    ("llama-bpe pre (llama-f32)", "llama-f32", "llama-f32", llama3, "F32", None),
    ("qwen2 pre (qwen2-f32)", "qwen2-f32", "qwen2-f32", qwen2, "F32", None),
    ("smollm pre (qwen2-f32)", "qwen2-f32", "qwen2-f32", smollm, "F32", None),
]


def run(cmd, **kw):
    # errors="replace": a random model's greedy text may end inside a character.
    p = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace", **kw)
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{p.stderr}")
    return p.stdout


def make_checkpoint(tmp, weights, tok, edit):
    d = tmp / "ckpt"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for f in ["config.json", "model.safetensors"]:
        shutil.copy(DATA / weights / f, d / f)
    for f in ["tokenizer_config.json", "chat_template.jinja"]:
        if (DATA / tok / f).exists():
            shutil.copy(DATA / tok / f, d / f)
    tj = json.loads((DATA / tok / "tokenizer.json").read_text())
    if edit:
        edit(tj)
    (d / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    return d


def llama_tokenize(bin_dir, gguf, text):
    out = run([bin_dir / "llama-tokenize", "-m", gguf, "--stdin", "--no-escape", "--ids",
               "--log-disable"], input=text)
    return json.loads(out.strip().splitlines()[-1])


def logprobs(top, logsumexp):
    return {i: l - logsumexp for i, l in top}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nucleus", required=True)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp's build/bin")
    ap.add_argument("--dump", required=True, help="golden_dump built from scripts/golden_dump.cpp")
    args = ap.parse_args()
    bin_dir = Path(args.llama_cpp)
    reference = json.loads((DATA / "reference.json").read_text())
    tmp = Path(tempfile.mkdtemp())
    rows = []
    try:
        for name, weights, tok_from, edit, ty, ref in CASES:
            d = make_checkpoint(tmp, weights, tok_from, edit)
            gguf = tmp / "out.gguf"
            run([args.nucleus, "quantize", d, gguf, ty, "-t", "1"])
            meta_pre = "?"
            hf = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
            tok_same = tok_total = 0
            for text in TEXTS:
                want = hf.encode(text, add_special_tokens=True).ids
                lc = llama_tokenize(bin_dir, gguf, text)
                nu = json.loads(run([args.nucleus, "tokenize", gguf, text, "--add-special"]))
                tok_total += 1
                if lc == want and nu == want:
                    tok_same += 1
                else:
                    print(f"  {name}: {text!r}: tokenizers {want}, llama.cpp {lc}, nucleus {nu}")

            prompts = list(PROMPTS)
            if ref:
                prompts = [c["prompt"] for c in reference["checkpoints"][ref]["cases"]]
            (tmp / "prompts.jsonl").write_text("".join(
                json.dumps({"prompt": p, "add_special": True}, ensure_ascii=False) + "\n"
                for p in prompts))
            dumped = [json.loads(l) for l in run([args.dump, gguf, tmp / "prompts.jsonl",
                                                   str(N_GREEDY)]).splitlines()]
            greedy_same = 0
            worst = 0.0
            ref_ids = ref_greedy = 0
            for k, (p, lc) in enumerate(zip(prompts, dumped)):
                nu = json.loads(run([args.nucleus, "run", gguf, p, "--json", "--exact",
                                     "--temperature", "0", "--ignore-eos", "-n", str(N_GREEDY),
                                     "--logprobs", "8", "-t", "1"]))
                if nu["prompt_tokens"] != lc["tokens"]:
                    print(f"  {name}: prompt {p!r}: llama.cpp {lc['tokens']}, nucleus {nu['prompt_tokens']}")
                n = len(lc["greedy_tokens"])
                if nu["tokens"][:n] == lc["greedy_tokens"]:
                    greedy_same += 1
                else:
                    print(f"  {name}: greedy of {p!r}: llama.cpp {lc['greedy_tokens']}, nucleus {nu['tokens'][:n]}")
                # Distributions along the shared greedy path.
                rows_lc = [lc["prompt_logits"][-1]] + lc["greedy_steps"]
                for j in range(n):
                    if nu["tokens"][j] != lc["greedy_tokens"][j]:
                        break
                    step = rows_lc[j]
                    theirs = logprobs(step["top"], step["logsumexp"])
                    ours = {t["token"]: t["logprob"] for t in nu["logprobs"][j]["top_logprobs"]}
                    for i in theirs.keys() & ours.keys():
                        worst = max(worst, abs(theirs[i] - ours[i]))
                if ref:
                    case = reference["checkpoints"][ref]["cases"][k]
                    ref_ids += lc["tokens"] == case["ids"]
                    ref_greedy += lc["greedy_tokens"] == case["greedy"][:n]
                    if lc["greedy_tokens"] != case["greedy"][:n]:
                        # Where they part, and transformers' own top-2 margin there.
                        at = next(j for j, (a, b) in enumerate(zip(lc["greedy_tokens"], case["greedy"])) if a != b)
                        top = case["top"][len(case["ids"]) - 1 + at]
                        print(f"  {name}: greedy of {p!r} parts from transformers' at token {at} "
                              f"(transformers' top-2 margin there {top[0][1] - top[1][1]:.4f}): "
                              f"llama.cpp {lc['greedy_tokens']}, transformers {case['greedy']}")
            rows.append((name, ty, f"{tok_same}/{tok_total}", f"{greedy_same}/{len(prompts)}",
                         f"{worst:.2e}",
                         f"{ref_ids}/{len(prompts)}, {ref_greedy}/{len(prompts)}" if ref else "-"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| checkpoint | written as | texts: tokenizers = llama.cpp = nucleus | greedy: llama.cpp = nucleus "
          "| largest top-8 logprob gap | llama.cpp vs transformers: prompt ids, greedy |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
