#!/usr/bin/env python3
"""Validate every manifest under deploy/kubernetes/ (strict): built-in kinds with
kubernetes-validate against the Kubernetes schemas of KUBERNETES_VERSION, the InferencePool and
HTTPRoute against their CRDs' schemas (deploy/kubernetes/schemas/) with jsonschema. Also checks
that kustomization.yaml lists files that exist, that the endpoint picker's configuration in its
ConfigMap parses, and that each resource with an unknown field added is refused (the checks are
strict). Prints one line per resource; exits 1 on any error.

    python3 deploy/validate_manifests.py            # needs kubernetes-validate, jsonschema, pyyaml
"""
import json
import pathlib
import sys

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.33.0"
HERE = pathlib.Path(__file__).resolve().parent / "kubernetes"
CUSTOM = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json",
}
NOT_RESOURCES = {"kustomization.yaml"}


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


def metadata_errors(doc):
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return ["metadata.name is missing"]
    return []


def validate(doc):
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CUSTOM:
        schema = strict(json.loads((HERE / "schemas" / CUSTOM[key]).read_text()))
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


def epp_config_errors(doc):
    if doc.get("kind") != "ConfigMap" or "config.yaml" not in (doc.get("data") or {}):
        return []
    try:
        cfg = yaml.safe_load(doc["data"]["config.yaml"])
    except yaml.YAMLError as e:
        return [f"data.config.yaml does not parse: {e}"]
    if not isinstance(cfg, dict) or cfg.get("kind") != "EndpointPickerConfig":
        return ["data.config.yaml is not an EndpointPickerConfig"]
    return []


def main():
    failed = 0
    files = sorted(p for p in HERE.glob("*.yaml") if p.name not in NOT_RESOURCES)
    kustomization = yaml.safe_load((HERE / "kustomization.yaml").read_text())
    for listed in kustomization.get("resources", []):
        if not (HERE / listed).is_file():
            print(f"FAIL kustomization.yaml: {listed} does not exist")
            failed += 1
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            name = f"{path.name}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
            errors = validate(doc) + epp_config_errors(doc)
            if not validate(with_unknown_field(doc)):
                errors.append("an unknown field is accepted: the check is not strict")
            if errors:
                failed += 1
                for e in errors:
                    print(f"FAIL {name}: {e}")
            else:
                print(f"ok   {name}")
    if failed:
        print(f"{failed} manifest(s) or listing(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
