"""Render deploy/'s kustomizations in Python, so the manifests can be checked where no `kubectl`
is installed.

Only what deploy/ uses is understood, and anything else is refused (``Unsupported``) rather than
rendered wrongly: ``resources`` (files and kustomization directories), ``components``,
``configMapGenerator`` (``literals``, ``files``, ``behavior`` create/replace/merge, labels) with
name hashes turned off, ``replicas``, ``patches`` given as RFC 6902 JSON patches with a
``target`` (kind, and a name that is a regular expression, as kustomize reads it), ``images``
(``newName``, ``newTag``) and ``namespace``. The order is
kustomize's: a kustomization's resources, its own generators, then its components (each adds its
own resources and generators, then transforms everything so far), then its own transformers.
``test_manifests.py`` compares the result with `kubectl kustomize` where kubectl is installed.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]

KNOWN_FIELDS = {
    "apiVersion",
    "kind",
    "namespace",
    "images",
    "resources",
    "components",
    "configMapGenerator",
    "generatorOptions",
    "replicas",
    "patches",
}


class Unsupported(Exception):
    """The kustomization uses something this renderer does not understand."""


def render(directory: Path) -> list[Resource]:
    """The resources ``directory``'s kustomization.yaml builds."""
    return _build(directory, [], component=False)


def read_documents(path: Path) -> list[Resource]:
    """The YAML documents of a manifest file (empty ones dropped)."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomization(directory: Path) -> dict[str, Any]:
    """``directory``'s kustomization.yaml as a mapping."""
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def _build(directory: Path, accumulated: list[Resource], *, component: bool) -> list[Resource]:
    spec = kustomization(directory)
    unknown = set(spec) - KNOWN_FIELDS
    if unknown:
        raise Unsupported(f"{directory}: {sorted(unknown)}")
    expected = "Component" if component else "Kustomization"
    if spec.get("kind", "Kustomization") != expected:
        raise Unsupported(f"{directory} is a {spec.get('kind')}, used as a {expected}")
    resources = accumulated
    for entry in spec.get("resources", []):
        path = directory / entry
        if path.is_dir():
            resources = resources + _build(path, [], component=False)
        else:
            resources = resources + read_documents(path)
    options = spec.get("generatorOptions", {})
    for generator in spec.get("configMapGenerator", []):
        resources = _generate(directory, generator, options, resources)
    for entry in spec.get("components", []):
        resources = _build(directory / entry, resources, component=True)
    for entry in spec.get("replicas", []):
        _set_replicas(resources, entry["name"], entry["count"])
    for patch in spec.get("patches", []):
        _patch(directory, patch, resources)
    for image in spec.get("images", []):
        _set_image(resources, image)
    if "namespace" in spec:
        for resource in resources:
            resource["metadata"]["namespace"] = spec["namespace"]
    return resources


def _set_image(resources: list[Resource], image: dict[str, str]) -> None:
    if set(image) - {"name", "newName", "newTag"}:
        raise Unsupported(f"images: {image}")
    for resource in resources:
        if resource["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = resource["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            name, _, tag = container["image"].partition(":")
            if name == image["name"]:
                new_tag = image.get("newTag", tag)
                container["image"] = image.get("newName", name) + (f":{new_tag}" if new_tag else "")


def _generate(
    directory: Path, generator: dict[str, Any], options: dict[str, Any], resources: list[Resource]
) -> list[Resource]:
    own = generator.get("options", {})
    if not (own.get("disableNameSuffixHash") or options.get("disableNameSuffixHash")):
        raise Unsupported(f"{directory}: configMap {generator['name']} would get a name hash")
    data: dict[str, str] = {}
    for literal in generator.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    for entry in generator.get("files", []):
        key, _, name = entry.rpartition("=")
        data[key or Path(name).name] = (directory / name).read_text()
    labels = {**options.get("labels", {}), **own.get("labels", {})}
    behavior = generator.get("behavior", "create")
    name = generator["name"]
    existing = [r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == name]
    if behavior == "create":
        if existing:
            raise Unsupported(f"{directory}: configMap {name} made twice")
        made: Resource = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
        if labels:
            made["metadata"]["labels"] = labels
        return [*resources, made]
    if len(existing) != 1:
        raise Unsupported(f"{directory}: configMap {name} to {behavior} is not there")
    (target,) = existing
    target["data"] = data if behavior == "replace" else {**target.get("data", {}), **data}
    if labels:
        target["metadata"].setdefault("labels", {}).update(labels)
    return resources


def _set_replicas(resources: list[Resource], name: str, count: int) -> None:
    found = [
        r for r in resources if r["kind"] in ("Deployment", "StatefulSet") and r["metadata"]["name"] == name
    ]
    if not found:
        raise Unsupported(f"replicas: no workload named {name}")
    for resource in found:
        resource["spec"]["replicas"] = count


def _patch(directory: Path, patch: dict[str, Any], resources: list[Resource]) -> None:
    target = patch["target"]
    if set(target) - {"kind", "name"} or "path" not in patch:
        raise Unsupported(f"{directory}: patch {patch}")
    operations = yaml.safe_load((directory / patch["path"]).read_text())
    matched = [
        r
        for r in resources
        if r["kind"] == target.get("kind", r["kind"])
        and re.fullmatch(target.get("name", ".*"), r["metadata"]["name"])
    ]
    if not matched:
        raise Unsupported(f"{directory}: patch {patch['path']} matches nothing")
    for resource in matched:
        for operation in operations:
            _apply(resource, operation)


def _apply(document: Resource, operation: dict[str, Any]) -> None:
    """One RFC 6902 operation (add, replace, remove) on ``document``, in place."""
    op, path = operation["op"], operation["path"]
    if op not in ("add", "replace", "remove"):
        raise Unsupported(f"JSON patch op {op}")
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    node: Any = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    value = copy.deepcopy(operation.get("value"))
    if isinstance(node, list):
        if op == "add":
            node.insert(len(node) if last == "-" else int(last), value)
        elif op == "replace":
            node[int(last)] = value
        else:
            del node[int(last)]
    elif op == "remove":
        del node[last]
    else:
        if op == "replace" and last not in node:
            raise KeyError(f"JSON patch replace of a missing {path}")
        node[last] = value
