#!/usr/bin/env bash
# Peak RSS of `nucleus quantize DIR OUT Q8_0` and `nucleus run DIR` on a random llama checkpoint
# of 362 MiB of F32 tensors (1024 wide, 8 layers, the tiny fixtures' tokenizer), written to a
# temporary directory with the standard library only. Not used by CI.
#
#   scripts/hf_memory.sh [NUCLEUS_BIN...]      (default ./target/release/nucleus)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- ./target/release/nucleus
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nice -n 19 python3 - "$tmp/ckpt" <<'PY'
import array, json, os, random, shutil, struct, sys
src, out = "crates/nucleus/tests/data/hf/llama-f32", sys.argv[1]
os.makedirs(out)
for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
    shutil.copy(f"{src}/{f}", f"{out}/{f}")
E, FF, L, V, H, KV = 1024, 2816, 8, 384, 16, 8
cfg = json.load(open(f"{src}/config.json"))
cfg.update(hidden_size=E, intermediate_size=FF, num_hidden_layers=L, vocab_size=V, head_dim=E // H,
           num_attention_heads=H, num_key_value_heads=KV, tie_word_embeddings=True)
json.dump(cfg, open(f"{out}/config.json", "w"))
hd = E // H
shapes = {"model.embed_tokens.weight": [V, E], "model.norm.weight": [E]}
for i in range(L):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": [E], p + "post_attention_layernorm.weight": [E],
                   p + "self_attn.q_proj.weight": [E, E], p + "self_attn.k_proj.weight": [KV * hd, E],
                   p + "self_attn.v_proj.weight": [KV * hd, E], p + "self_attn.o_proj.weight": [E, E],
                   p + "mlp.gate_proj.weight": [FF, E], p + "mlp.up_proj.weight": [FF, E],
                   p + "mlp.down_proj.weight": [E, FF]})
header, off = {}, 0
for n, s in shapes.items():
    size = 4 * s[0] * (s[1] if len(s) > 1 else 1)
    header[n] = {"dtype": "F32", "shape": s, "data_offsets": [off, off + size]}
    off += size
h = json.dumps(header).encode()
rng = random.Random(0)
block = array.array("f", [rng.gauss(0, 0.02) for _ in range(1 << 16)]).tobytes()
with open(f"{out}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    left = off
    while left > 0:
        f.write(block[:min(left, len(block))])
        left -= len(block)
print(f"checkpoint: {off / 2**20:.1f} MiB of F32 tensors", file=sys.stderr)
PY
for bin in "$@"; do
  for cmd in "quantize $tmp/ckpt $tmp/out.gguf Q8_0 -t 2" "run $tmp/ckpt hello -n 1 -t 2"; do
    rss=$(/usr/bin/time -f "%M" nice -n 19 "$bin" $cmd 2>&1 >/dev/null | tail -1)
    echo "$bin ${cmd%% *}: peak RSS $rss KiB"
  done
done
