"""Routing policies over a pool fed by a real file discovery store, built as a frontend builds them."""

from __future__ import annotations

import random

import anyio
import pytest
from prometheus_client import CollectorRegistry

from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.router.build import build_router
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.policy import (
    NoWorkersError,
    RouteRequest,
    TargetRequiredError,
    WorkerNotFoundError,
)
from dyn.core.router.pool import WorkerPool
from tests.memory_discovery import memory_store

pytestmark = pytest.mark.anyio


def record(instance_id: int, model: str = "m", port: int | None = None) -> WorkerRecord:
    return WorkerRecord(
        instance_id=instance_id,
        namespace="t",
        model_name=model,
        engine="mocker",
        endpoints=WorkerEndpoints(f"tcp://127.0.0.1:{port or 20000 + instance_id}"),
        block_size=16,
        total_kv_blocks=64,
        max_num_batched_tokens=256,
    )


def req(instance_id: int | None = None) -> RouteRequest:
    return RouteRequest(request_id="r", token_ids=[1, 2, 3], instance_id=instance_id)


def make_router(mode: str, pool: WorkerPool):
    return build_router(mode, pool, KvRouterConfig(), CollectorRegistry())


async def wait_len(pool: WorkerPool, n: int) -> None:
    with anyio.fail_after(5):
        while len(pool) != n:
            await anyio.sleep(0.01)


async def test_pool_follows_discovery_and_policies_route(tmp_path):
    store = memory_store(tmp_path, "t")
    for i in (3, 1, 2):
        await store.put(record(i), ttl_s=30)
    await store.put(record(9, model="other"), ttl_s=30)
    pool = WorkerPool(store, "m")
    seen: list[tuple[int, bool]] = []
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        assert [w.instance_id for w in pool.workers()] == [1, 2, 3]  # other model skipped
        pool.add_listener(lambda w, added: seen.append((w.instance_id, added)))

        rr = make_router("round-robin", pool)
        assert [(await rr.route(req())).worker.instance_id for _ in range(4)] == [1, 2, 3, 1]
        assert (await rr.route(req(3))).worker.instance_id == 3

        rnd = make_router("random", pool)
        rnd._rng = random.Random(0)
        assert {(await rnd.route(req())).worker.instance_id for _ in range(50)} == {1, 2, 3}

        direct = make_router("direct", pool)
        assert (await direct.route(req(2))).worker.instance_id == 2
        with pytest.raises(TargetRequiredError, match="backend_instance_id"):
            await direct.route(req())
        with pytest.raises(WorkerNotFoundError, match="live instances: 1, 2, 3"):
            await direct.route(req(7))

        await store.delete(2)
        await wait_len(pool, 2)
        assert (2, False) in seen
        assert [(await rr.route(req())).worker.instance_id for _ in range(4)].count(2) == 0
        with pytest.raises(WorkerNotFoundError):
            await rr.route(req(2))

        await store.put(record(4), ttl_s=30)
        await wait_len(pool, 3)
        assert (4, True) in seen
        await pool.wait_for(3)
        tg.cancel_scope.cancel()


async def test_expired_record_leaves_the_pool(tmp_path):
    store = memory_store(tmp_path, "t")
    await store.put(record(1), ttl_s=0.2)
    pool = WorkerPool(store, None)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        assert len(pool) == 1
        await wait_len(pool, 0)
        with pytest.raises(NoWorkersError, match="retry later"):
            await make_router("round-robin", pool).route(req())
        tg.cancel_scope.cancel()


def test_unknown_mode_names_the_valid_ones(tmp_path):
    with pytest.raises(
        ValueError, match="kv, round-robin, random, power-of-two, least-loaded, device-aware-weighted, direct"
    ):
        make_router("kv2", WorkerPool(memory_store(tmp_path, "t")))
