#!/usr/bin/env python3
"""nucleus beside llama.cpp on random-weight GGUFs of real models' shapes (scripts/real_shapes.py),
in one run, with the machine's measured ceilings (scripts/machine_limits.c) beside them. Prints
the markdown table that leads BENCHMARKS.md. Not run in CI (a timing, and files of 1-5 GB).

    python3 -m venv .bench/venv && .bench/venv/bin/pip install numpy pyyaml
    .bench/venv/bin/python scripts/bench_real_shapes.py [NAME ...]

For every file: read twice first (a file benchmarked while the page cache still writes it back
runs at half speed), then ROUNDS rounds, each running llama-bench, nucleus and nucleus --exact
one after the other (alternating, so that a noisy neighbour hits both), each round's figure kept:
a cell shows the range over the rounds. Load: seconds from the command's start to its exit after
one generated token (llama-simple and `nucleus run -n 1`, page cache warm; nucleus's one pass
packs each work item's weights as it reads them, docs/src/pack-cache.md), LOAD_ROUNDS
alternating rounds (a range), and the peak RSS; "mapped": nucleus with NUCLEUS_PACK_CACHE, the
packed weights mapped from the file an earlier load wrote (docs/src/pack-cache.md); "huge":
nucleus with NUCLEUS_HUGE_PAGES=1, its packed weights in 2 MiB pages (`nucleus serve`'s default,
docs/src/memory.md), which each round also decodes with.
Decode bandwidth: the bytes a decode step reads (every matrix but the token embeddings, of which
it reads one row; the output matrix, which is the embeddings when they are tied; of the expert
tensors of a mixture of experts, the used experts' share) times decode tokens/s, beside the
measured DRAM read bandwidth from 2 MiB pages (from 4 KiB pages where the kernel gave none).
`--moe` benchmarks the MoE files (real_shapes.py --moe).

Environment: THREADS (default 2), PP (512), TG (64), ROUNDS (2), LOAD_ROUNDS (3), MAPPED (1;
0 skips the mapped load, for files whose packed copy would not fit in the page cache beside
them), NUCLEUS
(default: built here, release), LLAMA_CPP_ROOT (default .bench/llama.cpp: llama.cpp's native
build, with its AMX kernels where the CPU has them; built by scripts/build_llama_cpp.sh when
missing; .bench/llama.cpp-avx512 for its build without AMX, the peer of the tables before
2026-11-28: see that script).
"""

import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import real_shapes  # noqa: E402

THREADS = int(os.environ.get("THREADS", "2"))
PP = int(os.environ.get("PP", "512"))
TG = int(os.environ.get("TG", "64"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
LOAD_ROUNDS = int(os.environ.get("LOAD_ROUNDS", "3"))
MAPPED = os.environ.get("MAPPED", "1") != "0"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def tools():
    nucleus = os.environ.get("NUCLEUS")
    if not nucleus:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "nucleus-cli"], cwd=ROOT, check=True)
        nucleus = str(ROOT / "target/release/nucleus")
    src = Path(sh([str(ROOT / "scripts/build_llama_cpp.sh")]).strip())
    limits = ROOT / ".bench/machine_limits"
    subprocess.run(["cc", "-O3", "-march=native", "-pthread", str(ROOT / "scripts/machine_limits.c"),
                    "-o", str(limits)], check=True)
    return nucleus, src / "build/bin", limits


def decode_bytes(path):
    """Bytes one decode step reads: every tensor but the token embeddings (one row of them),
    unless they are the output matrix too; of a mixture of experts' expert tensors, the share
    of the experts a token uses (expert_used_count of expert_count)."""
    r = real_shapes.gguf.GGUFReader(path)
    names = {t.name for t in r.tensors}
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def kv(key):
        f = r.fields.get(f"{arch}.{key}")
        return int(f.parts[-1][0]) if f else None

    used, count = kv("expert_used_count"), kv("expert_count")
    total = 0
    for t in r.tensors:
        if t.name == "token_embd.weight" and "output.weight" in names:
            total += int(t.n_bytes) // int(t.shape[1])
        elif "_exps." in t.name:
            total += int(t.n_bytes) * used // count
        else:
            total += int(t.n_bytes)
    return total


