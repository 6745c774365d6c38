"""deploy/'s Kubernetes manifests, checked without a cluster: each rendered stack is valid for the
Kubernetes version we pin, every ``dyn`` command line in it parses with dyn's own CLI, and the
pieces that make dyn work on a cluster (plane keys, advertised address, probes, drain, GPUs)
are wired the way the processes need them.

Schemas: the ``kubernetes-validate`` package's copies of the Kubernetes OpenAPI schemas, strict
(an unknown field is an error). Probe paths are checked against live processes in
test_observability.py.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import typer
import yaml

from tests.deploy.kustomize import kustomization, read_documents, render
from tests.deploy.stacks import (
    DEPLOY,
    K8S,
    KUBERNETES_VERSION,
    POD_IP,
    STACKS,
    USER_MODEL,
    dyn_containers,
    env_twins,
    flag_value,
    overlay,
    parse_dyn,
    render_stack,
    workloads,
)

KEYS_SECRET = "dyn-plane-keys"


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    root = tmp_path_factory.mktemp("stacks")
    return {stack: render_stack(root, stack) for stack in STACKS}


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("stack", STACKS)
def test_every_resource_is_valid_for_the_pinned_kubernetes(stacks, stack):
    resources = stacks[stack]
    assert resources
    for resource in resources:
        try:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{stack}: {resource['kind']} {resource['metadata']['name']}: {exc.message}")


def test_every_manifest_file_is_part_of_a_stack():
    used: set[Path] = set()
    for kustomization_file in DEPLOY.rglob("kustomization.yaml"):
        directory = kustomization_file.parent
        spec = kustomization(directory)
        used.update((directory / r).resolve() for r in spec.get("resources", []))
        used.update((directory / p["path"]).resolve() for p in spec.get("patches", []))
    orphans = [p for p in manifest_files() if p.resolve() not in used]
    assert not orphans, f"not in any kustomization: {orphans}"
    component_dirs = {p.parent for p in K8S.rglob("kustomization.yaml")}
    for directory in component_dirs:
        assert kustomization(directory)["kind"] == "Component", directory


def test_the_stacks_hold_what_docs_deploy_promises(stacks):
    base = {(r["kind"], r["metadata"]["name"]) for r in stacks["base"]}
    assert {
        ("StatefulSet", "etcd"),
        ("Service", "etcd"),
        ("Deployment", "dyn-frontend"),
        ("Service", "dyn-frontend"),
        ("Deployment", "dyn-router"),
        ("Deployment", "dyn-indexer"),
        ("Deployment", "dyn-worker-mocker"),
        ("ConfigMap", "dyn-prometheus"),
        ("ConfigMap", "dyn-grafana-dashboard"),
    } <= base
    for engine in ("vllm", "sglang"):
        by_name = {r["metadata"]["name"]: r for r in workloads(stacks[engine])}
        assert by_name["dyn-worker-mocker"]["spec"]["replicas"] == 0
        assert by_name[f"dyn-worker-{engine}"]["spec"]["replicas"] >= 1
        model = next(r for r in stacks[engine] if r["metadata"]["name"] == "dyn-model")
        assert model["data"] == {"DYN_MODEL_PATH": USER_MODEL}


def test_the_shipped_observability_files_are_the_configmaps(stacks):
    maps = {r["metadata"]["name"]: r for r in stacks["base"] if r["kind"] == "ConfigMap"}
    assert (
        maps["dyn-prometheus"]["data"]["prometheus.yml"] == (DEPLOY / "prometheus/kubernetes.yml").read_text()
    )
    dashboard = maps["dyn-grafana-dashboard"]
    assert dashboard["data"]["dyn.json"] == (DEPLOY / "grafana/dyn.json").read_text()
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


@pytest.mark.parametrize("stack", STACKS)
def test_dyns_images_are_pinned_to_this_release(stacks, stack):
    """An untagged image is ``:latest``, which the kubelet pulls again on every start and which
    may be another build than the manifests were written for."""
    version = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["version"]
    images = {
        c["image"]
        for w in workloads(stacks[stack])
        for c in [
            *w["spec"]["template"]["spec"].get("initContainers", []),
            *w["spec"]["template"]["spec"]["containers"],
        ]
    }
    ours = {image for image in images if image.split(":")[0] in ("dyn", "dyn-vllm", "dyn-sglang")}
    assert ours and all(image.endswith(f":{version}") for image in ours), sorted(images)
    assert all(":" in image.rsplit("/", 1)[-1] for image in images), sorted(images)


@pytest.mark.parametrize("stack", STACKS)
def test_every_dyn_command_line_parses_with_dyns_cli(stacks, stack):
    containers = dyn_containers(stacks[stack])
    assert {c.workload["metadata"]["name"] for c in containers} >= {
        "dyn-frontend",
        "dyn-router",
        "dyn-indexer",
        "dyn-worker-mocker",
    }
    for c in containers:
        try:
            contexts = parse_dyn(c.argv, c.env)
        except typer.TyperException as exc:
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            pytest.fail(f"{stack}: {c.name}: dyn {' '.join(c.argv)}: {message}")
        leaf = contexts[-1]
        # pass-through commands (vllm, sglang) would hand unknown flags to the engine: none here
        assert leaf.args == [], f"{c.name}: flags dyn does not know: {leaf.args}"
        unknown = {n for n in c.env if n.startswith("DYN_")} - env_twins(contexts)
        assert not unknown, f"{c.name}: no dyn {leaf.command_path} reads {sorted(unknown)}"


def test_a_wrong_flag_in_a_manifest_would_fail_the_parse(stacks):
    """The parse above catches what it must: an unknown flag, a bad value, a bad twin."""
    frontend = next(
        c for c in dyn_containers(stacks["base"]) if c.workload["metadata"]["name"] == "dyn-frontend"
    )
    parse_dyn(frontend.argv, frontend.env)
    with pytest.raises(typer.TyperException, match="--etcd-endpoint"):
        parse_dyn([*frontend.argv, "--etcd-endpoint", "http://etcd:2379"], frontend.env)
    with pytest.raises(typer.BadParameter):
        parse_dyn([*frontend.argv, "--http-port", "eighty"], frontend.env)
    with pytest.raises(typer.BadParameter) as bad_twin:
        parse_dyn(
            [a for a in frontend.argv if a not in ("--migration-limit", "3")], {"DYN_MIGRATION_LIMIT": "-1"}
        )
    assert "DYN_MIGRATION_LIMIT" in bad_twin.value.format_message()
    vllm = next(
        c for c in dyn_containers(stacks["vllm"]) if c.workload["metadata"]["name"] == "dyn-worker-vllm"
    )
    with pytest.raises(typer.TyperException, match="model.path"):
        parse_dyn(vllm.argv, {k: v for k, v in vllm.env.items() if k != "DYN_MODEL_PATH"})


@pytest.mark.parametrize("stack", STACKS)
def test_processes_that_listen_beyond_loopback_have_keys_and_advertise_the_pod_ip(stacks, stack):
    for c in dyn_containers(stacks[stack]):
        contexts = parse_dyn(c.argv, c.env)
        params = contexts[-1].params
        keys = params["plane_keys"]
        assert keys, f"{c.name}: every dyn process of a cluster needs --plane-keys"
        # a frontend routing through a dyn router binds no ZMQ socket (replica sync is the router's)
        binds_zmq = params.get("host") is not None and not params.get("router_address")
        if binds_zmq:
            assert params["host"] == "0.0.0.0", c.name
            assert params["advertise_host"] == POD_IP, f"{c.name}: advertises {params['advertise_host']}"
        mount = next(m for m in c.container["volumeMounts"] if keys.startswith(m["mountPath"] + "/"))
        volume = next(v for v in c.pod["volumes"] if v["name"] == mount["name"])
        assert volume["emptyDir"]["medium"] == "Memory", c.name
        (init,) = [i for i in c.pod["initContainers"] if i["name"] == "plane-keys"]
        script = init["command"][-1]
        assert f"install -d -m 0700 {keys}" in script, c.name
        secret_mount = next(m for m in init["volumeMounts"] if m["mountPath"] in script)
        secret = next(v for v in c.pod["volumes"] if v["name"] == secret_mount["name"])
        assert secret["secret"]["secretName"] == KEYS_SECRET
        user = c.pod["securityContext"]
        assert user["runAsUser"] == user["fsGroup"], "the Secret's files are read through fsGroup"
        assert secret["secret"]["defaultMode"] & 0o040, "the Secret's files must be group-readable"


def test_the_init_container_makes_a_key_directory_dyn_accepts(stacks, tmp_path):
    """Run the init container's script here on a copy of a Secret volume laid out as the kubelet
    lays it out (files are links into a ..data directory, read-only, group-readable) and load
    the result as ``--plane-keys`` does."""
    from dyn.core.transport.sockets import PlaneKeyError, load_plane_keys, write_plane_keys

    frontend = next(
        c for c in dyn_containers(stacks["base"]) if c.workload["metadata"]["name"] == "dyn-frontend"
    )
    (init,) = frontend.pod["initContainers"]
    secret_path = next(m["mountPath"] for m in init["volumeMounts"] if m.get("readOnly"))
    keys_path = parse_dyn(frontend.argv, frontend.env)[-1].params["plane_keys"]
    made = write_plane_keys(tmp_path / "made")
    volume = tmp_path / "secret"
    data = volume / "..2026_11_24_06_00_00.000000001"
    data.mkdir(parents=True)
    for key in made.iterdir():
        (data / key.name).write_bytes(key.read_bytes())
        os.chmod(data / key.name, 0o440)
        (volume / key.name).symlink_to(Path("..data") / key.name)
    (volume / "..data").symlink_to(data.name)
    with pytest.raises(PlaneKeyError):
        load_plane_keys(volume)  # what a Secret mounted as is looks like to dyn
    run = tmp_path / "run"
    script = init["command"][-1].replace(secret_path, str(volume)).replace(keys_path, str(run / "keys"))
    run.mkdir()
    subprocess.run([*init["command"][:-1], script], check=True, timeout=30)
    keys = load_plane_keys(run / "keys")
    assert keys.server_secret is not None
    assert stat.S_IMODE((run / "keys").stat().st_mode) == 0o700
    assert sorted(p.name for p in (run / "keys").iterdir()) == sorted(p.name for p in made.iterdir())


@pytest.mark.parametrize("stack", STACKS)
def test_worker_grace_period_outlasts_the_drain(stacks, stack):
    """SIGTERM makes a worker leave discovery and drain for --drain-timeout (core/worker/host.py);
    the kubelet's SIGKILL must come later, with room for the engine to close."""
    workers = 0
    for c in dyn_containers(stacks[stack]):
        contexts = parse_dyn(c.argv, c.env)
        if contexts[1].info_name != "worker":
            continue
        workers += 1
        drain = contexts[-1].params["drain_timeout"]
        grace = c.pod["terminationGracePeriodSeconds"]
        assert grace >= drain + 10, f"{c.name}: grace {grace}s for a {drain}s drain"
        assert c.container["command"] == ["dyn"], f"{c.name}: dyn itself must get the SIGTERM (no shell)"
        assert c.pod.get("shareProcessNamespace"), f"{c.name}: dyn must not be PID 1 (it ignores SIGTERM)"
    assert workers


