"""Finding and reading the views: probing a URL's root then ``/kv``, errors a user can cause,
discovery of a ``dyn indexer``, and one snapshot read through the real ``IndexerHttpApp``."""

from __future__ import annotations

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.errors import ConfigError
from dyn.core.indexer.client import indexer_record
from dyn.core.inspect.command import read_snapshot
from dyn.core.inspect.prompt import PromptTokens
from dyn.core.inspect.target import TargetError, find_indexer_url, open_target
from dyn.core.router.metrics import RouterMetrics
from tests.core.inspect.index_state import BS, ENTRIES, MODEL, TOKENS, A, asgi_client, kv_app


def test_an_indexer_is_read_at_its_root():
    with open_target("http://idx:1/", client=asgi_client(kv_app())) as target:
        assert target.base == "http://idx:1"
        model, dump = target.dump()
    assert model == MODEL and dump.block_size == BS and len(dump.events) == ENTRIES


def test_a_frontend_or_router_is_read_under_kv():
    with open_target("http://fe:1", client=asgi_client(kv_app(prefix="/kv"))) as target:
        assert target.base == "http://fe:1/kv"
        assert len(target.workers()) == 5
    with open_target("http://fe:1/kv", client=asgi_client(kv_app(prefix="/kv"))) as target:
        assert target.base == "http://fe:1/kv"


def test_a_server_without_views_is_named_with_its_own_reason():
    async def no_index(scope, receive, send):
        body = b'{"error": "this router keeps no KV index: ask the dyn indexer"}'
        await send(
            {
                "type": "http.response.start",
                "status": 404,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    with pytest.raises(
        TargetError,
        match=r"serves no KV index views: http://r:1/kv/workers "
        r"answered 404 \(this router keeps no KV index",
    ):
        open_target("http://r:1", client=asgi_client(no_index))


def test_nothing_listening_and_a_bad_url_say_what_to_pass():
    with pytest.raises(TargetError, match="not an HTTP URL"):
        open_target("127.0.0.1:8090")

    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(TargetError, match=r"cannot reach http://x:1 .*--url takes"):
        open_target("http://x:1", client=httpx.Client(transport=httpx.MockTransport(refuse)))


def test_an_answer_that_is_not_the_views_is_refused():
    async def html(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'[{"nope": 1}]'})

    with open_target("http://x:1", client=asgi_client(html)) as target:
        with pytest.raises(TargetError, match="did not answer like the KV index views' /workers"):
            target.workers()


def test_a_snapshot_reads_workers_metrics_and_the_overlap():
    registry = CollectorRegistry()
    RouterMetrics(registry).kv_hit_rate.observe(0.5)
    with open_target("http://fe:1", client=asgi_client(kv_app(registry, prefix="/kv"))) as t:
        snapshot = read_snapshot(t, MODEL, BS, PromptTokens(TOKENS[:10], MODEL))
    assert snapshot.cached_blocks == ENTRIES and len(snapshot.workers) == 5
    assert snapshot.hit_rate is not None and snapshot.hit_rate.mean == 0.5
    assert snapshot.tree is None and snapshot.events is None
    assert snapshot.overlap is not None
    best = snapshot.overlap.workers[0]
    assert ((best.instance_id, best.dp_rank), best.matched_blocks) == (A, 2)  # 10 tokens: 2 blocks


def test_discovery_finds_the_newest_indexer_of_the_model(tmp_path):
    store = FileDiscoveryStore(tmp_path, "ns.indexers")

    async def register():
        for i, (model, started) in enumerate((("m", 1.0), ("m", 2.0), ("other", 3.0))):
            record = indexer_record(
                "ns.indexers",
                model,
                i + 1,
                zmq_endpoint=f"tcp://h:{i}",
                http_url=f"http://h:{i}",
                block_size=BS,
            )
            record.started_at = started
            await store.put(record, ttl_s=60)

    anyio.run(register)
    assert find_indexer_url("ns", "file", str(tmp_path), "m") == "http://h:1"
    assert find_indexer_url("ns", "file", str(tmp_path), None) == "http://h:2"
    with pytest.raises(TargetError, match=r"no live dyn indexer of model 'x' in namespace 'ns'"):
        find_indexer_url("ns", "file", str(tmp_path), "x")
    with pytest.raises(ConfigError, match="cannot reach etcd"):
        find_indexer_url("ns", "etcd", None, None, "http://127.0.0.1:1")
