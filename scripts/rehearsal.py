#!/usr/bin/env python3
"""A multi-replica rehearsal of deploy/kubernetes on loopback, bounded in time (< 3 min).

- Two `nucleus serve` replicas of the catalog model on free 127.0.0.1 ports (smaller than the
  Deployment's: one thread, two sequences, to fit a 2-core machine), with exactly the
  Deployment's drain settings, read from deploy/kubernetes/nucleus-deployment.yaml: its
  --unready-secs, --drain-secs and --max-tokens, its preStop sleep and its
  terminationGracePeriodSeconds (scripts/drain_budget.py measures what they must cover).
- Debian's Prometheus scraping them with the shipped scrape job
  (deploy/kubernetes/prometheus-scrape.yaml), rendered for loopback: each static target carries
  the __meta_kubernetes_* labels pod discovery would give it, so the job's relabelling runs
  unchanged and the series get their `namespace` and `pod` labels.
- The HPA's metric as prometheus-adapter computes it: the rule of
  deploy/kubernetes/prometheus-adapter-rules.yaml, its seriesQuery and its metricsQuery
  expanded as the adapter does, evaluated against Prometheus's HTTP API under load, and the
  replica count the HPA would want from it (hpa.yaml's target).
- A rolling restart of one replica under load, every client still sending, in the order the
  kubelet and the endpoints controller follow when a pod is deleted: the pod leaves the
  endpoints (the stand-in router drops it ENDPOINT_PROPAGATION_S later) while the preStop
  sleep runs; then SIGTERM (/health 503 for --unready-secs, still serving; then the drain);
  the process is killed if it is still alive at terminationGracePeriodSeconds (which fails
  the run); then a fresh process on the same port.
  What stands in for the router: a client-side balancer that probes each replica's /health every
  0.5 s as the readiness probe does, sends only to replicas whose last probe answered 200, and
  retries a request on another replica only when the connection is refused before anything is
  sent (as a load balancer does when an endpoint has just gone), and prefers the replica with
  the fewest requests in flight (as the picker's queue scorer does). Any other failure is a lost
  request, and the run fails if there is one.

    python3 scripts/rehearsal.py        # needs target/release/nucleus and `prometheus`
"""
import argparse
import json
import math
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
NAMESPACE = "rehearsal"
MODEL = "qwen2.5-coder-0.5b-instruct"
DEADLINE = time.monotonic() + 170
# How long the pod's removal from the endpoints takes to reach the router in the rehearsal
# (shorter than the preStop sleep, which is sized to cover it in a cluster).
ENDPOINT_PROPAGATION_S = 2
# Long requests the router placed on the replica just before its deletion: they run through the
# preStop sleep and the unready window into the drain, the two-request queue behind them too.
LONG_REQUESTS, LONG_TOKENS = 2, 384


def deployment_drain():
    """The Deployment's drain settings: its serve flags, preStop sleep and grace period."""
    doc = yaml.safe_load((K8S / "nucleus-deployment.yaml").read_text())
    pod = doc["spec"]["template"]["spec"]
    c = next(c for c in pod["containers"] if c["name"] == "nucleus")
    flags = dict(a.partition("=")[::2] for a in c["args"] if a.startswith("--"))
    d = {
        "unready": int(flags["--unready-secs"]),
        "drain": int(flags["--drain-secs"]),
        "max_tokens": int(flags["--max-tokens"]),
        "pre_stop": int(c["lifecycle"]["preStop"]["sleep"]["seconds"]),
        "grace": int(pod["terminationGracePeriodSeconds"]),
    }
    # The server's own bound: the unready window, the drain, then 2 s to close connections.
    if d["grace"] < d["pre_stop"] + d["unready"] + d["drain"] + 2:
        fail(f"the Deployment's grace period is shorter than its preStop sleep, unready window, "
             f"drain and close: {d}")
    return d


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def left():
    if time.monotonic() > DEADLINE:
        fail("the rehearsal ran past its 170 s bound")
    return DEADLINE - time.monotonic()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def configmap_key(file, key):
    doc = yaml.safe_load((K8S / file).read_text())
    return yaml.safe_load(doc["data"][key])


