"""Two "hosts" as Linux network namespaces made by the test (issue 19, item 3): a frontend in one,
mocker workers in the other, joined by a veth pair on a private /30; the workers bind every
interface (``--host 0.0.0.0``) with CurveZMQ keys and advertise the address the frontend's host
reaches them at. Discovery is the file store in a directory both namespaces see (network
namespaces share the filesystem); the etcd backend was not on main when this test was written.

What is checked: every endpoint in the workers' discovery records names the workers' host address
(given with ``--advertise-host``, or found as the primary address, the source address of the
default route); without a route the primary address is loopback, with a warning. Through the
OpenAI client a request is served across the namespaces, the frontend's KV router indexes the
blocks the worker's KV events announced (its ``/kv/workers``), and the repeated prompt reports
``cached_tokens`` above 0. With ``DYN_VLLM_VENV`` (the README's vLLM part) the same runs with a
real vLLM worker, whose KV-event sockets vLLM binds itself (``tcp://*:PORT``). The mocker's words are random tokens of the embedded dyn-tiny model
(dyn.plugins.mocker); only usage counts are asserted, as ``usage.prompt_tokens_details`` is
documented in OpenAI's chat completion object (and vLLM's ``--enable-prompt-tokens-details``).

Skipped, saying why, where the test may not make namespaces (no ``ip``, not root, no
CAP_NET_ADMIN): it tries to make one and reads the error. Namespaces and processes are removed in
a ``finally`` whatever happens; names are unique per test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

HOST_A, HOST_B = "10.231.0.1", "10.231.0.2"
PREFIX = 30
READY_PREFIX = "dyn frontend listening on "
NAMESPACE = "netns"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def netns_unavailable() -> str | None:
    """Why this test cannot make network namespaces here, or None when it can."""
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    probe = f"dynprobe{uuid.uuid4().hex[:8]}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace (needs root / CAP_NET_ADMIN): {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


class TwoHosts:
    """Namespaces ``a`` and ``b`` joined by a veth pair: ``HOST_A`` in ``a``, ``HOST_B`` in ``b``."""

    def __init__(self, root: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.a, self.b = f"dyn-a-{tag}", f"dyn-b-{tag}"
        self.veth_a, self.veth_b = f"dva{tag}", f"dvb{tag}"
        self.root = root
        self.procs: list[tuple[subprocess.Popen, Path]] = []
        self.env = {
            **os.environ,
            "DYN_DISCOVERY_DIR": str(root / "discovery"),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        for name in ("DYN_ADVERTISE_HOST", "DYN_HOST", "DYN_PLANE_KEYS", "DYN_NAMESPACE"):
            self.env.pop(name, None)

    def make(self) -> None:
        ip("netns", "add", self.a)
        ip("netns", "add", self.b)
        ip("link", "add", self.veth_a, "type", "veth", "peer", "name", self.veth_b)
        ip("link", "set", self.veth_a, "netns", self.a)
        ip("link", "set", self.veth_b, "netns", self.b)
        for ns, dev, address in ((self.a, self.veth_a, HOST_A), (self.b, self.veth_b, HOST_B)):
            ip("-n", ns, "addr", "add", f"{address}/{PREFIX}", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def route_b_via_a(self) -> None:
        """Give ``b`` a default route, so its primary address is ``HOST_B``."""
        ip("-n", self.b, "route", "add", "default", "via", HOST_A)

    def python(self, ns: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
        )

    def dyn(
        self, ns: str, *args: str, python: str = sys.executable, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen, Path]:
        """Start ``dyn ARGS`` in namespace ``ns`` (its own session; output in a log file)."""
        log = self.root / f"{ns}-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, python, "-m", "dyn.cli", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.env, **(env or {})},
                start_new_session=True,
            )
        self.procs.append((proc, log))
        return proc, log

    def close(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc, _ in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for ns in (self.a, self.b):  # deleting a namespace removes the veth end inside it
            ip("netns", "del", ns, check=False)

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for _, log in self.procs
        )


@pytest.fixture
def two_hosts(tmp_path):
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)
    hosts = TwoHosts(tmp_path)
    try:
        hosts.make()
        yield hosts
    finally:
        hosts.close()


CLIENT = """
import json, sys, time
import httpx
from openai import OpenAI

url, want, model, start_s = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
out = {}

def wait(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}: {out}")

def instances():
    out["health"] = httpx.get(url + "/health", timeout=5).json()
    return len(out["health"].get("instances", [])) >= want

wait(f"{want} routable workers", instances, start_s)
client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=30, max_retries=0)
prompt = "a prompt long enough to fill several KV blocks of sixteen tokens " * 12

def ask():
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=4,
        extra_body={"ignore_eos": True},
    )
    return answer.usage.model_dump()

out["first"] = ask()

def indexed():
    out["kv_workers"] = httpx.get(url + "/kv/workers", timeout=5).json()
    return sum(entry["blocks"] for entry in out["kv_workers"]) > 0

