"""nucleus against Hugging Face transformers on tiny random checkpoints that transformers makes.

  scripts/hf_vs_transformers.sh            (makes the venv, then runs this)

1. Trains a tiny byte-level BPE tokenizer (the `tokenizers` package) on ../shared/corpus.
2. Has transformers create a random LlamaForCausalLM (untied, Llama 3.1's RoPE scaling, BOS
   added by the tokenizer) and a random Qwen2ForCausalLM (tied embeddings, q/k/v biases, no
   BOS), both with grouped-query attention, seeded, weights drawn wider than the default init so the logits are spread out
   (greedy choices are then far from ties), and saves each twice: F32 and BF16.
3. For each prompt: the ids transformers' tokenizer gives (with special tokens), the logits at
   every position of prompt + greedy continuation (one forward in float32; for the BF16
   checkpoints, of the BF16 weights widened to float32, which is what nucleus computes with),
   and the greedy continuation from `generate`.
4. Runs nucleus on each directory (`cargo run --example hf_logits`, the library's own loader,
   tokenizer and forward) and `nucleus run DIR --json --temperature 0` (the command line), and
   prints a markdown table: max |logit difference| over every position and vocabulary entry,
   token ids equal, greedy tokens identical. Two runs may part only where transformers' own
   top-2 margin is below twice the tolerance (a near-tie the arithmetic's error can flip); the
   script fails on any other parting, a gap above the tolerance or different ids.
5. Checks a SentencePiece-style tokenizer.json (Llama 2's kind: "▁", byte fallback) on the
   llama weights: `nucleus tokenize DIR TEXT --add-special` against transformers' ids.
6. With --write-fixtures DIR, writes the checkpoints and a reference JSON (ids, greedy tokens
   and each position's top logits; the ids of a chat prompt from apply_chat_template) there, for the Rust test `tests/suite/hf_checkpoint.rs`.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from tokenizers import (Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen2ForCausalLM)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "..", "shared", "corpus")
PROMPTS = [
    "The quick brown fox",
    "def main():\n    return",
    "This License applies to any program",
    "  spaces,\ttabs and numbers 12345 ",
]
GREEDY = 12
CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What does <|im_end|> mean?"}]
# Largest logit gap accepted, per weight type. nucleus computes as llama.cpp does: keys and
# values stored as f16 with f16 accumulation in attention (2^-11 relative), and for BF16
# matrices the activations rounded to BF16 (2^-9 relative); transformers computes in f32. The
# logits here reach about 5; the gaps measured are at most half of these.
TOLERANCE = {"f32": 0.03, "bf16": 0.15}
TOP_K = 8
VOCAB = 384
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def train_tokenizer(with_bos):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    files = [os.path.join(CORPUS, f) for f in ("gpl-3.txt", "python-stdlib.txt")]
    tok.train(files, trainer)
    if with_bos:
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>" if with_bos else None,
        eos_token="<|im_end|>" if not with_bos else "<|endoftext|>", chat_template=TEMPLATE)


def train_spm_tokenizer():
    """A SentencePiece-style tokenizer.json as Llama 2's: "▁" for spaces, byte fallback."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tok.train([os.path.join(CORPUS, "gpl-3.txt")],
              trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


SPM_TEXTS = PROMPTS + ["héllo wörld ✓ 日本", "<s> a</s>b"]


def check_spm(work, llama_dir):
    """The SentencePiece-style tokenizer on the llama checkpoint's weights: ids of
    `nucleus tokenize DIR TEXT --add-special` against transformers'."""
    tok = train_spm_tokenizer()
    d = os.path.join(work, "llama-spm")
    shutil.copytree(llama_dir, d)
    for f in os.listdir(d):
        if f.startswith("tokenizer") or f.endswith(".jinja"):
            os.remove(os.path.join(d, f))
    tok.save_pretrained(d)
    cases, same = [], 0
    for text in SPM_TEXTS:
        want = tok(text, add_special_tokens=True)["input_ids"]
        out = subprocess.run([os.path.join(ROOT, "target", "release", "nucleus"), "tokenize", d,
                              text, "--add-special"], check=True, capture_output=True, text=True)
        same += json.loads(out.stdout) == want
        cases.append({"text": text, "ids": want})
    return d, cases, same


def make_model(family, vocab):
    torch.manual_seed(1234 if family == "llama" else 5678)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, initializer_range=0.15)
    if family == "llama":
        # Llama 3.1's RoPE scaling, with an original context short enough that all three of its
        # regimes (unscaled, smoothed, scaled) occur among 8 frequency pairs.
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
        cfg = LlamaConfig(tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                          rope_parameters=rope, **common)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen2Config(tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                          **common)
        model = Qwen2ForCausalLM(cfg)
    # Norm weights and biases away from their ones/zeros, so that loading them is tested.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
    return model.float().eval()


@torch.no_grad()
def reference(model, tok):
    cases = []
    for prompt in PROMPTS:
        ids = tok(prompt, add_special_tokens=True)["input_ids"]
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=GREEDY,
                             do_sample=False, pad_token_id=0, eos_token_id=None)
        greedy = out[0, len(ids):].tolist()
        path = ids + greedy
        logits = model(torch.tensor([path])).logits[0].float()
        cases.append({"prompt": prompt, "ids": ids, "greedy": greedy, "logits": logits})
    return cases


