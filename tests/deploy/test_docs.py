"""The kustomizations docs/deploy.md tells a user to write (the YAML blocks that start with
``# my-stack/kustomization.yaml``) build valid stacks: rendered beside a checkout named ``dyn``,
as the doc lays it out, every resource validates, every image is the user's, and every ``dyn``
command line parses; where kubectl is installed, `kubectl kustomize` builds the same."""

from __future__ import annotations

import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from tests.deploy.kustomize import render
from tests.deploy.stacks import KUBERNETES_VERSION, REPO, dyn_containers, parse_dyn, workloads

DOC = REPO / "docs" / "deploy.md"
MARKER = "# my-stack/kustomization.yaml"


def examples() -> list[str]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    return [b for b in blocks if b.startswith(MARKER)]


def lay_out(tmp_path, example: str):
    (tmp_path / "dyn").symlink_to(REPO, target_is_directory=True)
    stack = tmp_path / "my-stack"
    stack.mkdir()
    (stack / "kustomization.yaml").write_text(example)
    return stack


def test_the_doc_has_the_base_and_the_gpu_examples():
    found = examples()
    assert len(found) == 2
    assert any("components:" in e for e in found) and any("components:" not in e for e in found)


@pytest.mark.parametrize("index", [0, 1])
def test_each_example_builds_a_valid_stack_of_the_users_images(tmp_path, index):
    example = examples()[index]
    spec = yaml.safe_load(example)
    resources = render(lay_out(tmp_path, example))
    for resource in resources:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        assert resource["metadata"]["namespace"] == spec["namespace"]
    registries = {i["newName"].rpartition("/")[0] for i in spec["images"]}
    for workload in workloads(resources):
        pod = workload["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            if workload["metadata"]["name"] != "etcd":
                assert container["image"].rpartition("/")[0] in registries, container["image"]
    for c in dyn_containers(resources):
        parse_dyn(c.argv, c.env)


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not installed: no kustomize to compare with"
)
@pytest.mark.parametrize("index", [0, 1])
def test_kubectl_kustomize_builds_the_same_from_each_example(tmp_path, index):
    stack = lay_out(tmp_path, examples()[index])
    built = subprocess.run(
        ["kubectl", "kustomize", str(stack)], capture_output=True, text=True, timeout=60, check=True
    ).stdout

    def key(r):
        return (r["kind"], r["metadata"]["name"])

    assert sorted(yaml.safe_load_all(built), key=key) == sorted(render(stack), key=key)
