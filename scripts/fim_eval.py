#!/usr/bin/env python3
"""Fill-in-the-middle evaluation against a server's llama-server-style `/infill`.

Cases: held-out middles of real Python functions. The source (default
../shared/corpus/python-stdlib.txt: CPython's textwrap and shlex modules) is parsed with `ast`;
every function (methods included) whose body spans at least --min-body lines gives cases, chosen
deterministically (random.Random(--seed)): a span of 1 to 3 whole lines inside the body, after
its docstring. The request is what an editor plugin sends: `input_prefix` the --prefix-lines
lines before the span, `input_suffix` the --suffix-lines lines after it, greedy
(`temperature: 0`), at most --n-predict tokens.

Scores, per case:
- exact: the completion equals the held-out middle, ignoring trailing whitespace at its end
  (models often stop before or after the final newline);
- compiles: the whole file, with the completion in place of the middle, passes `compile()`;
- passes: it compiles, and a fixed set of probe calls of the modules' public functions
  (textwrap.wrap/fill/shorten/dedent/indent/TextWrapper with options, shlex.split/join/quote
  and the shlex lexer, on sample inputs; see PROBES) gives the same results (or the same
  exception types) as the original file. The completed file runs in a subprocess with a
  timeout (a completion may loop). A completion that leaves the probed behaviour unchanged
  passes even if it differs from the original text; one that changes an unprobed path is not
  caught: the pass rate is an upper bound on functional correctness.

Each score is given for the completion as the server returned it (raw: a model that does not
stop at the end of the middle fails), and cut to the middle's number of lines ("cut").

With --llama-server URL the same cases go to that server too, and the table shows both, with
how many prompts the two servers built identically (each `/infill` answer's `prompt` field: the
prompt's text, special tokens shown).

    python3 scripts/fim_eval.py --url http://127.0.0.1:8080 [--llama-server http://127.0.0.1:8081]
    python3 scripts/fim_eval.py --url http://127.0.0.1:8080 --second-completion

--second-completion instead times two completions in the same file (the second one keystroke
later, as an editor asks), showing what the prefix cache saves.
"""

import argparse
import ast
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOURCE = os.path.join(HERE, "..", "..", "shared", "corpus", "python-stdlib.txt")

# Probes: run against the original and against each completed file; the results must agree.
PROBES = r'''
import json as _json
_T = ("The quick brown fox jumps over the lazy dog.  Pack my box with five dozen liquor jugs!\n"
      "\tTabs\tand   spaces, hyphen-ated words and a verylongwordthatdoesnotfitanywhere here.")
_S = ["ls -l 'my file' \"x y\" z\\ w", "a && b || c; d | e > f", "echo $HOME # comment",
      "", "'unterminated", "x=1 y='2 3'"]
def _r(f):
    try:
        return ["ok", repr(f())]
    except Exception as e:
        return ["err", type(e).__name__]
_out = []
for w in (1, 5, 12, 30, 70):
    _out.append(_r(lambda: wrap(_T, w)))
    _out.append(_r(lambda: fill(_T, w, initial_indent="> ", subsequent_indent="  ")))
    _out.append(_r(lambda: shorten(_T, w + 10, placeholder=" [...]")))
    _out.append(_r(lambda: TextWrapper(width=w, break_long_words=False, max_lines=3,
                                       fix_sentence_endings=True).wrap(_T)))
    _out.append(_r(lambda: TextWrapper(width=w, expand_tabs=False, replace_whitespace=False,
                                       drop_whitespace=False, break_on_hyphens=False).wrap(_T)))
    _out.append(_r(lambda: TextWrapper(width=w, tabsize=4, max_lines=2,
                                       placeholder="~").fill(_T)))
_out.append(_r(lambda: dedent("    a\n      b\n\n    c\n")))
_out.append(_r(lambda: dedent("\ta\n  b\n")))
_out.append(_r(lambda: indent("a\n\nb\n", "+ ")))
_out.append(_r(lambda: indent("a\n\nb\n", "+ ", lambda l: True)))
for s in _S:
    _out.append(_r(lambda: split(s)))
    _out.append(_r(lambda: split(s, comments=True)))
    _out.append(_r(lambda: split(s, posix=False)))
    _out.append(_r(lambda: list(shlex(s, punctuation_chars=True))))
    _out.append(_r(lambda: quote(s)))
    _out.append(_r(lambda: join([s, "b c"])))
print(_json.dumps(_out))
'''