def save(model, tok, out_dir, dtype):
    m = model.to(dtype)
    m.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    model.float()


def chat_ids(tok):
    """transformers' chat prompt: the template rendered, then encoded without special tokens
    added (apply_chat_template's own rule)."""
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def first_split(ours, theirs):
    """The first step where two greedy runs differ (None if they never do)."""
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return k
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def run_nucleus(ck_dir, ref_path, out_path):
    subprocess.run(["nice", "-n", "19", "cargo", "run", "--release", "-q", "-p", "nucleus",
                    "--example", "hf_logits", "--", ck_dir, ref_path, out_path],
                   cwd=ROOT, check=True)
    with open(out_path) as f:
        return json.load(f)


def cli_greedy(ck_dir, prompt):
    out = subprocess.run([os.path.join(ROOT, "target", "release", "nucleus"), "run", ck_dir, prompt,
                          "--json", "--temperature", "0", "-n", str(GREEDY), "--ignore-eos"],
                         cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-fixtures", help="directory for the CI fixtures")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hf-vs-transformers-")
    rows, failures = [], []
    fixtures = {}
    try:
        for family in ("llama", "qwen2"):
            tok = train_tokenizer(with_bos=family == "llama")
            model = make_model(family, len(tok))
            for dtype_name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
                name = f"{family}-{dtype_name}"
                ck = os.path.join(work, name)
                save(model, tok, ck, dtype)
                # The reference computes in float32 with the weights as saved.
                ref_model = model.to(dtype).float()
                cases = reference(ref_model, tok)
                model.float()
                ref_path = os.path.join(work, name + ".ref.json")
                with open(ref_path, "w") as f:
                    json.dump([{k: c[k] for k in ("prompt", "ids", "greedy")} for c in cases], f)
                got = run_nucleus(ck, ref_path, os.path.join(work, name + ".nucleus.json"))
                tol = TOLERANCE[dtype_name]
                max_diff, ids_ok, same, cli_same, parted, bad = 0.0, 0, 0, 0, [], []
                for c, g in zip(cases, got):
                    ours = torch.tensor(g["logits"]).reshape(c["logits"].shape)
                    max_diff = max(max_diff, (ours - c["logits"]).abs().max().item())
                    ids_ok += g["ids"] == c["ids"]
                    top2 = c["logits"].topk(2, dim=-1).values
                    margins = (top2[:, 0] - top2[:, 1])[len(c["ids"]) - 1:].tolist()
                    for tokens, counter in ((g["greedy"], "lib"), (None, "cli")):
                        if tokens is None:
                            cli = cli_greedy(ck, c["prompt"])
                            tokens = cli["tokens"] if cli["prompt_tokens"] == c["ids"] else []
                        k = first_split(tokens, c["greedy"])
                        if k is None:
                            if counter == "lib":
                                same += 1
                            else:
                                cli_same += 1
                        elif margins[k] < 2 * tol:
                            if counter == "lib":
                                parted.append(f"{margins[k]:.4f}")
                        else:
                            bad.append((c["prompt"], counter, k, margins[k]))
                n = len(cases)
                if max_diff > tol or ids_ok != n:
                    bad.append(("logits or ids", max_diff, ids_ok))
                failures.extend((name, b) for b in bad)
                rows.append((name, f"{max_diff:.2e}", f"{tol}", f"{ids_ok}/{n}", f"{same}/{n}",
                             ", ".join(parted) or "-", f"{cli_same}/{n}"))
                fixtures[name] = {"cases": [{
                    "prompt": c["prompt"], "ids": c["ids"], "greedy": c["greedy"],
                    "top": [[[int(i), round(float(v), 6)] for v, i in zip(*row.topk(TOP_K))]
                            for row in c["logits"]],
                } for c in cases], "chat": {"messages": CHAT, "ids": chat_ids(tok)}}
                if args.write_fixtures:
                    dest = os.path.join(args.write_fixtures, name)
                    shutil.rmtree(dest, ignore_errors=True)
                    shutil.copytree(ck, dest)
        spm_dir, spm_cases, spm_same = check_spm(work, os.path.join(work, "llama-bf16"))
        if spm_same != len(spm_cases):
            failures.append(("SentencePiece-style tokenizer.json", spm_same))
        print("| checkpoint | max abs logit diff | tolerance | prompt ids equal | greedy identical "
              "| parted at a near-tie (transformers' top-2 margin there) "
              "| `nucleus run` greedy identical |")
        print("|---|---:|---:|---:|---:|---|---:|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        print(f"\nSentencePiece-style tokenizer.json (byte fallback): ids equal to transformers' "
              f"for {spm_same}/{len(spm_cases)} texts")
        for f in failures:
            print("FAILED:", f)
        if args.write_fixtures:
            dest = os.path.join(args.write_fixtures, "spm-tokenizer")
            shutil.rmtree(dest, ignore_errors=True)
            os.makedirs(dest)
            for f in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(os.path.join(spm_dir, f), dest)
            with open(os.path.join(args.write_fixtures, "reference.json"), "w") as f:
                json.dump({"transformers": __import__("transformers").__version__,
                           "torch": torch.__version__, "greedy": GREEDY, "checkpoints": fixtures,
                           "spm_tokenizer": spm_cases},
                          f, separators=(",", ":"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
