"""The KV router with lower storage tiers: host and disk blocks that continue a worker's device
match are credited at their weights in its cost and its expected cached tokens, reported in the
route's decision, fed by KV events, dropped with their worker, and answered by a remote indexer."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from dyn.core.kv.convert import BatchConverter, KvEventMetrics
from dyn.core.kv.events import BlockStored, KvEventBatch, StorageTier
from dyn.core.kv.hashing import block_hashes
from dyn.core.kv.ingest import KvEventIngestor
from dyn.core.kv.tiers import TierHits
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.kv import KvRouter
from dyn.core.router.metrics import RouterMetrics
from dyn.core.router.policy import RouteRequest
from tests.core.router.doubles import BS, FakeIngestor, FakePool

pytestmark = pytest.mark.anyio

PROMPT = list(range(500, 660))  # 40 blocks
LOCAL = block_hashes(PROMPT, BS)


def make_router(n: int = 3, seed: int = 0, **config) -> KvRouter:
    return KvRouter(
        FakePool(n),
        KvRouterConfig(queue_threshold=None, **config),
        RouterMetrics(CollectorRegistry()),
        ingest=FakeIngestor,
        rng=random.Random(seed),
    )


def name(worker: int, i: int) -> int:
    """Worker ``worker``'s engine hash of the prompt's block ``i``."""
    return worker * 10_000 + i


def hold(router: KvRouter, worker: int, tier: StorageTier, first: int, last: int) -> None:
    """``worker`` holds blocks ``first .. last - 1`` of PROMPT in ``tier``."""
    parent = name(worker, first - 1) if first else None
    hashes = [name(worker, i) for i in range(first, last)]
    if tier is StorageTier.DEVICE:
        assert router.indexer is not None
        router.indexer.store((worker, 0), parent, hashes, LOCAL[first:last])
    else:
        assert router.lower is not None
        router.lower.by_tier[tier].store((worker, 0), parent, hashes, LOCAL[first:last])


async def route(router: KvRouter, rid: str = "r", **kw):
    return await router.route(RouteRequest(request_id=rid, token_ids=PROMPT, **kw))


async def test_a_prefix_in_host_memory_beats_a_worker_with_nothing():
    router = make_router()
    hold(router, 2, StorageTier.HOST_PINNED, 0, 20)
    chosen = await route(router)
    d = chosen.decision
    assert chosen.worker.instance_id == 2
    assert (d.overlap_blocks, d.host_blocks, d.disk_blocks) == (0, 20, 0)
    assert d.cached_tokens == round(0.75 * 20 * BS) == 60


async def test_the_host_continuation_of_an_equal_device_prefix_decides():
    router = make_router()
    for worker in (1, 2, 3):
        hold(router, worker, StorageTier.DEVICE, 0, 10)
    hold(router, 3, StorageTier.HOST_PINNED, 10, 14)
    hold(router, 2, StorageTier.HOST_PINNED, 10, 20)  # 10 host blocks: the most credit
    hold(router, 1, StorageTier.DISK, 10, 30)  # 20 disk blocks at 0.25 are worth 5 host ones
    chosen = await route(router)
    d = chosen.decision
    assert chosen.worker.instance_id == 2 and (d.overlap_blocks, d.host_blocks, d.disk_blocks) == (10, 10, 0)
    assert d.cached_tokens == (10 + 7.5) * BS


async def test_disk_continues_after_host_and_the_weights_come_from_the_config():
    router = make_router(host_cache_hit_weight=0.5, disk_cache_hit_weight=1.0)
    hold(router, 1, StorageTier.DEVICE, 0, 4)
    hold(router, 1, StorageTier.HOST_PINNED, 4, 8)
    hold(router, 1, StorageTier.DISK, 8, 10)
    hold(router, 1, StorageTier.EXTERNAL, 10, 11)
    d = (await route(router, instance_id=1)).decision
    assert (d.overlap_blocks, d.host_blocks, d.disk_blocks) == (4, 4, 3)
    assert d.cached_tokens == (4 + 0.5 * 4 + 1.0 * 3) * BS
    assert router.load.active_tokens((1, 0)) == len(PROMPT) - d.cached_tokens  # booked uncached


async def test_zero_weights_leave_the_decision_to_load_alone():
    router = make_router(host_cache_hit_weight=0.0, disk_cache_hit_weight=0.0)
    hold(router, 1, StorageTier.HOST_PINNED, 0, 40)
    busy = await route(router, "busy", instance_id=1)  # worker 1 is now the busier one
    assert busy.decision.host_blocks == 40 and busy.decision.cached_tokens == 0
    assert (await route(router, "next")).worker.instance_id != 1


async def test_workers_without_lower_tier_blocks_are_routed_as_before():
    tiered, plain = make_router(seed=4), make_router(seed=4)
    for router in (tiered, plain):
        hold(router, 2, StorageTier.DEVICE, 0, 12)
    hold(tiered, 3, StorageTier.HOST_PINNED, 30, 40)  # not a continuation of anything asked
    for i in range(6):
        a, b = await route(tiered, f"r{i}"), await route(plain, f"r{i}")
        assert (a.worker.instance_id, a.decision.cached_tokens, a.decision.host_blocks) == (
            b.worker.instance_id,
            b.decision.cached_tokens,
            0,
        )


async def test_ingested_lower_tier_events_reach_the_router_and_leave_with_their_worker():
    pool = FakePool(2)
    metrics = KvEventMetrics(CollectorRegistry())
    router = KvRouter(
        pool,
        KvRouterConfig(queue_threshold=None),
        RouterMetrics(CollectorRegistry()),
        ingest=lambda index: KvEventIngestor(index, metrics),
        rng=random.Random(0),
    )
    assert router.lower is not None
    feeds = router.ingestor.indexers
    assert all(feeds.writer(t) is router.lower.by_tier[t] for t in router.lower.by_tier)
    stored = BlockStored([name(2, i) for i in range(8)], None, PROMPT[: 8 * BS], BS, None, "CPU_PINNED")
    feeds.apply(BatchConverter(2, BS, metrics).convert(KvEventBatch(1.0, [stored])))
    assert (await route(router, "a")).decision.host_blocks == 8
    router._on_worker(pool.get(2), False)  # the pool reports it gone
    assert router.lower.empty()


async def test_a_remote_indexers_tier_hits_are_credited():
    class TieredIndexer:
        address, block_size, reachable = "tcp://indexer:1", BS, True

        async def find_tiered_matches(self, local):
            return {(2, 0): 4}, {(2, 0): TierHits(6, 2), (3, 0): TierHits(1, 0)}

    router = make_router(use_remote_indexer=True)
    router.remote_indexer = TieredIndexer()
    d = (await route(router)).decision
    assert d.worker == (2, 0) and (d.overlap_blocks, d.host_blocks, d.disk_blocks) == (4, 6, 2)
    assert d.cached_tokens == (4 + 0.75 * 6 + 0.25 * 2) * BS