def functions(src):
    """(name, first body line after the docstring, last line), 1-based, of every function."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            body = body[1:]
        if body:
            out.append((node.name, body[0].lineno, node.end_lineno))
    out.sort(key=lambda f: f[1])
    return out


def make_cases(src, n, seed, min_body, prefix_lines, suffix_lines):
    lines = src.splitlines(keepends=True)
    rng = random.Random(seed)
    fns = [f for f in functions(src) if f[2] - f[1] + 1 >= min_body]
    cases = []
    while len(cases) < n and fns:
        name, lo, hi = fns[len(cases) % len(fns)]
        for _ in range(20):
            span = rng.randint(1, 3)
            start = rng.randint(lo, max(lo, hi - span + 1))  # 1-based
            middle = "".join(lines[start - 1:start - 1 + span])
            if middle.strip():
                break
        key = (start, span)
        if any((c["start"], c["span"]) == key for c in cases):
            fns.remove((name, lo, hi))
            continue
        cases.append({
            "function": name, "start": start, "span": span, "middle": middle,
            "prefix": "".join(lines[max(0, start - 1 - prefix_lines):start - 1]),
            "suffix": "".join(lines[start - 1 + span:start - 1 + span + suffix_lines]),
            "file_before": "".join(lines[:start - 1]),
            "file_after": "".join(lines[start - 1 + span:]),
        })
    return cases


def post(url, body, timeout=600):
    req = urllib.request.Request(url + "/infill", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        v = json.loads(r.read())
    return v, time.perf_counter() - t


def run_probes(source, timeout=20):
    """The probes' output on `source` (run as a module named `completed`, in a subprocess),
    or None when it fails or times out."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "completed.py"), "w") as f:
            f.write(source)
        with open(os.path.join(d, "probes.py"), "w") as f:
            f.write(PROBES)
        runner = ("import sys; ns = {'__name__': 'completed'}; "
                  "exec(compile(open(sys.argv[1]).read(), 'completed.py', 'exec'), ns); "
                  "exec(open(sys.argv[2]).read(), ns)")
        try:
            p = subprocess.run([sys.executable, "-c", runner, os.path.join(d, "completed.py"),
                                os.path.join(d, "probes.py")], capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None
        return p.stdout if p.returncode == 0 else None


def cut(case, completion):
    """The completion cut to as many lines as the held-out middle has (the evaluation knows
    that length; an editor does not, though most show a completion line by line)."""
    return "".join(completion.splitlines(keepends=True)[:case["span"]])


def score(case, completion, reference_out):
    """(exact, compiles, passes) of a completion in place of the middle."""
    exact = completion.rstrip() == case["middle"].rstrip()
    source = case["file_before"] + completion + case["file_after"]
    try:
        compile(source, "completed.py", "exec")
        compiles = True
    except (SyntaxError, ValueError):
        compiles = False
    passes = compiles and (exact or run_probes(source) == reference_out)
    return exact, compiles, passes


def evaluate(url, cases, n_predict, reference_out, label):
    rows = []
    for i, c in enumerate(cases):
        body = {"input_prefix": c["prefix"], "input_suffix": c["suffix"],
                "n_predict": n_predict, "temperature": 0, "cache_prompt": True}
        v, secs = post(url, body)
        exact, compiles, passes = score(c, v["content"], reference_out)
        cut_exact, cut_compiles, cut_passes = score(c, cut(c, v["content"]), reference_out)
        rows.append({"exact": exact, "compiles": compiles, "passes": passes,
                     "cut_exact": cut_exact, "cut_compiles": cut_compiles,
                     "cut_passes": cut_passes, "secs": secs,
                     "prompt": v.get("prompt"), "content": v["content"],
                     "tokens_evaluated": v.get("tokens_evaluated")})
        print(f"[{label}] {i + 1}/{len(cases)} {c['function']}:{c['start']}+{c['span']} "
              f"exact={int(exact)}/{int(cut_exact)} compiles={int(compiles)}/{int(cut_compiles)} "
              f"passes={int(passes)}/{int(cut_passes)} "
              f"{secs:.1f}s", file=sys.stderr)
    return rows


def summary(rows):
    n = len(rows)
    keys = ("exact", "compiles", "passes", "cut_exact", "cut_compiles", "cut_passes")
    secs = sorted(r["secs"] for r in rows)
    return [100.0 * sum(r[k] for r in rows) / n for k in keys] + [secs[n // 2]]


def second_completion(url, src, n_predict):
    """Two completions in one file: the cursor in the middle of a long file, then one
    keystroke later. The second one's prompt shares everything up to the cursor."""
    lines = src.splitlines(keepends=True)
    cut = len(lines) // 2
    while not lines[cut].startswith("        ") or not lines[cut].strip():
        cut += 1
    prefix = "".join(lines[max(0, cut - 160):cut])
    suffix = "".join(lines[cut + 1:cut + 41])
    out = []
    for p in (prefix, prefix + lines[cut][:9]):
        body = {"input_prefix": p, "input_suffix": suffix, "n_predict": n_predict,
                "temperature": 0, "cache_prompt": True}
        v, secs = post(url, body)
        t = v.get("timings", {})
        out.append((secs, v["tokens_evaluated"], v.get("tokens_cached"), t.get("prompt_n"),
                    t.get("prompt_ms"), t.get("predicted_n"), t.get("predicted_ms")))
    print("| request | wall s | prompt tokens | cached | computed | prompt ms | generated | generation ms |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in zip(("first", "second (one keystroke later)"), out):
        print(f"| {name} | {r[0]:.2f} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.0f} | {r[5]} | {r[6]:.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="nucleus serve")
    ap.add_argument("--llama-server", help="llama-server on the same model file")
    ap.add_argument("--source", default=DEFAULT_SOURCE)
    ap.add_argument("-n", type=int, default=30, help="cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-body", type=int, default=4)
    ap.add_argument("--prefix-lines", type=int, default=32)
    ap.add_argument("--suffix-lines", type=int, default=12)
    ap.add_argument("--n-predict", type=int, default=48)
    ap.add_argument("--second-completion", action="store_true")
    ap.add_argument("--json", help="write every case's results here")
    a = ap.parse_args()
    src = open(a.source).read()
    if a.second_completion:
        second_completion(a.url, src, a.n_predict)
        return
    reference_out = run_probes(src)
    assert reference_out, "the probes fail on the original source"
    cases = make_cases(src, a.n, a.seed, a.min_body, a.prefix_lines, a.suffix_lines)
    servers = [("nucleus", a.url)] + ([("llama-server", a.llama_server)] if a.llama_server else [])
    results = {name: evaluate(url, cases, a.n_predict, reference_out, name)
               for name, url in servers}
    print(f"{len(cases)} cases from {os.path.basename(a.source)} (seed {a.seed}), greedy, "
          f"n_predict {a.n_predict}\n")
    print("| server | exact | compiles | passes | exact, cut | compiles, cut | passes, cut "
          "| median s/case |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        cols = summary(rows)
        print(f"| {name} | " + " | ".join(f"{x:.1f}%" for x in cols[:6])
              + f" | {cols[6]:.1f} |")
    if len(results) == 2:
        a_rows, b_rows = results["nucleus"], results["llama-server"]
        same_prompt = sum(x["prompt"] == y["prompt"] for x, y in zip(a_rows, b_rows))
        same_text = sum(x["content"] == y["content"] for x, y in zip(a_rows, b_rows))
        print(f"\nidentical prompts: {same_prompt}/{len(cases)}; identical completions: "
              f"{same_text}/{len(cases)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cases": cases, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