def http(url, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


class Replica:
    def __init__(self, index, binary, workdir, args):
        self.index, self.binary, self.args = index, binary, args
        self.pod = f"nucleus-{index}"
        self.port = free_port()
        self.log = open(workdir / f"{self.pod}.log", "ab")
        self.proc = None
        self.ready = False
        self.in_endpoints = True
        self.draining = False
        self.outstanding = 0

    def start(self):
        cmd = [self.binary, "serve", MODEL, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd + self.args, stdout=self.log, stderr=self.log)

    def wait_healthy(self):
        while left():
            if self.proc.poll() is not None:
                fail(f"{self.pod} exited with {self.proc.returncode} (log: {self.log.name})")
            try:
                if http(f"http://127.0.0.1:{self.port}/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)


class Balancer:
    """The stand-in for the router: readiness-probed endpoints, retry on refused connections."""

    def __init__(self, replicas):
        self.replicas = replicas
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.stats = {"ok": 0, "lost": 0, "refused_retried": 0}
        self.errors = []
        self.served_while_unready = 0

    def probe_loop(self):
        while not self.stop.is_set():
            for r in self.replicas:
                try:
                    r.ready = http(f"http://127.0.0.1:{r.port}/health", timeout=1)[0] == 200
                except (OSError, urllib.error.HTTPError):
                    r.ready = False
            time.sleep(0.5)

    def send(self, body):
        for _ in range(200):
            ready = [r for r in self.replicas if r.ready and r.in_endpoints]
            if not ready:
                time.sleep(0.05)
                continue
            with self.lock:  # the fewest requests in flight, as the picker's queue scorer prefers
                least = min(r.outstanding for r in ready)
                r = random.choice([r for r in ready if r.outstanding == least])
                r.outstanding += 1
            try:
                status, _ = http(f"http://127.0.0.1:{r.port}/v1/completions", body, timeout=90)
                return status, r
            except urllib.error.URLError as e:
                if isinstance(e.reason, ConnectionRefusedError):
                    with self.lock:
                        self.stats["refused_retried"] += 1
                    time.sleep(0.05)
                    continue
                raise
            finally:
                with self.lock:
                    r.outstanding -= 1
        raise RuntimeError("no ready replica for 200 tries")

    def client_loop(self, seed):
        rng = random.Random(seed)
        while not self.stop.is_set():
            n = rng.randint(4, 8)
            body = {"model": MODEL, "prompt": f"Count to {n}:", "max_tokens": n, "temperature": 0}
            try:
                status, replica = self.send(body)
                ok = status == 200
            except Exception as e:  # noqa: BLE001 (every failure is counted and shown)
                ok = False
                with self.lock:
                    self.errors.append(repr(e))
            with self.lock:
                self.stats["ok" if ok else "lost"] += 1
                if ok and replica.proc is not None and replica.draining:
                    self.served_while_unready += 1


def prometheus_config(replicas, interval):
    jobs = configmap_key("prometheus-scrape.yaml", "scrape-config.yaml")
    for job in jobs:
        if job.pop("kubernetes_sd_configs", None) is None:
            continue
        job["scrape_interval"] = job["scrape_timeout"] = interval
        job["static_configs"] = [
            {
                "targets": [f"127.0.0.1:{r.port}"],
                "labels": {
                    "__meta_kubernetes_pod_label_app_kubernetes_io_name": "nucleus",
                    "__meta_kubernetes_pod_container_port_name": "http",
                    "__meta_kubernetes_namespace": NAMESPACE,
                    "__meta_kubernetes_pod_name": r.pod,
                },
            }
            for r in replicas
        ]
    return {"global": {"scrape_interval": interval}, "scrape_configs": jobs}


def prom_query(base, query):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    out = json.loads(http(url, timeout=10)[1])
    if out.get("status") != "success":
        fail(f"Prometheus refused {query}: {out}")
    return out["data"]["result"]


def adapter_queries(replicas):
    """The rule's seriesQuery, and its metricsQuery expanded as prometheus-adapter does for the
    HPA's request (all the Deployment's pods in the namespace, grouped by pod)."""
    rule = configmap_key("prometheus-adapter-rules.yaml", "config.yaml")["rules"][0]
    pods = "|".join(r.pod for r in replicas)
    metrics = (
        rule["metricsQuery"]
        .replace("<<.Series>>", rule["name"]["as"])
        .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"{pods}"')
        .replace("<<.GroupBy>>", "pod")
    )
    return rule["seriesQuery"], metrics


def hpa_desired(per_pod, current):
    hpa = yaml.safe_load((K8S / "hpa.yaml").read_text())
    target = float(hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"])
    avg = sum(per_pod.values()) / max(len(per_pod), 1)
    desired = math.ceil(current * avg / target) if avg > target * 1.1 else current
    lo, hi = hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]
    return avg, target, min(max(desired, lo), hi)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "nucleus"))
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--clients", type=int, default=6)
    args = ap.parse_args()
    drain = deployment_drain()
    prometheus = shutil.which("prometheus")
    if not prometheus or not os.access(args.binary, os.X_OK):
        fail("needs `prometheus` (apt-get install prometheus) and a built target/release/nucleus")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="rehearsal-"))
    serve_args = ["--threads", "1", "--ctx", "1024", "--max-running", "2", "--queue", "64",
                  "--unready-secs", str(drain["unready"]), "--drain-secs", str(drain["drain"]),
                  "--max-tokens", str(drain["max_tokens"]), "--model-id", MODEL]
    replicas = [Replica(i, args.binary, workdir, serve_args) for i in range(args.replicas)]
    procs = []
    try:
        run(replicas, prometheus, workdir, procs, args.clients, drain)
    finally:
        for p in procs + [r.proc for r in replicas if r.proc]:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def start_prometheus(replicas, prometheus, workdir, procs):
    port = free_port()
    cfg = workdir / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(prometheus_config(replicas, "1s")))
    check = subprocess.run(
        ["promtool", "check", "config", str(cfg)], capture_output=True, text=True
    )
    if check.returncode:
        fail(f"promtool check config: {check.stdout}{check.stderr}")
    log = open(workdir / "prometheus.log", "wb")
    procs.append(subprocess.Popen(
        [prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT))
    print(f"== Prometheus on :{port}, the shipped scrape job rendered for loopback (1 s scrapes)")
    return f"http://127.0.0.1:{port}"


def measure_hpa(base, replicas):
    """The adapter's queries against Prometheus, once every pod is scraped and some queue."""
    series_query, metrics_query = adapter_queries(replicas)
    per_pod = {}
    while left() > 100:
        time.sleep(2)
        try:
            up = prom_query(base, 'up{job="nucleus"}')
            result = prom_query(base, metrics_query)
        except OSError:
            continue
        per_pod = {s["metric"].get("pod"): float(s["value"][1]) for s in result}
        if len(up) == len(per_pod) == len(replicas) and sum(per_pod.values()) > 0:
            break
    query = urllib.parse.urlencode({"match[]": series_query})
    series = json.loads(http(f"{base}/api/v1/series?{query}", timeout=10)[1])["data"]
    labels = ", ".join(sorted(f"{s['namespace']}/{s['pod']}" for s in series))
    print(f"seriesQuery {series_query}: {len(series)} series, labels {labels}")
    print(f"metricsQuery {metrics_query}")
    if len(per_pod) != len(replicas) or sum(per_pod.values()) <= 0:
        fail(f"the adapter's query gave {per_pod} under load (want every pod, some queue)")
    avg, target, desired = hpa_desired(per_pod, len(replicas))
    print("  per pod: " + ", ".join(f"{p} {v:.2f}" for p, v in sorted(per_pod.items())))
    print(f"  HPA: average {avg:.2f} waiting per pod against a target of {target:g}: "
          f"{len(replicas)} -> {desired} replicas")


def long_request(victim, out):
    """One long completion on `victim` (as the router placed it); its end time, or the failure."""
    body = {"model": MODEL, "prompt": "def quicksort(xs):", "max_tokens": LONG_TOKENS,
            "ignore_eos": True, "temperature": 0}
    try:
        status, raw = http(f"http://127.0.0.1:{victim.port}/v1/completions", body, timeout=300)
        n = json.loads(raw)["usage"]["completion_tokens"]
        out.append((time.monotonic(), None if status == 200 and n == LONG_TOKENS
                    else f"HTTP {status}, {n} tokens"))
    except Exception as e:  # noqa: BLE001 (a cut request is the failure shown)
        out.append((time.monotonic(), repr(e)))


def rolling_restart(victim, drain):
    """The pod's deletion under load: out of the endpoints and the preStop sleep, SIGTERM, the
    kill at the grace period if it comes to that, then a new process on the same port."""
    long_done = []
    longs = [threading.Thread(target=long_request, args=(victim, long_done))
             for _ in range(LONG_REQUESTS)]
    for th in longs:
        th.start()
    time.sleep(1)
    print(f"== rolling restart of {victim.pod} under load: preStop sleep {drain['pre_stop']} s, "
          f"--unready-secs {drain['unready']}, --drain-secs {drain['drain']}, "
          f"terminationGracePeriodSeconds {drain['grace']} (the Deployment's)")
    t0 = time.monotonic()
    victim.draining = True
    threading.Timer(ENDPOINT_PROPAGATION_S, lambda: setattr(victim, "in_endpoints", False)).start()
    time.sleep(drain["pre_stop"])
    victim.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    print(f"  SIGTERM after the preStop sleep, at {signalled - t0:.1f} s")
    while victim.ready and left():
        time.sleep(0.05)
    print(f"  readiness dropped at {time.monotonic() - t0:.1f} s")
    kill_at = t0 + drain["grace"]
    while victim.proc.poll() is None and left() and time.monotonic() < kill_at:
        time.sleep(0.1)
    if victim.proc.poll() is None:
        victim.proc.kill()
        victim.proc.wait()
        fail(f"{victim.pod} was still running at the grace period ({drain['grace']} s): killed")
    code = victim.proc.returncode
    print(f"  {victim.pod} exited with {code} at {time.monotonic() - t0:.1f} s")
    for th in longs:
        th.join(timeout=5)
    drain_from = signalled + drain["unready"]
    for end, err in long_done:
        phase = "in the drain" if end > drain_from else "before the drain"
        print(f"  a long request ({LONG_TOKENS} tokens) ended at {end - t0:.1f} s, {phase}: "
              f"{err or 'whole'}")
    if len(long_done) != LONG_REQUESTS or any(err for _, err in long_done):
        fail(f"long requests on the drained replica were cut: {long_done}")
    if code != 0:
        fail(f"{victim.pod} exited with {code}")
    victim.draining = False
    victim.start()
    victim.wait_healthy()
    victim.in_endpoints = True
    print(f"  the new {victim.pod} is ready at {time.monotonic() - t0:.1f} s")


def run(replicas, prometheus, workdir, procs, clients, drain):
    for r in replicas:
        r.start()
    for r in replicas:
        r.wait_healthy()
    ready = ", ".join(f"{r.pod} on :{r.port}" for r in replicas)
    print(f"== {len(replicas)} replicas ready: {ready}")
    base = start_prometheus(replicas, prometheus, workdir, procs)

    lb = Balancer(replicas)
    threads = [threading.Thread(target=lb.probe_loop, daemon=True)]
    threads += [
        threading.Thread(target=lb.client_loop, args=(i,), daemon=True) for i in range(clients)
    ]
    for t in threads:
        t.start()
    measure_hpa(base, replicas)

    before = dict(lb.stats)
    rolling_restart(replicas[0], drain)
    settle = time.monotonic() + 6
    while time.monotonic() < settle and left():
        time.sleep(0.2)
    lb.stop.set()
    for t in threads:
        t.join(timeout=min(max(left() - 5, 1), 95))
    s = lb.stats
    during = {k: s[k] - before[k] for k in s}
    print(f"== requests: {s['ok']} served, {s['lost']} lost, {s['refused_retried']} refused "
          f"connections retried; during the restart {during['ok']} served, {during['lost']} "
          f"lost; {lb.served_while_unready} answered by the draining replica")
    if s["lost"]:
        fail(f"{s['lost']} requests lost: {lb.errors[:5]}")
    if during["ok"] == 0:
        fail("no request completed during the restart: the rehearsal proved nothing")
    print("ok: no request lost")


if __name__ == "__main__":
    main()
