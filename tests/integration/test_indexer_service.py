"""``dyn indexer`` as a real process beside real mocker workers and a frontend: it follows the
workers through discovery (or a static ``--workers`` list), indexes what they cache, and answers
over HTTP and ZMQ with the same scores."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.indexer.client import RemoteIndexer, resolve_indexer_address
from dyn.core.indexer.service import READY_PREFIX
from tests.integration.conftest import DynProcess, Stack
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

BLOCK = 16
NAMESPACE = "idx"


def records(stack: Stack, namespace: str = NAMESPACE):
    return anyio.run(FileDiscoveryStore(stack.root / "discovery", namespace).list)


def start_indexer(stack: Stack, *args: str, namespace: str = NAMESPACE) -> tuple[DynProcess, str, str]:
    """Start ``dyn indexer`` and return it with its HTTP base URL and ZMQ endpoint."""
    proc = stack.start("indexer", "--http-port", "0", "--namespace", namespace, *args)

    def ready():
        for line in proc.log().splitlines():
            if line.startswith(READY_PREFIX):
                fields = dict(part.split("=", 1) for part in line[len(READY_PREFIX) :].split())
                return fields["http"], fields["zmq"]
        if proc.proc.poll() is not None:
            raise AssertionError(f"dyn indexer exited:\n{proc.log()}")
        return None

    http, zmq = poll_until(ready, 60, "dyn indexer to be ready")
    return proc, http, zmq


def prompt(seed: int, length: int = 20 * BLOCK + 5) -> list[int]:
    return [(seed * 131 + i * 7) % 4000 + 10 for i in range(length)]


def complete(stack: Stack, tokens: list[int], instance_id: int) -> None:
    r = httpx.post(
        stack.url + "/v1/completions",
        timeout=30,
        headers={"x-worker-instance-id": str(instance_id)},
        json={"model": "dyn-tiny", "prompt": tokens, "max_tokens": 2},
    )
    assert r.status_code == 200, r.text


def query(http: str, tokens: list[int]) -> dict:
    r = httpx.post(http + "/query", json={"token_ids": tokens}, timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


def workers(http: str) -> list[dict]:
    return httpx.get(http + "/workers", timeout=5).json()


@pytest.fixture(scope="module")
def setup(stack_factory):
    """Two workers in one process, a third in its own (to be killed), a frontend, an indexer."""
    stack = stack_factory(NAMESPACE)
    pair = stack.worker("--block-size", str(BLOCK), count=2)
    single = stack.worker("--block-size", str(BLOCK), count=1)
    stack.start_frontend()
    stack.wait_instances(3)
    _, http, zmq = start_indexer(stack)
    poll_until(lambda: len(workers(http)) == 3, 30, "the indexer to follow 3 workers")
    by_pid: dict[int | None, list[int]] = {}
    for record in records(stack):
        by_pid.setdefault(record.pid, []).append(record.instance_id)
    return stack, http, zmq, sorted(by_pid[pair.proc.pid]), by_pid[single.proc.pid][0], single


def test_query_reports_the_worker_that_cached_the_prompt_over_http_and_zmq(setup):
    stack, http, zmq, pair, _, _ = setup
    target = pair[0]
    tokens = prompt(1)
    assert query(http, tokens)["scores"] == {}
    complete(stack, tokens, target)
    answer = poll_until(
        lambda: (a := query(http, tokens))["scores"] and a, 20, "the indexer to see the stored blocks"
    )
    full = len(tokens) // BLOCK * BLOCK
    assert answer == {
        "scores": {str(target): {"0": full}},
        "instances": {str(target): {"longest_matched": full, "dp": {"0": full}, "cpu": full, "disk": full}},
        "block_size": BLOCK,
    }
    listed = {w["instance_id"]: w for w in workers(http)}
    assert set(pair) <= set(listed) and listed[target]["blocks"] >= full // BLOCK
    assert all(w["endpoint"].startswith("tcp://") for w in listed.values())
    dumped = httpx.get(http + "/dump", timeout=5).json()["dyn-tiny"]
    assert dumped["block_size"] == BLOCK
    assert {e["worker_id"] for e in dumped["events"]} == {target}

    async def over_zmq():
        address = await resolve_indexer_address(NAMESPACE, "file", str(stack.root / "discovery"), "dyn-tiny")
        assert address == zmq
        async with RemoteIndexer(address) as remote:
            return await remote.find_matches_for_tokens(tokens)

    assert anyio.run(over_zmq) == {(target, 0): full // BLOCK}


def test_a_killed_worker_is_dropped_from_workers(setup):
    stack, http, _, _, single_id, single = setup
    tokens = prompt(2)
    complete(stack, tokens, single_id)
    poll_until(
        lambda: str(single_id) in query(http, tokens)["scores"],
        20,
        "the single worker's blocks to be indexed",
    )
    single.kill()
    poll_until(
        lambda: single_id not in {w["instance_id"] for w in workers(http)},
        30,
        "the killed worker to leave /workers",
    )
    assert query(http, tokens)["scores"] == {}
    metrics = httpx.get(http + "/metrics", timeout=5).text
    assert "dynamo_kvindexer_workers 2.0" in metrics


def test_static_workers_list_follows_the_named_worker_only(setup):
    stack, _, _, pair, _, _ = setup
    target = pair[1]
    path = stack.root / "discovery" / NAMESPACE / "instances" / f"{target}.json"
    endpoints = json.loads(path.read_text())["record"]["endpoints"]
    entry = f"{target}={endpoints['kv_events']}|{endpoints['kv_replay']}"
    proc, http, _ = start_indexer(
        stack, "--workers", entry, "--block-size", str(BLOCK), namespace="idx-static"
    )
    assert [(w["instance_id"], w["dp_rank"]) for w in workers(http)] == [(target, 0)]
    tokens = prompt(3)
    complete(stack, tokens, target)
    answer = poll_until(
        lambda: (a := query(http, tokens))["scores"] and a, 20, "the static indexer to see the stored blocks"
    )
    full = len(tokens) // BLOCK * BLOCK
    assert answer["instances"] == {
        str(target): {"longest_matched": full, "dp": {"0": full}, "cpu": full, "disk": full}
    }
    assert [r.endpoints.metrics for r in records(stack, "idx-static.indexers")] == [http]
    assert proc.terminate() == 0  # SIGTERM: a clean stop that deregisters
    assert records(stack, "idx-static.indexers") == []


def test_workers_registered_over_http_are_followed_until_unregistered(setup):
    """Dynamo's way: an indexer that discovers nobody (another namespace) is told of a worker's
    KV-event socket with ``POST /register``, and forgets it with ``POST /unregister``."""
    stack, _, _, pair, _, _ = setup
    target = pair[0]
    path = stack.root / "discovery" / NAMESPACE / "instances" / f"{target}.json"
    endpoints = json.loads(path.read_text())["record"]["endpoints"]
    proc, http, _ = start_indexer(stack, "--block-size", str(BLOCK), namespace="idx-registered")
    assert workers(http) == []
    body = {
        "instance_id": target,
        "endpoint": endpoints["kv_events"],
        "replay_endpoint": endpoints["kv_replay"],
        "model_name": "dyn-tiny",
        "block_size": BLOCK,
    }
    registered = httpx.post(http + "/register", json=body, timeout=5)
    assert (registered.status_code, registered.json()) == (201, {"status": "ok"})
    again = httpx.post(http + "/register", json=body, timeout=5)
    assert again.status_code == 409 and "already registered" in again.json()["error"]
    assert [(w["instance_id"], w["dp_rank"]) for w in workers(http)] == [(target, 0)]
    tokens = prompt(4)
    complete(stack, tokens, target)
    full = len(tokens) // BLOCK * BLOCK
    poll_until(
        lambda: query(http, tokens)["scores"] == {str(target): {"0": full}},
        20,
        "the registered worker's blocks to be indexed",
    )
    gone = httpx.post(http + "/unregister", json={"instance_id": target, "model_name": "dyn-tiny"}, timeout=5)
    assert gone.status_code == 200
    assert workers(http) == [] and query(http, tokens)["scores"] == {}
    assert httpx.post(http + "/unregister", json={"instance_id": target}, timeout=5).status_code == 404
    assert proc.terminate() == 0


def test_an_indexer_started_with_peers_begins_with_their_index(setup):
    """A second indexer that discovers nobody (another namespace) copies the first one's index at
    start (``--peers``) and answers the same scores before any engine publishes again."""
    stack, http, _, pair, _, _ = setup
    tokens = prompt(5)
    complete(stack, tokens, pair[1])
    first = poll_until(
        lambda: (a := query(http, tokens))["scores"] and a, 20, "the first indexer to see the blocks"
    )
    proc, second, _ = start_indexer(
        stack, "--block-size", str(BLOCK), "--peers", f"http://127.0.0.1:1,{http}", namespace="idx-peer"
    )
    assert query(second, tokens) == first
    assert httpx.get(second + "/peers", timeout=5).json() == ["http://127.0.0.1:1", http]
    log = " ".join(proc.log().split())  # the console wraps its lines
    assert "peer http://127.0.0.1:1: not recovered from" in log and f"from peer {http}" in log
    assert proc.terminate() == 0
