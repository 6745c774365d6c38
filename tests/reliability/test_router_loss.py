"""A ``dyn router`` or ``dyn indexer`` that dies or freezes is noticed like a worker (issue 31).

Before, a frontend with ``--router-address`` kept asking a SIGKILLed or SIGSTOPped ``dyn router``
and every new request waited 30 s for a 503; with ``--use-remote-indexer`` a dead ``dyn indexer``
cost a routed request its 1 s query timeout (then one in every 5 s). Now the client of either
follows its connection (ZMTP heartbeats and a socket monitor): the frontend routes by least load
at once while the router is away, and on load alone while the indexer is, and asks them again
when they are back (restarted on the same port, or thawed). Whether a request went through the
router or was asked of the indexer is read in their own ``/metrics`` counters; the frontend shows
its view in ``dyn_router_remote_reachable``.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from dyn.core.indexer.service import READY_PREFIX as INDEXER_READY
from dyn.core.logs import status_text
from dyn.core.router.service import READY_PREFIX as ROUTER_READY
from tests.integration.conftest import DynProcess, Stack
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
ROUTED = "dynamo_component_router_requests_total"
QUERIED = "dynamo_kvindexer_requests_total"
REACHABLE = "dyn_router_remote_reachable"


def status(proc: DynProcess, prefix: str) -> str | None:
    """The rest of ``proc``'s first output line that starts with ``prefix``."""
    for line in proc.log().splitlines():
        text = status_text(line)
        if text.startswith(prefix):
            return text[len(prefix) :].strip()
    if proc.proc.poll() is not None:
        raise AssertionError(f"process exited:\n{proc.log()}")
    return None


def sample(url: str, name: str, labels: str = "") -> float:
    """The sum of the samples of ``name`` whose labels contain ``labels`` at ``url`` (``/metrics``)."""
    total = 0.0
    for line in httpx.get(url, timeout=5).text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.split("{", 1)[0] == name and labels in series:
            total += float(value)
    return total