def test_the_frontend_drains_before_the_grace_period_ends(stacks):
    from dataclasses import fields

    from dyn.core.frontend.server import FrontendSettings

    (frontend,) = [
        c for c in dyn_containers(stacks["base"]) if c.workload["metadata"]["name"] == "dyn-frontend"
    ]
    pre_stop = frontend.container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    shutdown = next(f.default for f in fields(FrontendSettings) if f.name == "graceful_shutdown_s")
    assert isinstance(shutdown, float)
    budget = float(pre_stop[1]) + shutdown
    assert frontend.pod["terminationGracePeriodSeconds"] > budget


def test_probes_use_the_ports_the_processes_listen_on(stacks):
    """Each probe's port is the one the command line serves HTTP on (paths: test_observability)."""
    served = {"frontend": "http_port", "router": "system_port", "indexer": "http_port"}
    for c in dyn_containers(stacks["base"]):
        leaf = parse_dyn(c.argv, c.env)[-1]
        ports = {p["name"]: p["containerPort"] for p in c.container.get("ports", [])}
        probes = [
            c.container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in c.container
        ]
        command = leaf.command.name
        if command not in served:
            assert not probes, f"{c.name}: workers serve no HTTP to probe"
            continue
        assert {"readinessProbe", "livenessProbe"} <= set(c.container), c.name
        for probe in probes:
            port = probe["httpGet"]["port"]
            assert ports.get(port, port) == leaf.params[served[command]], f"{c.name}: probe port {port}"
        annotations = c.workload["spec"]["template"]["metadata"]["annotations"]
        assert int(annotations["prometheus.io/port"]) == leaf.params[served[command]], c.name


