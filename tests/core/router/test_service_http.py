"""``dyn router``'s ``--system-port`` app: Prometheus metrics and the KV index views under /kv/,
served from the router's own loop; a router without an index says what to inspect instead."""

from __future__ import annotations

import anyio
import httpx
import pytest

from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.service import RouterHttpApp, RouterService
from tests.memory_discovery import memory_store

pytestmark = pytest.mark.anyio

BLOCK = 4


def record(instance_id: int) -> WorkerRecord:
    return WorkerRecord(
        instance_id=instance_id,
        namespace="t",
        model_name="m",
        engine="mocker",
        endpoints=WorkerEndpoints(f"tcp://127.0.0.1:{20000 + instance_id}"),
        block_size=BLOCK,
        total_kv_blocks=64,
        max_num_batched_tokens=256,
    )


def client(service: RouterService) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=RouterHttpApp(service)), base_url="http://router"
    )


async def test_metrics_and_index_views_share_the_port(tmp_path):
    store = memory_store(tmp_path, "t")
    for i in (1, 2):
        await store.put(record(i), ttl_s=30)
    service = RouterService(store, "m", KvRouterConfig(use_kv_events=False))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(service.run)
            while len(service.pool) < 2:
                await anyio.sleep(0.02)
            async with client(service) as c:
                workers = (await c.get("/kv/workers")).json()
                query = await c.post("/kv/query", json={"token_ids": list(range(12))})
                metrics = await c.get("/metrics")
                kv_metrics = await c.get("/kv/metrics")
                unknown = await c.get("/nothing")
                wrong = await c.post("/metrics")
            tg.cancel_scope.cancel()
    assert [(w["instance_id"], w["blocks"], w["total_blocks"]) for w in workers] == [(1, 0, 64), (2, 0, 64)]
    assert query.status_code == 200 and query.json() == {"scores": {}, "instances": {}, "block_size": BLOCK}
    assert metrics.status_code == 200
    assert "dynamo_component_router_requests_total" in metrics.text
    assert "dynamo_kvindexer_workers 2.0" in metrics.text
    assert 'dynamo_kvindexer_requests_total{endpoint="query"} 1.0' in kv_metrics.text
    assert unknown.status_code == 404 and "/kv/" in unknown.json()["error"]
    assert wrong.status_code == 405


async def test_a_router_asking_a_remote_indexer_points_there(tmp_path):
    store = memory_store(tmp_path, "t")
    service = RouterService(store, "m", KvRouterConfig(use_remote_indexer=True))
    try:
        async with client(service) as c:
            r = await c.get("/kv/workers")
            metrics = await c.get("/metrics")
    finally:
        service._socket.close(linger=0)
    assert r.status_code == 404
    assert "keeps no KV index" in r.json()["error"] and "--use-remote-indexer" in r.json()["error"]
    assert "dyn inspect-kv --namespace t" in r.json()["error"]
    assert metrics.status_code == 200


async def test_health_counts_the_workers_it_routes_to_and_live_answers_without_the_key(tmp_path):
    store = memory_store(tmp_path, "t")
    service = RouterService(store, "m", KvRouterConfig(use_kv_events=False))
    app = httpx.ASGITransport(app=RouterHttpApp(service, api_key="secret"))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(service.run)
            async with httpx.AsyncClient(transport=app, base_url="http://router") as c:
                empty = await c.get("/health")
                await store.put(record(7), ttl_s=30)
                while len(service.pool) < 1:
                    await anyio.sleep(0.02)
                healthy = await c.get("/health")
                keyed = await c.get("/health", headers={"authorization": "Bearer secret"})
                live = await c.get("/live")
                metrics = await c.get("/metrics")
            tg.cancel_scope.cancel()
    assert empty.status_code == 503 and empty.json()["status"] == "unhealthy"
    assert empty.json()["reason"] == "no live worker serves model 'm'"
    # a public probe gets the count; the ids only with the key
    assert healthy.status_code == 200 and healthy.json() == {"status": "healthy", "model": "m", "workers": 1}
    assert keyed.json() == {"status": "healthy", "model": "m", "workers": 1, "instances": [7]}
    assert live.status_code == 200
    assert metrics.status_code == 401  # the key still guards everything but the probes