wait("the router to index KV events from the other namespace", indexed, 30)
out["second"] = ask()
print(json.dumps(out))
"""


def make_keys(root: Path) -> Path:
    keys = root / "keys"
    made = subprocess.run(
        [sys.executable, "-m", "dyn.cli", "keys", str(keys)], capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 0, made.stderr
    return keys


def serve_across(
    hosts: TwoHosts, planes: tuple[str, ...], *, workers: int, model: str, start_s: float
) -> dict:
    """Start a KV-routing frontend in ``a`` (``planes``: its keys and namespace and, for a real
    model, its path), run ``CLIENT`` in ``a`` against it, check the workers' records, and return
    the client's findings."""
    frontend, frontend_log = hosts.dyn(
        hosts.a, "frontend", "--http-host", HOST_A, "--http-port", "0", "--router-mode", "kv", *planes
    )
    url = ""
    deadline = time.monotonic() + 60
    while not url and time.monotonic() < deadline and frontend.poll() is None:
        lines = frontend_log.read_text(errors="replace").splitlines()
        url = next((line[len(READY_PREFIX) :].strip() for line in lines if line.startswith(READY_PREFIX)), "")
        time.sleep(0.2)
    assert url.startswith(f"http://{HOST_A}:"), hosts.logs()

    client = hosts.root / "client.py"
    client.write_text(CLIENT)
    ran = hosts.python(hosts.a, str(client), url, str(workers), model, str(start_s), timeout=start_s + 90)
    assert ran.returncode == 0, f"{ran.stdout}\n{ran.stderr}\n{hosts.logs()}"
    result = json.loads(ran.stdout.strip().splitlines()[-1])

    records = [
        json.loads(path.read_bytes())["record"]
        for path in (hosts.root / "discovery" / NAMESPACE / "instances").glob("*.json")
    ]
    assert len(records) == workers, records
    for record in records:
        endpoints = [e for e in record["endpoints"].values() if isinstance(e, str) and e]
        assert len(endpoints) == 4, record["endpoints"]  # request, KV events, replay, metrics
        assert all(e.startswith(f"tcp://{HOST_B}:") for e in endpoints), record["endpoints"]
    assert sorted(result["health"]["instances"]) == sorted(r["instance_id"] for r in records)

    assert result["first"]["completion_tokens"] == 4
    assert sum(entry["blocks"] for entry in result["kv_workers"]) > 0
    assert result["second"]["prompt_tokens_details"]["cached_tokens"] > 0, result
    return result


def test_workers_in_another_namespace_advertise_their_host_and_route_by_kv_events(two_hosts, tmp_path):
    hosts = two_hosts
    keys = make_keys(tmp_path)

    # without a route there is no primary address: loopback, and a warning saying what to pass
    probe = hosts.python(
        hosts.b,
        "-c",
        "import logging; logging.basicConfig(); "
        "from dyn.core.transport.sockets import primary_address; print(primary_address())",
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "127.0.0.1"
    assert "--advertise-host" in probe.stderr

    planes = ("--plane-keys", str(keys), "--namespace", NAMESPACE)
    worker = ("worker", "mocker", "--host", "0.0.0.0", "--block-size", "16", "--speedup-ratio", "100")
    hosts.dyn(hosts.b, *worker, *planes, "--advertise-host", HOST_B)
    hosts.route_b_via_a()
    hosts.dyn(hosts.b, *worker, *planes)  # advertises its primary address, the default route's source
    serve_across(hosts, planes, workers=2, model="dyn-tiny", start_s=60)


@pytest.mark.timeout(600)
def test_a_real_vllm_worker_in_another_namespace_advertises_its_own_kv_event_sockets(two_hosts, tmp_path):
    """vLLM binds its KV-event PUB and replay sockets itself (``tcp://*:PORT`` for a wildcard
    ``--host``); the worker advertises them at ``--advertise-host``, and the router subscribes
    across the namespaces (plain ZMQ: vLLM's sockets have no CurveZMQ)."""
    from tests.vllm_cpu import VENV, WHY_SKIPPED, python_and_model, vllm_env

    if not VENV:
        pytest.skip(WHY_SKIPPED)
    python, model = python_and_model()
    hosts = two_hosts
    keys = make_keys(tmp_path)
    env = {k: v for k, v in vllm_env().items() if k != "VLLM_HOST_IP"}
    planes = ("--plane-keys", str(keys), "--namespace", NAMESPACE, "--model-path", str(model))
    hosts.dyn(
        hosts.b,
        *("worker", "vllm", "--host", "0.0.0.0", "--advertise-host", HOST_B, *planes),
        python=str(python),
        env=env,
    )
    result = serve_across(hosts, planes, workers=1, model=model.name, start_s=400)
    assert result["kv_workers"][0]["endpoint"].startswith(f"tcp://{HOST_B}:")