def llama_bench(bin_dir, path):
    out = sh([str(bin_dir / "llama-bench"), "-m", str(path), "-t", str(THREADS), "-p", str(PP),
              "-n", str(TG), "-r", "1", "-o", "json"])
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
    return pp, tg


def nucleus_bench(nucleus, path, exact, pp=PP, env=None):
    cmd = [nucleus, "bench", str(path), "-t", str(THREADS), "-p", str(pp), "-g", str(TG), "--json"]
    j = json.loads(sh(cmd + (["--exact"] if exact else []), env=env))
    return j["prefill_tokens_per_s"], j["decode_tokens_per_s"], j


def with_huge_pages(on):
    env = dict(os.environ, NUCLEUS_HUGE_PAGES="1" if on else "0")
    env.pop("NUCLEUS_PACK_CACHE", None)
    return env


def timed(cmd, env=None):
    """(seconds, peak RSS in GB) of a command run to its end."""
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "RSS %M"] + cmd, capture_output=True, text=True,
                       env=env)
    secs = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {p.stderr[-2000:]}")
    rss = int(re.findall(r"RSS (\d+)", p.stderr)[-1]) * 1024 / 1e9
    return secs, rss


def load_times(nucleus, bin_dir, path):
    """LOAD_ROUNDS alternating rounds of llama-simple, nucleus run (its one pass packing as it
    goes), and nucleus run mapping its packed weights from a file of them (NUCLEUS_PACK_CACHE,
    written once beforehand, untimed), the model file and that file re-read into the page cache
    before each round: their (seconds, peak RSS) lists. One sample each moved by a second or
    more from run to run on this VM (the cost of fresh memory varies with the host)."""
    cache = ROOT / ".bench/pack-cache"
    for old in cache.glob(f"{path.stem}-*.nucpack"):
        old.unlink()
    run = [nucleus, "run", "-t", str(THREADS), "-n", "1", str(path), "Hello"]
    with_cache = dict(with_huge_pages(False), NUCLEUS_PACK_CACHE=str(cache))
    if MAPPED:
        subprocess.run(run, env=with_cache, check=True, capture_output=True)
    packed = list(cache.glob(f"{path.stem}-*.nucpack"))
    ll, nu, huge, mapped = [], [], [], []
    for _ in range(LOAD_ROUNDS):
        for f in [path] + packed:
            subprocess.run(["cat", str(f)], stdout=subprocess.DEVNULL, check=True)
        ll.append(timed([str(bin_dir / "llama-simple"), "-m", str(path), "-n", "1", "Hello"]))
        nu.append(timed(run, env=with_huge_pages(False)))
        huge.append(timed(run, env=with_huge_pages(True)))
        if MAPPED:
            mapped.append(timed(run, env=with_cache))
    for f in packed:
        f.unlink()
    return ll, nu, huge, mapped


def rng(vals, digits=1):
    lo, hi = min(vals), max(vals)
    f = f"{{:.{digits}f}}"
    return f.format(lo) if f.format(lo) == f.format(hi) else f"{f.format(lo)}–{f.format(hi)}"


def ratio(a, b):
    lo, hi = min(a) / max(b), max(a) / min(b)
    return f"{lo:.2f}×" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}×"


