"""``dyn router`` end to end: real mocker workers, router services and frontends in one namespace.

The routers run in approximate mode (``--no-router-kv-events``): they know only the decisions they
make or hear, so a prefix sent through one frontend lands on its cached worker when sent through
another only if both frontends share a router's decisions. Each group's first request picks a
worker at random among equally loaded ones; a later hit through the other frontend therefore
shows the sharing (several groups make a chance pass unlikely). The hit is read in
``usage.prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import json

import httpx
import pytest

from dyn.core.logs import status_text
from tests.integration.conftest import READY_PREFIX, DynProcess, Stack
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

MODEL = "dyn-tiny"
BLOCK = 16
ROUTER_READY = "dyn router ready: zmq="
APPROX = ("--no-router-kv-events",)


def _prompt(group: int, tail: int) -> str:
    # ~50 blocks of shared prefix per group, then a short distinct tail
    return f"Group {group} shared context: " + f"fact {group} is important. " * 120 + f"Question {tail}?"


def _cached_fraction(url: str, prompt: str) -> float:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    return r.usage.prompt_tokens_details.cached_tokens / r.usage.prompt_tokens


def _ready(proc: DynProcess, prefix: str) -> str | None:
    for line in proc.log().splitlines():
        text = status_text(line)  # a JSON object with --log-format json
        if text.startswith(prefix):
            return text[len(prefix) :].strip()
    if proc.proc.poll() is not None:
        raise AssertionError(f"process exited:\n{proc.log()}")
    return None


def _logged(proc: DynProcess, text: str) -> list[dict]:
    """The JSON log records (``--log-format json``) whose message contains ``text``."""
    found = []
    for line in proc.log().splitlines():
        if line.startswith("{") and text in line:
            record = json.loads(line)
            if text in record.get("message", ""):
                found.append(record)
    return found


class RouterStack:
    """3 mocker workers; router ``shared`` behind frontends ``a``, ``b`` and ``auto`` (with
    ``--router-address auto``); replica-synced routers ``r1``, ``r2`` behind ``c``, ``d``."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        ns = stack.namespace
        stack.worker("--block-size", str(BLOCK), count=3)
        self.routers = {
            "shared": self._router("--system-port", "0", *APPROX),
            "r1": self._router("--router-replica-sync", *APPROX),
            "r2": self._router("--router-replica-sync", *APPROX),
        }
        self.address = {
            name: poll_until(lambda p=p: _ready(p, ROUTER_READY), 60, f"router {name}")
            for name, p in self.routers.items()
        }
        targets = {
            "a": self.address["shared"],
            "b": self.address["shared"],
            "auto": "auto",
            "c": self.address["r1"],
            "d": self.address["r2"],
        }
        self.frontends = {
            name: stack.start(
                "--log-format",
                "json",
                "frontend",
                "--http-port",
                "0",
                "--namespace",
                ns,
                "--router-mode",
                "kv",
                "--router-address",
                target,
            )
            for name, target in targets.items()
        }
        self.url = {
            name: poll_until(lambda p=p: _ready(p, READY_PREFIX), 60, f"frontend {name}")
            for name, p in self.frontends.items()
        }
        for name, url in self.url.items():
            poll_until(lambda u=url: len(_instances(u)) == 3, 30, f"frontend {name} to see 3 workers")

    def _router(self, *args: str) -> DynProcess:
        return self.stack.start("--log-format", "json", "router", "--namespace", self.stack.namespace, *args)


def _instances(url: str) -> list[int]:
    try:
        return httpx.get(url + "/health", timeout=5).json().get("instances", [])
    except httpx.HTTPError:
        return []


@pytest.fixture(scope="module")
def routers(stack_factory):
    return RouterStack(stack_factory("rsvc"))


def _shared_groups(first_url: str, then_url: str, groups: range) -> list[list[float]]:
    """Per group: its first request through ``first_url``, then the cached fractions of two
    requests with other tails through ``then_url``."""
    out = []
    for group in groups:
        _cached_fraction(first_url, _prompt(group, 0))
        out.append([_cached_fraction(then_url, _prompt(group, tail)) for tail in (1, 2)])
    return out


def test_two_frontends_share_one_router(routers):
    fractions = _shared_groups(routers.url["a"], routers.url["b"], range(4))
    assert min(min(f) for f in fractions) > 0.8, fractions


