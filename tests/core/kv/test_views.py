"""The KV index's HTTP views (served by dyn indexer, frontends and dyn router) against a
hand-filled ``RadixIndexer`` (no server, no sockets)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry

from dyn.core.kv.hashing import block_hashes
from dyn.core.kv.indexer import RadixIndexer, radix_indexer
from dyn.core.kv.views import IndexerHttpApp, IndexerMetrics, RadixIndexView

pytestmark = pytest.mark.anyio

BS = 4
MODEL = "tiny"
TOKENS = list(range(100, 124))  # 6 blocks
LOCAL = block_hashes(TOKENS, BS)
A, B, B1 = (11, 0), (22, 0), (22, 1)


def filled() -> RadixIndexer:
    """A holds 6 blocks of TOKENS, B rank 0 holds 2, B rank 1 holds 4."""
    index = radix_indexer()
    index.store(A, None, [1000 + i for i in range(6)], LOCAL)
    index.store(B, None, [2000, 2001], LOCAL[:2])
    index.store(B1, None, [3000 + i for i in range(4)], LOCAL[:4])
    return index


def client(
    index: RadixIndexer | None = None, *, block_size: int | None = BS, prefix: str = "", endpoints=None
) -> httpx.AsyncClient:
    view = RadixIndexView(index if index is not None else filled(), MODEL, block_size, endpoints)
    app = IndexerHttpApp(view, IndexerMetrics(CollectorRegistry(), view), prefix=prefix)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://indexer")


async def test_query_by_tokens_reports_matched_tokens_per_instance_and_rank():
    async with client() as c:
        r = await c.post("/query", json={"token_ids": TOKENS + [1, 2]})
    assert r.status_code == 200
    assert r.json() == {
        "scores": {"11": {"0": 24}, "22": {"0": 8, "1": 16}},
        "instances": {
            "11": {"longest_matched": 24, "dp": {"0": 24}},
            "22": {"longest_matched": 16, "dp": {"0": 8, "1": 16}},
        },
        "block_size": BS,
    }


async def test_query_by_hash_matches_the_same_prefix_and_lora_changes_the_hashes():
    async with client() as c:
        by_hash = (await c.post("/query_by_hash", json={"block_hashes": LOCAL[:3]})).json()
        lora = (await c.post("/query", json={"token_ids": TOKENS, "lora_name": "x"})).json()
        short = (await c.post("/query", json={"token_ids": TOKENS[:3]})).json()
    assert by_hash["scores"] == {"11": {"0": 12}, "22": {"0": 8, "1": 12}}
    assert lora["scores"] == {} and lora["instances"] == {}
    assert short["scores"] == {}  # less than one block


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/query", b'{"token_ids": "abc"}', "$.token_ids"),
        ("/query", b'{"token_ids": [1, -2]}', "$.token_ids[1]"),
        ("/query", b'{"token_ids": [1, true]}', "$.token_ids[1]"),
        ("/query", b'{"token_ids": [1], "lora_name": 5}', "$.lora_name"),
        ("/query", b'{"tokens": [1]}', "token_ids"),
        ("/query", b'{"token_ids": [1], "model_name": "other"}', "model_name"),
        ("/query_by_hash", b'{"block_hashes": [1.5]}', "$.block_hashes[0]"),
        ("/query_by_hash", b'{"block_hashes": [1, 18446744073709551616]}', "block_hashes[1]"),
        ("/query_by_hash", b"[1, 2]", "object"),
        ("/query_by_hash", b"{not json", "block_hashes"),
    ],
)
async def test_bad_bodies_get_400_naming_the_field(path, body, field):
    async with client() as c:
        r = await c.post(path, content=body)
    assert r.status_code == 400
    assert field in r.json()["error"]


async def test_unknown_paths_404_and_wrong_methods_405():
    async with client() as c:
        assert (await c.get("/nope")).status_code == 404
        assert (await c.get("/query")).status_code == 405
        assert (await c.post("/workers")).status_code == 405


async def test_token_query_before_the_block_size_is_known_is_503_but_hash_query_works():
    async with client(radix_indexer(), block_size=None) as c:
        tokens = await c.post("/query", json={"token_ids": TOKENS})
        hashes = await c.post("/query_by_hash", json={"block_hashes": LOCAL})
        health = await c.get("/health")
    assert tokens.status_code == 503 and "block size" in tokens.json()["error"]
    assert hashes.status_code == 200 and hashes.json()["scores"] == {}
    # /health says so (it said "ok")
    assert health.status_code == 503 and health.json()["status"] == "unhealthy"
    assert "block size is not known" in health.json()["reason"]
    async with client(radix_indexer(), block_size=None) as c:
        assert (await c.get("/live")).json() == {"status": "live"}  # the liveness probe still passes


async def test_an_index_that_follows_no_worker_is_degraded():
    async with client(radix_indexer(), endpoints={}) as c:
        health = await c.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "degraded"
    assert health.json()["workers"] == 0 and "every answer is empty" in health.json()["degraded"][0]


async def test_workers_lists_known_ranks_with_blocks_and_endpoints():
    endpoints = {A: "tcp://a:1", (33, 0): "tcp://c:3"}  # 33 is known but holds nothing
    async with client(endpoints=endpoints) as c:
        workers = (await c.get("/workers")).json()
        health = (await c.get("/health")).json()
    assert workers == [
        {"instance_id": 11, "dp_rank": 0, "blocks": 6, "endpoint": "tcp://a:1"},
        {"instance_id": 22, "dp_rank": 0, "blocks": 2, "endpoint": None},
        {"instance_id": 22, "dp_rank": 1, "blocks": 4, "endpoint": None},
        {"instance_id": 33, "dp_rank": 0, "blocks": 0, "endpoint": "tcp://c:3"},
    ]
    assert health == {"status": "healthy", "workers": 4}


async def test_dump_replays_into_an_empty_indexer_with_the_same_answers():
    original = filled()
    async with client(original) as c:
        dumped = (await c.get("/dump")).json()
    assert list(dumped) == [MODEL] and dumped[MODEL]["block_size"] == BS
    events = dumped[MODEL]["events"]
    assert len(events) == 12
    assert set(events[0]) == {"worker_id", "dp_rank", "parent_hash", "block_hash", "tokens_hash"}
    rebuilt = radix_indexer()
    for e in events:
        rebuilt.store((e["worker_id"], e["dp_rank"]), e["parent_hash"], [e["block_hash"]], [e["tokens_hash"]])
    assert rebuilt.find_matches(LOCAL) == original.find_matches(LOCAL)


async def test_metrics_count_requests_by_endpoint_and_gauge_workers_and_blocks():
    async with client() as c:
        await c.post("/query", json={"token_ids": TOKENS})
        await c.post("/query", json={"token_ids": "bad"})
        text = (await c.get("/metrics")).text
    assert 'dynamo_kvindexer_requests_total{endpoint="query"} 2.0' in text
    assert 'dynamo_kvindexer_errors_total{endpoint="query"} 1.0' in text
    assert "dynamo_kvindexer_workers 3.0" in text
    assert "dynamo_kvindexer_blocks 12.0" in text


async def test_prefix_mounts_the_views_under_a_path():
    async with client(prefix="/kv/") as c:
        assert (await c.get("/kv/health")).status_code == 200
        assert (await c.get("/health")).status_code == 404
        r = await c.post("/kv/query", json={"token_ids": TOKENS})
    assert r.json()["instances"]["11"]["longest_matched"] == 24


async def test_a_routers_view_shows_its_lower_tiers_as_dynamos_cpu_and_disk_tokens():
    from types import SimpleNamespace

    from dyn.core.kv.events import StorageTier
    from dyn.core.kv.tiers import LowerTierIndexes
    from dyn.core.kv.views import router_index_view

    index, lower = filled(), LowerTierIndexes()
    lower.by_tier[StorageTier.HOST_PINNED].store(B, 2001, [2002, 2003, 2004], LOCAL[2:5])
    lower.by_tier[StorageTier.EXTERNAL].store(B1, 3003, [3004], LOCAL[4:5])
    router = SimpleNamespace(indexer=index, lower=lower, block_size=BS)
    view = router_index_view(router, SimpleNamespace(workers=list), MODEL)
    assert view is not None and view.lower is lower
    app = IndexerHttpApp(view, IndexerMetrics(CollectorRegistry(), view))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://i") as c:
        body = (await c.post("/query", json={"token_ids": TOKENS})).json()
    assert body["scores"] == {"11": {"0": 24}, "22": {"0": 8, "1": 16}}  # the device tier
    assert body["instances"]["11"] == {"longest_matched": 24, "dp": {"0": 24}, "cpu": 24, "disk": 24}
    # rank 0: 2 device + 3 host blocks; rank 1: 4 device + 1 external: the best rank per column
    assert body["instances"]["22"] == {"longest_matched": 16, "dp": {"0": 8, "1": 16}, "cpu": 20, "disk": 20}
