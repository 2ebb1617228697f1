#!/usr/bin/env python3
"""Compares the tensors of two GGUF files byte for byte (names, types, shapes, data) and
prints one line: `TYPE tensors=N identical=M differing=[...] size_a size_b`.
With --sha256 OUT.json, writes each tensor's type and sha256 of A instead (fixture making).

Needs the `gguf` package (llama.cpp's gguf-py) and numpy."""
import argparse, hashlib, json, os, sys

from gguf import GGUFReader


def tensors(path):
    r = GGUFReader(path)
    return {t.name: (t.tensor_type.name, [int(d) for d in t.shape], bytes(t.data.tobytes())) for t in r.tensors}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--label", default="")
    ap.add_argument("--sha256", help="write {name: [type, sha256]} of A to this JSON file")
    args = ap.parse_args()
    ta = tensors(args.a)
    if args.sha256:
        out = {n: [ty, hashlib.sha256(data).hexdigest()] for n, (ty, _, data) in ta.items()}
        with open(args.sha256, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
        return 0
    tb = tensors(args.b)
    differing = [n for n in ta if n not in tb or ta[n] != tb[n]] + [n for n in tb if n not in ta]
    same = len(ta) - len([n for n in differing if n in ta])
    print(f"{args.label:8} tensors={len(ta):4} identical={same:4} differing={len(differing):3} "
          f"size_a={os.path.getsize(args.a)} size_b={os.path.getsize(args.b)}"
          + (f" first_differing={differing[:3]}" if differing else ""))
    for n in differing[:3]:
        if n in ta and n in tb:
            print(f"  {n}: a={ta[n][0]}{ta[n][1]} b={tb[n][0]}{tb[n][1]}", file=sys.stderr)
    return 0 if not differing else 1


if __name__ == "__main__":
    sys.exit(main())
