"""The base stack of deploy/ run as its manifests say, on this machine: the exact ``dyn`` command
lines and environment of each container, with a real etcd, plane keys made by ``dyn keys`` as
docs/deploy.md makes them, and only what a pod has and a test must not use replaced: loopback
instead of the pod's interfaces (0.0.0.0) and pod IP, free ports instead of the fixed ones, the
test's etcd instead of the Service ``etcd``. A chat completion is served through the openai
client with the frontend's API key, KV events reach the router across the encrypted planes, the
probes answer, and a worker's SIGTERM drains it out of etcd.

Request and answer shapes are OpenAI's chat completions (openai-python's client); the model is
dyn's embedded dyn-tiny served by mocker workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import openai
import pytest

from tests.deploy.stacks import POD_IP, DynContainer, dyn_containers, render_stack
from tests.etcd import free_port
from tests.integration.conftest import DynProcess
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

PORT_FLAGS = ("--http-port", "--port", "--system-port", "--zmq-port")
PROMPT = "Describe how a KV cache speeds up decoding, step by step, for a new engineer. " * 10


def on_this_machine(c: DynContainer, etcd_url: str, keys: str) -> tuple[list[str], dict[str, str]]:
    """``c``'s argv and environment with the pod-only values replaced (see the module docstring)."""
    argv = list(c.argv)
    for i, arg in enumerate(argv[:-1]):
        if arg in PORT_FLAGS:
            argv[i + 1] = str(free_port())
    argv = [
        "127.0.0.1"
        if a == "0.0.0.0"
        else etcd_url
        if a == "http://etcd:2379"
        else keys
        if a == "/run/dyn/keys"
        else a
        for a in argv
    ]
    assert "0.0.0.0" not in argv and not any("etcd:2379" in a for a in argv)
    env = {name: ("127.0.0.1" if value == POD_IP else value) for name, value in c.env.items()}
    return argv, env


def status(proc: DynProcess, prefix: str, timeout: float = 60) -> str:
    """The rest of the JSON log record whose message starts with ``prefix`` (``--log-format json``)."""

    def found() -> str | None:
        for line in proc.log().splitlines():
            try:
                message = json.loads(line).get("message", "")
            except ValueError:
                continue
            if message.startswith(prefix):
                return message[len(prefix) :].strip()
        if proc.proc.poll() is not None:
            raise AssertionError(f"exited {proc.proc.returncode}:\n{proc.log()[-3000:]}")
        return None

    return poll_until(found, timeout, f"{prefix!r} from {proc.log_path.name}")


@pytest.mark.long
def test_the_base_stack_serves_as_its_manifests_run_it(etcd_server, tmp_path):
    keys = tmp_path / "plane-keys"
    subprocess.run(
        [sys.executable, "-m", "dyn.cli", "keys", str(keys)], check=True, timeout=60, capture_output=True
    )
    containers = {c.workload["metadata"]["name"]: c for c in dyn_containers(render_stack(tmp_path, "base"))}
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    procs: list[DynProcess] = []

    def start(name: str, index: int = 0) -> tuple[DynProcess, list[str]]:
        argv, env = on_this_machine(containers[name], etcd_server.url, str(keys))
        proc = DynProcess(argv, tmp_path / f"{name}-{index}.log", {**base_env, **env, "HF_HUB_OFFLINE": "1"})
        procs.append(proc)
        return proc, argv

    try:
        router, _ = start("dyn-router")
        router_metrics = status(router, "dyn router metrics: ")
        indexer, _ = start("dyn-indexer")
        indexer_http = status(indexer, "dyn indexer ready: ").split()[0].removeprefix("http=")
        replicas = containers["dyn-worker-mocker"].workload["spec"]["replicas"]
        workers = [start("dyn-worker-mocker", i)[0] for i in range(replicas)]
        frontend, _ = start("dyn-frontend")
        url = status(frontend, "dyn frontend listening on ")
        api_key = containers["dyn-frontend"].env["DYN_API_KEY"]

        def workers_seen() -> int:  # a public probe gets the count; the ids need the key
            return httpx.get(f"{url}/health", timeout=5).json().get("workers", 0)

        poll_until(lambda: workers_seen() == replicas, 60, f"{replicas} workers behind the frontend")
        for path in ("/health", "/live", "/metrics"):
            assert httpx.get(f"{url}{path}", timeout=10).status_code == 200, path
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401

        client = openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=60)
        messages = [{"role": "user", "content": PROMPT}]
        first = client.chat.completions.create(model="dyn-tiny", messages=messages, max_tokens=8)
        assert first.choices[0].message.content is not None

        def cached() -> int:
            reply = client.chat.completions.create(model="dyn-tiny", messages=messages, max_tokens=8)
            return reply.usage.prompt_tokens_details.cached_tokens

        assert poll_until(cached, 20, "the repeated prompt to find its KV blocks") > 0
        applied = httpx.get(router_metrics, timeout=10).text
        assert any(
            line.startswith("dynamo_component_kv_cache_events_applied_total") and float(line.split()[-1]) > 0
            for line in applied.splitlines()
        ), "KV events never reached the router"
        assert httpx.get(f"{indexer_http}/health", timeout=10).status_code == 200

        workers[0].proc.send_signal(signal.SIGTERM)
        poll_until(lambda: workers_seen() == replicas - 1, 15, "the drained worker to leave discovery")
        assert workers[0].proc.wait(30) == 0, workers[0].log()[-3000:]
    finally:
        for proc in reversed(procs):
            try:
                proc.terminate(timeout=10)
            except subprocess.TimeoutExpired:
                pass
