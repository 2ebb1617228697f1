#!/usr/bin/env python3
"""Validate every object the base (deploy/kubernetes) and each overlay (deploy/overlays/*) build
to (strict): the kustomizations are built by deploy/kustomize_lite.py (and compared with
`kubectl kustomize` where kubectl is installed), built-in kinds are checked with
kubernetes-validate against the Kubernetes schemas of KUBERNETES_VERSION, the custom resources
against their CRDs' schemas (deploy/kubernetes/schemas/, README there) with jsonschema. Also
checks that the endpoint picker's configuration parses and names only plugins it declares, that
the picker reads a file its ConfigMap holds, the Prometheus scrape job (`promtool check config`,
where promtool is installed) and the adapter rule for the HPA's metric, and that each object
with an unknown field added is refused (the checks are strict). Prints one line per object;
exits 1 on any error.

    python3 deploy/validate_manifests.py            # needs kubernetes-validate, jsonschema, pyyaml
"""
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import jsonschema
import kubernetes_validate
import yaml

import kustomize_lite

KUBERNETES_VERSION = "1.33.0"
DEPLOY = pathlib.Path(__file__).resolve().parent
HERE = DEPLOY / "kubernetes"
TREES = [HERE] + sorted(p for p in (DEPLOY / "overlays").iterdir() if p.is_dir())
CUSTOM = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
    ("llm-d.ai/v1alpha2", "InferenceObjective"): "inferenceobjective-v1alpha2.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json",
    ("gateway.networking.k8s.io/v1", "Gateway"): "gateway-v1.json",
    ("networking.istio.io/v1", "DestinationRule"): "destinationrule-v1.json",
}