@pytest.mark.parametrize("stack", STACKS)
def test_every_service_reaches_a_port_of_the_pods_it_selects(stacks, stack):
    services = [r for r in stacks[stack] if r["kind"] == "Service"]
    for service in services:
        selector = service["spec"]["selector"]
        pods = [
            w["spec"]["template"]
            for w in workloads(stacks[stack])
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert pods, f"Service {service['metadata']['name']} selects no pod"
        for pod in pods:
            named = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
            for port in service["spec"]["ports"]:
                assert port["targetPort"] in named, f"{service['metadata']['name']}: {port['targetPort']}"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_gpu_workers_ask_for_gpus_and_read_the_shared_model(stacks, engine):
    (worker,) = [
        c for c in dyn_containers(stacks[engine]) if c.workload["metadata"]["name"] == f"dyn-worker-{engine}"
    ]
    assert worker.container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert parse_dyn(worker.argv, worker.env)[-1].params["model_path"] == USER_MODEL
    for c in dyn_containers(stacks[engine]):
        if c.workload["metadata"]["name"] in ("dyn-frontend", f"dyn-worker-{engine}"):
            mounts = {m["mountPath"] for m in c.container["volumeMounts"]}
            assert "/models" in mounts and USER_MODEL.startswith("/models/"), c.name
            assert c.env["DYN_MODEL_PATH"] == USER_MODEL, c.name


def test_etcd_serves_the_endpoint_dyn_is_given(stacks):
    (etcd,) = [w for w in workloads(stacks["base"]) if w["metadata"]["name"] == "etcd"]
    (service,) = [r for r in stacks["base"] if r["kind"] == "Service" and r["metadata"]["name"] == "etcd"]
    port = service["spec"]["ports"][0]["port"]
    args = etcd["spec"]["template"]["spec"]["containers"][0]["command"]
    assert f"--advertise-client-urls=http://etcd:{port}" in args
    for c in dyn_containers(stacks["base"]):
        assert flag_value(c.argv, "--discovery-backend") == "etcd", c.name
        assert flag_value(c.argv, "--etcd-endpoints") == f"http://etcd:{port}", c.name


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not installed: no kustomize to compare with"
)
@pytest.mark.parametrize("stack", STACKS)
def test_the_python_rendering_is_what_kubectl_kustomize_builds(tmp_path, stack):
    directory = overlay(tmp_path, stack)
    built = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=True
    ).stdout

    def key(r):
        return (r["kind"], r["metadata"]["name"])

    assert sorted(yaml.safe_load_all(built), key=key) == sorted(render(directory), key=key)


def test_manifest_files_parse_as_yaml():
    for path in manifest_files():
        assert read_documents(path), path