def complete(stack: Stack, prompt: str = "hello there", **extra) -> float:
    """One short completion through the frontend; its latency in seconds (it must succeed). The
    prompt spans several KV blocks, so a KV router looks its overlaps up."""
    started = time.monotonic()
    r = httpx.post(
        stack.url + "/v1/completions",
        json={
            "model": MODEL,
            "prompt": f"{prompt}: " + "some shared context " * 20,
            "max_tokens": 2,
            **extra,
        },
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return time.monotonic() - started


def reachable(stack: Stack, service: str) -> float:
    return stack.metric(REACHABLE, f'service="{service}"')


def health(stack: Stack) -> tuple[int, dict]:
    r = httpx.get(stack.url + "/health", timeout=5)
    return r.status_code, r.json()


class Router:
    """A ``dyn router`` on a fixed port, which can be restarted there."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.address = ""
        self.start(0)

    def start(self, port: int) -> None:
        self.proc = self.stack.start(
            "router", "--namespace", self.stack.namespace, "--port", str(port), "--system-port", "0"
        )
        self.metrics = poll_until(
            lambda: status(self.proc, "dyn router metrics: "), 60, "the router's metrics"
        )
        self.address = poll_until(lambda: status(self.proc, ROUTER_READY), 60, "the router")

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def routed(self) -> float:
        return sample(self.metrics, ROUTED)


@pytest.fixture(scope="module")
def routed(stack_factory):
    """2 mocker workers, a ``dyn router``, a frontend routing through it."""
    stack = stack_factory("rloss")
    stack.worker("--block-size", "16", count=2)
    router = Router(stack)
    stack.start_frontend("--router-mode", "kv", "--router-address", router.address)
    stack.wait_instances(2)
    poll_until(lambda: complete(stack), 30, "the frontend to route")
    return stack, router


def through_router(stack: Stack, router: Router) -> None:
    """Requests go through ``router`` again (its own count of routed requests grows)."""
    before = router.routed()
    poll_until(
        lambda: complete(stack) < 5 and router.routed() > before, 30, "a request routed by the dyn router"
    )


def test_a_killed_router_is_routed_around_at_once_and_used_again_when_restarted(routed):
    stack, router = routed
    through_router(stack, router)
    os.kill(router.proc.proc.pid, signal.SIGKILL)
    router.proc.proc.wait(5)
    latencies = [complete(stack, f"after the kill {i}") for i in range(5)]
    assert max(latencies) < 1.0, latencies  # was 30 s, then a 503
    assert complete(stack, "named", nvext={"backend_instance_id": stack.instances()[1]}) < 1.0
    poll_until(lambda: reachable(stack, "router") == 0, 1, "the frontend to show the router lost")
    code, body = health(stack)  # served, routed worse: it said "healthy" before
    assert code == 200 and body["status"] == "degraded", body
    assert "the dyn router at" in body["degraded"][0] and "routing by least load" in body["degraded"][0]

    router.start(router.port)  # the same port: the frontend reconnects by itself
    poll_until(lambda: reachable(stack, "router") == 1, 10, "the frontend to see the router back")
    through_router(stack, router)
    assert health(stack)[1]["status"] == "healthy"
    logged = " ".join(stack.frontend.log().split())  # the console wraps long lines
    assert logged.count("is unreachable (the connection closed") == 1
    assert logged.count("answers again; routing through it") == 1


def test_a_frozen_router_is_routed_around_within_a_second_and_used_again_when_thawed(routed):
    stack, router = routed
    through_router(stack, router)
    pid = router.proc.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        first = complete(stack, "during the freeze")  # waits for the heartbeat timeout at most
        latencies = [complete(stack, f"frozen {i}") for i in range(3)]
        assert first < 1.6 and max(latencies) < 0.5, (first, latencies)
        assert reachable(stack, "router") == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    poll_until(lambda: reachable(stack, "router") == 1, 10, "the frontend to see the router back")
    through_router(stack, router)


def test_a_killed_indexer_costs_no_request_its_timeout_and_is_asked_again_when_restarted(stack_factory):
    stack = stack_factory("iloss")
    stack.worker("--block-size", "16", count=2)

    def indexer(port: int) -> tuple[DynProcess, str, str]:
        proc = stack.start(
            "indexer", "--namespace", stack.namespace, "--http-port", "0", "--zmq-port", str(port)
        )
        ready = poll_until(lambda: status(proc, INDEXER_READY), 60, "the dyn indexer")
        fields = dict(part.split("=", 1) for part in ready.split())
        return proc, fields["http"] + "/metrics", fields["zmq"]

    proc, metrics, address = indexer(0)
    stack.start_frontend("--router-mode", "kv", "--use-remote-indexer", "--indexer-address", address)
    stack.wait_instances(2)

    def asked(metrics: str) -> None:
        before = sample(metrics, QUERIED, 'endpoint="zmq_query"')
        poll_until(
            lambda: complete(stack) and sample(metrics, QUERIED, 'endpoint="zmq_query"') > before,
            30,
            "the router to ask the indexer",
        )

    asked(metrics)
    os.kill(proc.proc.pid, signal.SIGKILL)
    proc.proc.wait(5)
    latencies = [complete(stack, f"after the kill {i}") for i in range(5)]
    assert max(latencies) < 0.5, latencies  # was the 1 s query timeout
    poll_until(lambda: reachable(stack, "indexer") == 0, 1, "the frontend to show the indexer lost")
    code, body = health(stack)
    assert code == 200 and body["status"] == "degraded" and "routing on load alone" in body["degraded"][0]

    _, metrics, _ = indexer(int(address.rsplit(":", 1)[1]))
    poll_until(lambda: reachable(stack, "indexer") == 1, 10, "the frontend to see the indexer back")
    asked(metrics)  # at once: no back-off to wait out