def main():
    args = [a for a in sys.argv[1:] if a != "--moe"]
    names = args or (real_shapes.MOE if "--moe" in sys.argv else real_shapes.DEFAULT)
    nucleus, bin_dir, limits = tools()
    out_dir = ROOT / ".bench/real-shapes"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in names:
        p = out_dir / f"{n}-random.gguf"
        if not p.exists():
            real_shapes.write(n, out_dir, 1)
        paths.append((n, p))
    lim = json.loads(sh([str(limits), str(THREADS), "--json"]))
    log("limits:", lim)
    rows = []
    info = None
    for name, path in paths:
        log(f"== {name}: warming the page cache")
        for _ in range(2):
            subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
        res = {"ll": [], "nu": [], "ex": [], "hu": []}
        for r in range(ROUNDS):
            log(f"   round {r + 1}: load {os.getloadavg()[0]:.2f}")
            res["ll"].append(llama_bench(bin_dir, path))
            *nu, info = nucleus_bench(nucleus, path, False, env=with_huge_pages(False))
            res["nu"].append(nu)
            res["ex"].append(nucleus_bench(nucleus, path, True, env=with_huge_pages(False))[:2])
            res["hu"].append(nucleus_bench(nucleus, path, False, 0, with_huge_pages(True))[:2])
        loads = load_times(nucleus, bin_dir, path)
        ll_s, nu_s, hu_s, map_s = ([t for t, _ in x] for x in loads)
        ll_rss, nu_rss, hu_rss, map_rss = (max((m for _, m in x), default=0) for x in loads)
        gb = path.stat().st_size / 1e9
        step = decode_bytes(path) / 1e9
        col = {k: ([v[0] for v in res[k]], [v[1] for v in res[k]]) for k in res}
        nu_bw, hu_bw, ll_bw = ([t * step for t in col[k][1]] for k in ("nu", "hu", "ll"))
        dram = lim["read_gb_s_huge"] or lim["read_gb_s"]

        def bw(v):
            return f"{rng(v)} ({100 * max(v) / dram:.0f} %)"

        rows.append(
            f"| {name} | {gb:.2f} | {rng(col['ll'][0])} / {rng(col['ll'][1], 2)} "
            f"| {rng(col['nu'][0])} / {rng(col['nu'][1], 2)} "
            f"| {ratio(col['nu'][0], col['ll'][0])} / {ratio(col['nu'][1], col['ll'][1])} "
            f"| {rng(col['ex'][0])} / {rng(col['ex'][1], 2)} "
            f"| {ratio(col['ex'][0], col['ll'][0])} / {ratio(col['ex'][1], col['ll'][1])} "
            f"| {rng(col['hu'][1], 2)} "
            f"| {bw(nu_bw)} / {bw(hu_bw)} / {bw(ll_bw)} "
            f"| {rng(nu_s)} / {rng(hu_s)} / {rng(map_s, 2) if map_s else '–'} / {rng(ll_s)} "
            f"| {nu_rss:.2f} / {hu_rss:.2f} / {f'{map_rss:.2f}' if map_s else '–'} "
            f"/ {ll_rss:.2f} |")
    cpu = "unknown"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "").split()
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
                       "amx_int8") if f in flags]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs ({cpu}; "
          f"{' '.join(isa)}), Linux {platform.release()}, {THREADS} threads, "
          f"pp{PP} / tg{TG}, {ROUNDS} alternating rounds (ranges), nucleus kernels "
          f"{info['kernels']}, AMX: {info['amx']}; llama.cpp (.bench/{bin_dir.parents[4].name}) built "
          f"from the vendored source")
    print()
    print(f"Machine ceilings (scripts/machine_limits.c, {THREADS} threads): DRAM read "
          f"{lim['read_gb_s_huge']:.1f} GB/s from 2 MiB pages ({lim['read_gb_s_huge_1']:.1f} on one "
          f"thread), {lim['read_gb_s']:.1f} from 4 KiB pages ({lim['read_gb_s_1']:.1f}); int8 multiply-adds "
          f"vpdpbusd zmm {lim['vnni512_gmac_s']:.0f} G/s, ymm {lim['vnni256_gmac_s']:.0f} G/s, "
          f"vpmaddubsw {lim['avx2_gmac_s']:.0f} G/s; AMX: {lim['amx']}"
          + (f" ({lim['amx_gmac_s']:.0f} G/s)" if lim['amx_gmac_s'] else ""))
    print()
    print("| file | GB | llama.cpp pp / tg (tok/s) | nucleus pp / tg | ratio pp / tg "
          "| `--exact` pp / tg | ratio pp / tg | nucleus tg, huge pages "
          "| decode GB/s (% of DRAM): nucleus / huge pages / llama.cpp "
          "| load to 1st token s: nucleus / huge pages / mapped / llama.cpp "
          "| peak RSS GB: nucleus / huge pages / mapped / llama.cpp |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