def test_router_address_auto_finds_a_router(routers):
    chosen = _logged(routers.frontends["auto"], "routing through the dyn router at ")
    assert chosen and chosen[0]["message"].rsplit(" ", 1)[1] in routers.address.values()
    fractions = _shared_groups(routers.url["auto"], routers.url["auto"], range(10, 12))
    assert min(min(f) for f in fractions) > 0.8, fractions


def test_replica_sync_shares_decisions_between_routers(routers):
    r1, r2 = routers.routers["r1"], routers.routers["r2"]
    poll_until(
        lambda: (
            _logged(r1, "replica sync: following router") and _logged(r2, "replica sync: following router")
        ),
        20,
        "the replicas to find each other",
    )
    # PUB/SUB drops what is sent before the subscription is live: warm up until r2 hears r1
    for warmup in range(100, 120):
        _cached_fraction(routers.url["c"], _prompt(warmup, 0))
        try:
            poll_until(lambda: _logged(r2, "replica sync: first event from router"), 1, "r2 to hear r1")
            break
        except AssertionError:
            continue
    else:
        raise AssertionError("router r2 never heard router r1:\n" + r2.log()[-3000:])
    fractions = _shared_groups(routers.url["c"], routers.url["d"], range(20, 24))
    assert min(min(f) for f in fractions) > 0.8, fractions


def test_the_standalone_router_serves_its_metrics_on_the_system_port(routers):
    url = poll_until(
        lambda: _ready(routers.routers["shared"], "dyn router metrics: "), 30, "the router's metrics URL"
    )
    _cached_fraction(routers.url["a"], _prompt(40, 1))

    def counted() -> str | None:
        text = httpx.get(url, timeout=5).text
        for line in text.splitlines():
            if line.startswith("dynamo_component_router_requests_total{"):
                return text if float(line.rsplit(" ", 1)[1]) > 0 else None
        return None

    text = poll_until(counted, 10, "a routed request to be counted")
    assert "dynamo_frontend_worker_last_time_to_first_token_seconds{" in text


def _booked(metrics_url: str) -> float:
    """Decode blocks the router books on all workers (its ``/metrics``)."""
    total = 0.0
    for line in httpx.get(metrics_url, timeout=5).text.splitlines():
        if line.startswith("dynamo_frontend_worker_active_decode_blocks{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_frontend_killed_mid_stream_leaves_no_booking_in_the_router(stack_factory):
    """Issue 16: a frontend that dies after routing through ``dyn router`` must not leave its
    bookings to the 300 s stale expiry. The router notices the frontend's connection close
    (its once-a-second probe of each client fails) and frees them within seconds."""
    stack = stack_factory("rcrash")
    # real time, so the stream lasts; no drain on stop for the stream nobody reads any more
    stack.start("worker", "mocker", "--namespace", stack.namespace, "--drain-timeout", "0")
    router = stack.start("router", "--namespace", stack.namespace, "--system-port", "0")
    address = poll_until(lambda: _ready(router, ROUTER_READY), 60, "the router")
    metrics = poll_until(lambda: _ready(router, "dyn router metrics: "), 30, "the router's metrics")
    frontend = stack.start(
        "frontend",
        "--http-port",
        "0",
        "--namespace",
        stack.namespace,
        "--router-mode",
        "kv",
        "--router-address",
        address,
    )
    url = poll_until(lambda: _ready(frontend, READY_PREFIX), 60, "the frontend")
    poll_until(lambda: len(_instances(url)) == 1, 30, "the frontend to see the worker")
    poll_until(
        lambda: (
            httpx.post(
                url + "/v1/completions", timeout=10, json={"model": MODEL, "prompt": "hi", "max_tokens": 1}
            ).status_code
            == 200
        ),
        30,
        "the router to see the worker",
    )

    body = {"model": MODEL, "prompt": _prompt(1, 1), "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()  # kept open: a closed stream is a client that left
        for line in lines:
            if line.startswith("data: {"):
                break  # the request is generating: its booking is live in the router
        assert _booked(metrics) > 0
        frontend.proc.kill()
        frontend.proc.wait(10)
        poll_until(lambda: _booked(metrics) == 0, 5, "the router to free the dead frontend's booking")
    assert router.proc.poll() is None