def strict(node):
    """The schema with `additionalProperties: false` on every object that declares properties."""
    if isinstance(node, dict):
        node = {k: strict(v) for k, v in node.items()}
        if (
            node.get("type") == "object"
            and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def with_object_fields(schema):
    """The CRD schema with the fields every object has (apiVersion, kind, metadata), which some
    CRDs (Istio's) leave to the API server to add."""
    props = schema.setdefault("properties", {})
    props.setdefault("apiVersion", {"type": "string"})
    props.setdefault("kind", {"type": "string"})
    props.setdefault("metadata", {"type": "object"})
    return schema


def metadata_errors(doc):
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return ["metadata.name is missing"]
    return []


def validate(doc):
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CUSTOM:
        schema = json.loads((HERE / "schemas" / CUSTOM[key]).read_text())
        schema = strict(with_object_fields(schema))
        validator = jsonschema.Draft7Validator(schema)
        errors = metadata_errors(doc)
        for e in validator.iter_errors(doc):
            path = ".".join(str(p) for p in e.absolute_path) or "(top)"
            errors.append(f"{path}: {e.message}")
        return errors
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path) or "(top)"
        return [f"{path}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"no schema: {e}"]
    return []


def with_unknown_field(doc):
    """A copy of `doc` with a field no schema declares, in `spec` when it has one."""
    bad = json.loads(json.dumps(doc))
    target = bad["spec"] if isinstance(bad.get("spec"), dict) else bad
    target["notAField"] = 1
    return bad


def find(objects, kind, name):
    hits = [o for o in objects if o.get("kind") == kind and o["metadata"].get("name") == name]
    return hits[0] if hits else None


def epp_config_errors(objects):
    """The picker's ConfigMap holds the file its --config-file names, an EndpointPickerConfig of
    llm-d-router's group whose profiles and data layer refer only to plugins it declares."""
    cm, dep = find(objects, "ConfigMap", "nucleus-epp"), find(objects, "Deployment", "nucleus-epp")
    if cm is None or dep is None:
        return ["no nucleus-epp ConfigMap or Deployment"]
    epp = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
    args = epp[0]["args"] if epp else []
    if "--config-file" not in args:
        return ["the nucleus-epp Deployment has no epp container with --config-file"]
    path = args[args.index("--config-file") + 1]
    key = path.removeprefix("/config/")
    if key not in cm.get("data", {}):
        return [f"--config-file {path}: the ConfigMap has no key {key}"]
    try:
        cfg = yaml.safe_load(cm["data"][key])
    except yaml.YAMLError as e:
        return [f"{key} does not parse: {e}"]
    if not isinstance(cfg, dict) or (cfg.get("apiVersion"), cfg.get("kind")) != (
        "llm-d.ai/v1alpha1",
        "EndpointPickerConfig",
    ):
        return [f"{key} is not an llm-d.ai/v1alpha1 EndpointPickerConfig"]
    declared = {p.get("name", p.get("type")) for p in cfg.get("plugins", [])}
    refs = [r["pluginRef"] for prof in cfg.get("schedulingProfiles", []) for r in prof["plugins"]]
    for source in (cfg.get("dataLayer") or {}).get("sources", []):
        refs.append(source["pluginRef"])
        refs += [e["pluginRef"] for e in source.get("extractors", [])]
    return [f"{key}: pluginRef {r} names no declared plugin" for r in refs if r not in declared]


def monitoring_errors(objects):
    """The scrape job passes promtool; the adapter rule serves the metric the HPA scales on."""
    errors = []
    hpa = find(objects, "HorizontalPodAutoscaler", "nucleus")
    scrape = find(objects, "ConfigMap", "nucleus-prometheus-scrape")
    rules = find(objects, "ConfigMap", "nucleus-prometheus-adapter-rules")
    if hpa is None or scrape is None or rules is None:
        return ["the HPA, the scrape job or the adapter rule is not in the kustomization"]
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    served = [r for r in yaml.safe_load(rules["data"]["config.yaml"])["rules"]]
    served = [r for r in served if r["name"]["as"] == metric]
    if len(served) != 1 or metric not in served[0]["seriesQuery"]:
        errors.append(f"the adapter serves {metric} by {len(served)} rules, not 1")
    elif not all(t in served[0]["metricsQuery"] for t in ("<<.Series>>", "<<.LabelMatchers>>")):
        errors.append("the adapter's metricsQuery does not select <<.Series>>{<<.LabelMatchers>>}")
    jobs = yaml.safe_load(scrape["data"]["scrape-config.yaml"])
    # Debian's Prometheus is built without Kubernetes discovery: promtool checks the job with
    # static targets in its place, as scripts/rehearsal.py runs it (the rest unchanged).
    for job in jobs:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": ["127.0.0.1:8080"]}]
    if shutil.which("promtool"):
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
            yaml.safe_dump({"scrape_configs": jobs}, f)
            f.flush()
            r = subprocess.run(
                ["promtool", "check", "config", f.name], capture_output=True, text=True
            )
            if r.returncode:
                errors.append(f"promtool check config: {r.stdout}{r.stderr}")
    else:
        print("     (promtool not installed: the scrape job's syntax is not checked)")
    return errors


def kubectl_differences(tree, objects):
    """`kubectl kustomize TREE` against the emulation (objects compared as sets)."""
    if not shutil.which("kubectl"):
        return None
    r = subprocess.run(["kubectl", "kustomize", str(tree)], capture_output=True, text=True)
    if r.returncode:
        return [f"kubectl kustomize failed: {r.stderr.strip()}"]
    canon = lambda objs: sorted(json.dumps(o, sort_keys=True) for o in objs)  # noqa: E731
    theirs = [d for d in yaml.safe_load_all(r.stdout) if d]
    if canon(theirs) == canon(objects):
        return []
    ours = {kustomize_lite.object_key(o): o for o in objects}
    return [
        f"kubectl kustomize differs on {kustomize_lite.object_key(o)}"
        for o in theirs
        if ours.get(kustomize_lite.object_key(o)) != o
    ] or ["kubectl kustomize emits other objects"]


def check_tree(tree):
    failed = 0
    label = tree.relative_to(DEPLOY.parent)
    try:
        objects = kustomize_lite.build(tree)
    except (kustomize_lite.KustomizeError, OSError, yaml.YAMLError) as e:
        print(f"FAIL {label}: {e}")
        return 1
    listed = {p.name for p in tree.glob("*.yaml")} - {"kustomization.yaml"}
    for doc in objects:
        name = f"{label}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        errors = validate(doc)
        if not validate(with_unknown_field(doc)):
            errors.append("an unknown field is accepted: the check is not strict")
        for e in errors:
            print(f"FAIL {name}: {e}")
        failed += bool(errors)
        if not errors:
            print(f"ok   {name}")
    for check in (epp_config_errors, monitoring_errors):
        for e in check(objects):
            print(f"FAIL {label}: {e}")
            failed += 1
    diff = kubectl_differences(tree, objects)
    if diff is None:
        print(f"     {label}: kubectl not installed, the emulated build is not cross-checked")
    else:
        for e in diff:
            print(f"FAIL {label}: {e}")
        failed += len(diff)
        if not diff:
            print(f"ok   {label}: the same {len(objects)} objects as `kubectl kustomize`")
    kustomization = yaml.safe_load((tree / "kustomization.yaml").read_text())
    used = set(kustomization.get("resources", []))
    used |= {p["path"] for p in kustomization.get("patches", [])}
    for stray in sorted(listed - used):
        print(f"FAIL {label}: {stray} is in no kustomization (never applied, never validated)")
    return failed + len(listed - used)


def main():
    failed = sum(check_tree(tree) for tree in TREES)
    if failed:
        print(f"{failed} check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
