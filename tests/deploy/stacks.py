"""The Kubernetes stacks deploy/ describes, rendered, and the ``dyn`` command lines in them.

``STACKS`` names each way docs/deploy.md tells a user to deploy: the base (``kubectl apply -k
deploy/``: mocker workers) and the base with the vLLM or the SGLang component, through a
kustomization of the user's own that names its model (``overlay``). ``dyn_containers`` lists the
containers that run ``dyn`` with the environment Kubernetes would give them, and ``parse_dyn``
reads such a command line with dyn's real Click commands, as the console script would.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import typer.core
import typer.main
import yaml

from tests.deploy.kustomize import Resource, render

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
STACKS = ("base", "vllm", "sglang")
USER_MODEL = "/models/Llama-3.1-8B-Instruct"
"""The model the user's kustomization names in ``overlay`` (the ConfigMap dyn-model)."""
KUBERNETES_VERSION = "1.30"
"""The oldest Kubernetes the manifests are written for; they are validated against its schemas."""
POD_IP = "10.42.0.7"
"""What ``status.podIP`` stands for when a container's environment is worked out here."""


def overlay(root: Path, stack: str) -> Path:
    """A user's kustomization in ``root`` for ``stack``, as docs/deploy.md writes it: deploy/
    (through a link, as a checkout beside it would be) plus the engine's component and the
    user's model. Returns its directory."""
    link = root / "dyn-deploy"
    if not link.exists():
        link.symlink_to(DEPLOY, target_is_directory=True)
    directory = root / stack
    directory.mkdir(exist_ok=True)
    spec: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../dyn-deploy"],
    }
    if stack != "base":
        spec["components"] = [f"../dyn-deploy/k8s/{stack}"]
        spec["configMapGenerator"] = [
            {
                "name": "dyn-model",
                "literals": [f"DYN_MODEL_PATH={USER_MODEL}"],
                "options": {"disableNameSuffixHash": True},
            }
        ]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return directory


def render_stack(root: Path, stack: str) -> list[Resource]:
    return render(overlay(root, stack))


@dataclass
class DynContainer:
    """One container that runs ``dyn``: its workload, its argv after ``dyn``, its environment."""

    workload: Resource
    container: dict[str, Any]
    argv: list[str]
    env: dict[str, str]

    @property
    def name(self) -> str:
        return f"{self.workload['metadata']['name']}/{self.container['name']}"

    @property
    def pod(self) -> dict[str, Any]:
        return self.workload["spec"]["template"]["spec"]


def workloads(resources: list[Resource]) -> list[Resource]:
    return [r for r in resources if r["kind"] in ("Deployment", "StatefulSet")]


def dyn_containers(resources: list[Resource]) -> list[DynContainer]:
    """Every container (init containers too) whose command is ``dyn``."""
    config_maps = {r["metadata"]["name"]: r.get("data", {}) for r in resources if r["kind"] == "ConfigMap"}
    found = []
    for workload in workloads(resources):
        pod = workload["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            argv = [*container.get("command", []), *container.get("args", [])]
            if argv[:1] == ["dyn"]:
                found.append(
                    DynContainer(workload, container, argv[1:], _environment(container, config_maps))
                )
    return found


def _environment(container: dict[str, Any], config_maps: dict[str, dict[str, str]]) -> dict[str, str]:
    """The variables Kubernetes gives ``container``: ``envFrom`` ConfigMaps, then ``env`` (which
    wins); a Secret's value is a stand-in, ``status.podIP`` is ``POD_IP``."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]
        if ref["name"] in config_maps:
            env.update(config_maps[ref["name"]])
        elif not ref.get("optional"):
            raise AssertionError(f"{container['name']}: no ConfigMap {ref['name']} in the stack")
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
            continue
        source = variable["valueFrom"]
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "status.podIP", variable
            env[variable["name"]] = POD_IP
        elif "secretKeyRef" in source:
            env[variable["name"]] = "secret-from-the-cluster"
        else:
            raise AssertionError(f"unexpected env source {variable}")
    return env


@contextmanager
def dyn_environment(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with no ``DYN_*`` variable but those of ``env``, restored after."""
    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if n.startswith("DYN_")]:
            del os.environ[name]
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parse_dyn(argv: list[str], env: dict[str, str]) -> list[typer.Context]:
    """The Click contexts (``dyn``, then each subcommand) that ``dyn ARGV`` builds under ``env``:
    every flag and environment twin converted and checked as when the command runs, nothing
    run. Raises Click's usage errors (``typer.TyperException``: a ``typer.BadParameter``, a
    missing or unknown option) as the command line would. Typer carries its own copy of Click,
    so its classes are Typer's."""
    from dyn.cli.app import app
    from dyn.cli.options import expand_multi_value

    command: Any = typer.main.get_command(app)
    args = expand_multi_value(argv)
    contexts: list[typer.Context] = []
    with dyn_environment(env):
        parent = None
        name = "dyn"
        while True:
            ctx = command.make_context(name, list(args), parent=parent)
            contexts.append(ctx)
            if not isinstance(command, typer.core.TyperGroup):
                return contexts
            rest = [*ctx._protected_args, *ctx.args]
            name, sub, args = command.resolve_command(ctx, rest)
            assert sub is not None and name is not None
            command, parent = sub, ctx


def env_twins(contexts: list[typer.Context]) -> set[str]:
    """Every environment variable the commands of ``contexts`` read."""
    names: set[str] = set()
    for ctx in contexts:
        for param in ctx.command.params:
            envvar = getattr(param, "envvar", None)
            if isinstance(envvar, str):
                names.add(envvar)
            elif envvar:
                names.update(envvar)
    return names


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value after ``flag`` in ``argv`` (None when absent)."""
    return argv[argv.index(flag) + 1] if flag in argv else None
