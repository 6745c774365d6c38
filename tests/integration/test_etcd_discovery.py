"""Real ``dyn`` processes discovering each other through a real etcd (tests/etcd.py): a request
served through the openai client, a ``kill -9``-ed worker forgotten within its lease ttl, routing
that goes on while etcd restarts (with its data, and without it), one-line errors when etcd is
unreachable, and ``dyn serve`` on etcd.

Request and answer shapes are OpenAI's chat completions (openai-python's client); the model is
dyn's embedded dyn-tiny served by mocker workers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from dyn.core.discovery.etcd_gateway import b64, prefix_end
from tests.etcd import free_port
from tests.integration.conftest import Stack, serve_ready_url
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

WORKER_TTL_S = 5.0
"""A worker's lease ttl (``WorkerSettings.lease_ttl_s``)."""


def etcd_stack(root, server, namespace: str) -> tuple[Stack, tuple[str, ...]]:
    stack = Stack(root, namespace=namespace)
    return stack, ("--discovery-backend", "etcd", "--etcd-endpoints", server.url)


def chat(stack: Stack) -> str:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    reply = client.chat.completions.create(
        model="dyn-tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert reply.choices[0].message.content is not None
    return reply.choices[0].message.content


def etcd_keys(server, namespace: str) -> int:
    prefix = f"/dyn/{namespace}/instances/"
    answer = httpx.post(
        f"{server.url}/v3/kv/range",
        json={"key": b64(prefix), "range_end": prefix_end(prefix), "count_only": True},
        trust_env=False,
    ).json()
    return int(answer.get("count", 0))


def test_a_stack_on_etcd_serves_and_forgets_a_killed_worker(etcd_server, tmp_path):
    stack, flags = etcd_stack(tmp_path, etcd_server, "etcd-it")
    try:
        stack.worker(*flags)
        doomed = stack.worker(*flags)
        stack.start_frontend(*flags)
        stack.wait_instances(2)
        assert etcd_keys(etcd_server, "etcd-it") == 2
        chat(stack)
        os.killpg(doomed.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        poll_until(
            lambda: etcd_keys(etcd_server, "etcd-it") == 1, WORKER_TTL_S + 5, "etcd to drop the killed worker"
        )
        took = time.monotonic() - killed_at
        # etcd revokes an expired lease within about half a second of its ttl
        assert took <= WORKER_TTL_S + 1.5, f"the record outlived its lease: {took:.1f}s"
        poll_until(lambda: len(stack.instances()) == 1, 5, "the frontend to drop the killed worker")
        chat(stack)
    finally:
        stack.close()


@pytest.mark.long
def test_routing_goes_on_while_etcd_restarts(etcd_server, tmp_path):
    stack, flags = etcd_stack(tmp_path, etcd_server, "etcd-restart")
    try:
        stack.worker(*flags)
        stack.start_frontend(*flags)
        stack.wait_instances(1)
        chat(stack)

        etcd_server.stop(hard=True)
        chat(stack)  # the request plane does not go through etcd
        etcd_server.start()
        time.sleep(WORKER_TTL_S + 1)  # longer than the lease: only heartbeats after the restart keep it
        assert len(stack.instances()) == 1 and etcd_keys(etcd_server, "etcd-restart") == 1
        chat(stack)
        stack.worker(*flags)  # the frontend watches again: a worker that starts now is seen
        stack.wait_instances(2, timeout=30)

        # an etcd that comes back empty: the workers register again, the frontend lists again
        etcd_server.stop(hard=True)
        shutil.rmtree(etcd_server.data_dir)
        etcd_server.start()
        poll_until(
            lambda: etcd_keys(etcd_server, "etcd-restart") == 2,
            WORKER_TTL_S + 5,
            "the workers to register again",
        )
        stack.wait_instances(2, timeout=15)
        chat(stack)
        assert "registering it again" in "".join(p.log() for p in stack.procs)
    finally:
        stack.close()


@pytest.mark.parametrize("command", [["worker", "mocker"], ["frontend", "--http-port", "0"], ["router"]])
def test_an_unreachable_etcd_is_one_line_at_start(command):
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "dyn.cli", *command, "--discovery-backend", "etcd", "--etcd-endpoints", url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert lines == [
        f"error: cannot reach etcd ({url}: cannot connect); start etcd there or point "
        "--etcd-endpoints (DYN_ETCD_ENDPOINTS) at it"
    ]


def test_dyn_serve_on_etcd(etcd_server, dyn_process):
    proc = dyn_process(
        "serve",
        "--http-port",
        "0",
        "--workers",
        "2",
        "--namespace",
        "serve-etcd",
        "--discovery-backend",
        "etcd",
        "--etcd-endpoints",
        etcd_server.url,
        "--speedup-ratio",
        "100",
    )
    url = serve_ready_url(proc)
    base = url.removesuffix("/v1")
    assert len(httpx.get(f"{base}/health", timeout=5).json()["instances"]) == 2
    assert etcd_keys(etcd_server, "serve-etcd") == 2
    assert not any(dyn_process.discovery_dir.glob("serve-etcd"))  # nothing went to the file store
    response = httpx.post(
        f"{url}/chat/completions",
        timeout=30,
        json={"model": "dyn-tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4},
    )
    assert response.status_code == 200, response.text
    assert proc.terminate(timeout=30) == 0, proc.log()
    poll_until(lambda: etcd_keys(etcd_server, "serve-etcd") == 0, 5, "the workers to deregister")
