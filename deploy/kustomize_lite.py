"""The subset of `kustomize build` that deploy/kubernetes and deploy/overlays use, for CI
machines without a kustomize binary (Debian's is kubernetes-client 1.20's, years old; PyPI's
`kustomize` is an unrelated package). Supported kustomization fields: `resources` (files, and
directories holding a kustomization.yaml), `patches` (a file holding a strategic-merge patch, or
a JSON 6902 patch with a `target`) and `images` (newName/newTag). Any other field is an error,
so a kustomization cannot use something this emulation would silently ignore.
deploy/validate_manifests.py compares its output with `kubectl kustomize` where kubectl exists.
"""
import copy
import pathlib

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "patches", "images"}
# Strategic merge: the lists Kubernetes merges by a key (the rest are replaced).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
}


class KustomizeError(Exception):
    pass


def load_docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def build(directory):
    """The objects `kustomize build DIRECTORY` emits, in resource order."""
    directory = pathlib.Path(directory).resolve()
    kfile = directory / "kustomization.yaml"
    if not kfile.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    k = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(k) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{kfile}: fields this emulation does not support: {sorted(unknown)}")
    objects = []
    for res in k.get("resources", []):
        path = (directory / res).resolve()
        if path.is_dir():
            objects += build(path)
        elif path.is_file():
            objects += load_docs(path)
        else:
            raise KustomizeError(f"{kfile}: resource {res} does not exist")
    seen = set()
    for obj in objects:
        key = object_key(obj)
        if key in seen:
            raise KustomizeError(f"{kfile}: {key} appears twice")
        seen.add(key)
    for patch in k.get("patches", []):
        apply_patch(objects, directory, patch, kfile)
    for image in k.get("images", []):
        set_image(objects, image)
    return objects


def object_key(obj):
    meta = obj.get("metadata") or {}
    return (obj.get("apiVersion"), obj.get("kind"), meta.get("name"))


def group_version(api_version):
    return api_version.split("/", 1) if "/" in api_version else ("", api_version)


def matches(obj, target):
    group, version = group_version(obj.get("apiVersion", ""))
    checks = {
        "group": group,
        "version": version,
        "kind": obj.get("kind"),
        "name": (obj.get("metadata") or {}).get("name"),
    }
    unknown = set(target) - set(checks)
    if unknown:
        raise KustomizeError(f"patch target fields not supported: {sorted(unknown)}")
    return all(checks[f] == v for f, v in target.items())


def apply_patch(objects, directory, patch, kfile):
    if set(patch) - {"path", "target"} or "path" not in patch:
        raise KustomizeError(f"{kfile}: a patch needs `path` (and optionally `target`) only")
    body = yaml.safe_load((directory / patch["path"]).read_text())
    if isinstance(body, list):
        if "target" not in patch:
            raise KustomizeError(f"{kfile}: JSON 6902 patch {patch['path']} has no target")
        hits = [o for o in objects if matches(o, patch["target"])]
        for obj in hits:
            for op in body:
                json6902(obj, op)
    else:
        target = patch.get("target") or {
            "kind": body.get("kind"),
            "name": (body.get("metadata") or {}).get("name"),
        }
        hits = [o for o in objects if matches(o, target)]
        for obj in hits:
            merged = strategic_merge(obj, body)
            obj.clear()
            obj.update(merged)
    if not hits:
        raise KustomizeError(f"{kfile}: patch {patch['path']} matches no object")


def strategic_merge(base, patch, field=None):
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    key = MERGE_KEYS.get(field)
    if isinstance(base, list) and isinstance(patch, list) and key:
        # As kustomize does: items only the patch has come first, in the patch's order.
        out = copy.deepcopy(base)
        new = []
        for item in patch:
            same = [i for i, b in enumerate(out) if b.get(key) == item.get(key)]
            if same:
                out[same[0]] = strategic_merge(out[same[0]], item)
            else:
                new.append(copy.deepcopy(item))
        return new + out
    return copy.deepcopy(patch)


def json6902(obj, op):
    """One JSON Patch (RFC 6902) operation: add, replace or remove."""
    kind = op.get("op")
    if kind not in ("add", "replace", "remove"):
        raise KustomizeError(f"JSON 6902 op {kind!r} is not supported")
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    parent = obj
    for p in parts[:-1]:
        parent = parent[int(p)] if isinstance(parent, list) else parent[p]
    last = parts[-1]
    if isinstance(parent, list):
        if kind == "add":
            index = len(parent) if last == "-" else int(last)
            parent.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            parent[int(last)] = copy.deepcopy(op["value"])
        else:
            del parent[int(last)]
    else:
        if kind != "add" and last not in parent:
            raise KustomizeError(f"JSON 6902 {kind}: {op['path']} does not exist")
        if kind == "remove":
            del parent[last]
        else:
            parent[last] = copy.deepcopy(op["value"])


def set_image(objects, image):
    name = image["name"]
    for obj in objects:
        spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            ref = c.get("image", "")
            base = ref.split("@")[0].rsplit(":", 1)[0] if ":" in ref.split("/")[-1] else ref
            if base != name:
                continue
            new = image.get("newName", name)
            tag = image.get("newTag")
            c["image"] = f"{new}:{tag}" if tag else new
