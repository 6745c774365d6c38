"""KvRouter in one process: overlap-aware choice, the side index for sibling bursts, approximate
mode, pinned workers, busy thresholds and the router queue. The pool is a stand-in with the
WorkerPool methods the router uses; the indexes, load model, cost and queue are the real ones."""

from __future__ import annotations

import gc
import random
from collections import Counter

import anyio
import pytest
from prometheus_client import CollectorRegistry

from dyn.core.kv.hashing import block_hashes
from dyn.core.messages import WorkerEndpoints, WorkerRecord
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.kv import KvRouter
from dyn.core.router.metrics import RouterMetrics
from dyn.core.router.policy import AllWorkersBusyError, RouteOverrides, RouteRequest, WorkerNotFoundError
from dyn.core.router.pool import Worker

pytestmark = pytest.mark.anyio

BS = 4


class FakePool:
    model_name = "m"

    def __init__(self, n: int, max_batched: int = 1000) -> None:
        self._workers = [
            Worker(
                WorkerRecord(i, "ns", "m", "mocker", WorkerEndpoints(f"tcp://w{i}"), BS, 1000, max_batched),
                None,
            )
            for i in range(1, n + 1)
        ]
        self._listeners = []

    def workers(self):
        return self._workers

    def get(self, instance_id):
        return next((w for w in self._workers if w.instance_id == instance_id), None)

    def add_listener(self, listener):
        self._listeners.append(listener)
        for w in self._workers:
            listener(w, True)


class FakeIngestor:
    def __init__(self, indexer):
        self.indexer = indexer

    def follow(self, pool):
        pass


def make_router(n: int = 3, seed: int = 0, max_batched: int = 1000, **config) -> KvRouter:
    return KvRouter(
        FakePool(n, max_batched),
        KvRouterConfig(**config),
        RouterMetrics(CollectorRegistry()),
        ingest=FakeIngestor,
        rng=random.Random(seed),
    )


def request(tokens, rid="r", **kw) -> RouteRequest:
    return RouteRequest(request_id=rid, token_ids=list(tokens), **kw)


def store(router: KvRouter, worker: int, tokens) -> None:
    local = block_hashes(tokens, BS)
    router.indexer.store((worker, 0), None, [h ^ 0xABC for h in local], local)


PREFIX = list(range(100, 260))  # 40 blocks


async def test_routes_to_the_worker_holding_the_prefix():
    router = make_router()
    store(router, 2, PREFIX)
    route = await router.route(request(PREFIX + [1, 2, 3, 4, 5]))
    assert route.worker.instance_id == 2
    assert route.decision.overlap_blocks == 40 and route.decision.cached_tokens == 160


async def test_a_requests_own_overlap_credit_overrides_the_routers():
    """``agent_hints.kv_overlap_score_credit``: at 0 the cached prefix earns nothing, so the
    request leaves the busier worker that holds it; at the router's 1 it goes there."""
    router = make_router()
    store(router, 2, PREFIX)
    await router.route(request(range(5000, 5040), "busy", instance_id=2))
    prompt = PREFIX + [1, 2, 3, 4, 5]
    assert (await router.route(request(prompt, "a"))).worker.instance_id == 2
    blind = await router.route(request(prompt, "b", overrides=RouteOverrides(overlap_score_credit=0.0)))
    assert blind.worker.instance_id != 2 and blind.decision.overlap_blocks == 0


async def test_load_moves_requests_away_from_a_busy_worker_without_overlap():
    router = make_router()
    chosen = []
    for i in range(6):  # all open at once: each booking makes its worker dearer
        chosen.append(
            (await router.route(request(range(i * 1000, i * 1000 + 40), f"r{i}"))).worker.instance_id
        )
    assert Counter(chosen) == {1: 2, 2: 2, 3: 2}


@pytest.mark.parametrize(("predicted_ttl", "expect_one_worker"), [(5.0, True), (None, False)])
async def test_sibling_burst_shares_one_worker_only_with_the_side_index(predicted_ttl, expect_one_worker):
    router = make_router(predicted_ttl_secs=predicted_ttl)
    workers = {
        (await router.route(request(PREFIX + [9000 + i] * 4, f"s{i}"))).worker.instance_id for i in range(16)
    }
    assert (len(workers) == 1) is expect_one_worker, workers


async def test_approximate_mode_learns_from_its_own_decisions():
    router = make_router(use_kv_events=False)
    assert router.indexer is None and router.approx is not None
    first = await router.route(request(PREFIX + [1] * 4, "a"))
    first.finished()
    for i in range(5):
        route = await router.route(request(PREFIX + [i + 2] * 4, f"b{i}"))
        assert route.worker is first.worker
        route.finished()


async def test_pinned_worker_is_honoured_and_unknown_one_refused():
    router = make_router()
    store(router, 2, PREFIX)
    assert (await router.route(request(PREFIX, instance_id=3))).worker.instance_id == 3
    with pytest.raises(WorkerNotFoundError):
        await router.route(request(PREFIX, instance_id=42))


async def test_all_workers_busy_is_refused():
    router = make_router(n=2, active_prefill_tokens_threshold=50, queue_threshold=None)
    await router.route(request(range(60), "a"))
    await router.route(request(range(100, 160), "b"))
    with pytest.raises(AllWorkersBusyError):
        await router.route(request(range(200, 260), "c"))


async def test_finished_frees_the_booking():
    router = make_router(n=1)
    route = await router.route(request(PREFIX, "a"))
    assert router.load.active_tokens((1, 0)) == 160
    route.first_token()
    assert router.load.active_tokens((1, 0)) == 0
    route.finished()
    route.finished()  # idempotent
    assert router.load.active_decode_blocks((1, 0)) == 0


def _load_gauges(registry: CollectorRegistry) -> dict[str, float]:
    """The per-worker load series of a scrape, as ``name{worker_id,dp_rank,worker_type}``."""
    return {
        f"{s.name}{{{s.labels['worker_id']},{s.labels['dp_rank']},{s.labels['worker_type']}}}": s.value
        for family in registry.collect()
        if family.name.startswith("dynamo_frontend_worker_active_")
        for s in family.samples
    }


async def test_the_worker_load_gauges_show_the_bookings_when_scraped_and_leave_with_the_router():
    registry = CollectorRegistry()
    router = KvRouter(FakePool(2), KvRouterConfig(), RouterMetrics(registry), ingest=FakeIngestor)
    assert _load_gauges(registry) == {
        "dynamo_frontend_worker_active_decode_blocks{1,0,decode}": 0,
        "dynamo_frontend_worker_active_decode_blocks{2,0,decode}": 0,
        "dynamo_frontend_worker_active_prefill_tokens{1,0,decode}": 0,
        "dynamo_frontend_worker_active_prefill_tokens{2,0,decode}": 0,
    }
    route = await router.route(request(PREFIX, "a"))
    worker = route.decision.worker[0]
    booked = _load_gauges(registry)
    assert booked[f"dynamo_frontend_worker_active_decode_blocks{{{worker},0,decode}}"] == 40
    assert booked[f"dynamo_frontend_worker_active_prefill_tokens{{{worker},0,decode}}"] == 160
    route.first_token()
    assert _load_gauges(registry)[f"dynamo_frontend_worker_active_prefill_tokens{{{worker},0,decode}}"] == 0
    route.finished()
    assert not any(_load_gauges(registry).values())
    del router, route
    gc.collect()
    assert _load_gauges(registry) == {}


async def test_queue_holds_requests_while_every_worker_is_busy_and_orders_by_priority():
    # threshold 0.05 * 1000 batched tokens = 50 active prefill tokens per worker
    router = make_router(n=1, queue_threshold=0.05)
    head = await router.route(request(range(60), "head"))
    order: list[str] = []

    async def send(name: str, priority: int | None) -> None:
        route = await router.route(request(range(1000, 1060), name, priority=priority))
        order.append(name)
        route.first_token()  # its prefill is done at once, letting the next one through

    async with anyio.create_task_group() as tg:
        for name, priority in (("low", None), ("mid", 5), ("high", 50)):
            tg.start_soon(send, name, priority)
            await anyio.sleep(0.01)
        assert len(router.queue) == 3 and order == []
        head.first_token()  # the worker's prefill is done: drain
    assert order == ["high", "mid", "low"]


async def test_temperature_spreads_choices():
    router = make_router(temperature=1.0, seed=3)
    store(router, 1, PREFIX)
    picks = Counter()
    for i in range(200):
        route = await router.route(request(PREFIX, f"t{i}"))
        picks[route.worker.instance_id] += 1
        route.finished()
    assert picks[1] > picks[2] and picks[1] > picks[3] and picks[2] > 0 and picks[3] > 0


async def test_a_departed_peers_bookings_are_freed():
    from dyn.core.messages import ActiveSequenceEvent

    router = make_router(n=1)
    router.apply_remote(
        ActiveSequenceEvent("peer1", "r1", 1, 0, "add", tracked_hashes=[1, 2, 3], isl_tokens=12)
    )
    router.apply_remote(ActiveSequenceEvent("peer2", "r1", 1, 0, "add", tracked_hashes=[7, 8], isl_tokens=8))
    assert router.load.active_tokens((1, 0)) == 20
    router.forget_peer("peer1")
    assert router.load.active_tokens((1, 0)) == 8 and router.load.active_decode_blocks((1, 0)) == 2


async def test_a_failing_admission_fails_the_queued_request_instead_of_hanging_it(monkeypatch):
    router = make_router(n=1, queue_threshold=0.05)
    head = await router.route(request(range(60), "head"))
    errors = []

    async def queued() -> None:
        try:
            await router.route(request(range(1000, 1060), "queued"))
        except Exception as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(queued)
        await anyio.sleep(0.01)
        monkeypatch.setattr(router, "_admit", lambda *a: 1 / 0)
        head.first_token()
    assert len(errors) == 1 and "failed to admit" in str(errors[0])


class FlakyIndexer:
    address = "tcp://indexer:1"

    def __init__(self, block_size=BS, fail=False, tiers=None):
        self.block_size, self.fail, self.calls = block_size, fail, 0
        self.reachable = True
        self.tiers = tiers or {}

    def outage(self):
        return None if self.reachable else "unreachable for 2.0 s: the connection closed"

    async def find_tiered_matches(self, local):
        self.calls += 1
        if self.fail:
            raise TimeoutError("no answer")
        return {(2, 0): len(local)}, self.tiers


async def test_remote_indexer_answers_are_used_failures_back_off_and_foreign_block_sizes_ignored():
    now = [100.0]
    router = KvRouter(
        FakePool(3),
        KvRouterConfig(use_remote_indexer=True),
        RouterMetrics(CollectorRegistry()),
        rng=random.Random(0),
        clock=lambda: now[0],
    )
    router.remote_indexer = FlakyIndexer()
    assert (await router.route(request(PREFIX, "a"))).worker.instance_id == 2
    assert router.degraded() is None
    router.remote_indexer = failing = FlakyIndexer(fail=True)
    await router.route(request(PREFIX, "b"))
    await router.route(request(PREFIX, "c"))  # within the back-off: not asked again
    assert failing.calls == 1
    assert router.degraded() == (
        "a query to the dyn indexer at tcp://indexer:1 failed (no answer); routing on load alone"
    )
    now[0] += 10
    await router.route(request(PREFIX, "d"))
    assert failing.calls == 2
    now[0] += 10
    router.remote_indexer = FlakyIndexer(block_size=BS * 2)
    route = await router.route(request(PREFIX, "e"))
    assert route.decision.overlap_blocks == 0
    assert "hashes blocks of 8 tokens, this router 4; routing on load alone" in router.degraded()


async def test_an_unreachable_remote_indexer_is_not_asked_until_it_answers_again():
    router = KvRouter(
        FakePool(3), KvRouterConfig(use_remote_indexer=True), RouterMetrics(CollectorRegistry())
    )
    router.remote_indexer_missing = "no dyn indexer for model 'm' in discovery yet"
    assert router.degraded() == "no dyn indexer for model 'm' in discovery yet; routing on load alone"
    router.remote_indexer_missing = None
    router.remote_indexer = indexer = FlakyIndexer()
    indexer.reachable = False
    route = await router.route(request(PREFIX, "a"))
    assert indexer.calls == 0 and route.decision.overlap_blocks == 0
    route.finished()
    assert router.degraded() == (
        "the dyn indexer at tcp://indexer:1 is unreachable for 2.0 s: the connection closed; "
        "routing on load alone"
    )
    indexer.reachable = True  # back: asked at once, no back-off to wait out
    assert (await router.route(request(PREFIX, "b"))).worker.instance_id == 2
    assert indexer.calls == 1 and router.degraded() is None

    indexer.fail = True  # a query times out just before the freeze is seen ...
    (await router.route(request(PREFIX, "c"))).finished()
    assert indexer.calls == 2 and "failed (no answer)" in router.degraded()
    indexer.reachable = False  # ... then it is lost, and thawed: the back-off is void
    (await router.route(request(PREFIX, "d"))).finished()
    indexer.reachable, indexer.fail = True, False
    assert (await router.route(request(PREFIX, "e"))).worker.instance_id == 2 and indexer.calls == 3


def test_all_workers_busy_is_a_503_with_retry_after():
    from dyn.core.frontend.failures import routing_error as _routing_error

    err = _routing_error(AllWorkersBusyError("every worker is over its busy threshold"))
    assert err.status == 503 and "retry-after" in err.headers


@pytest.mark.parametrize(("refresh", "expected"), [(10.0, 2), (None, 1)])
async def test_a_request_that_waited_long_is_rescored_before_admission(refresh, expected):
    now = [0.0]
    router = KvRouter(
        FakePool(2, max_batched=1000),
        KvRouterConfig(queue_threshold=0.05, overlap_refresh_after_secs=refresh),
        RouterMetrics(CollectorRegistry()),
        ingest=FakeIngestor,
        rng=random.Random(0),
        clock=lambda: now[0],
    )
    # both workers over 0.05 * 1000 prefill tokens; worker 2 carries more decode load
    blockers = [
        await router.route(request(range(60), "b1", instance_id=1)),
        await router.route(request(range(100, 200), "b2", instance_id=2)),
    ]
    chosen = []

    async def queued() -> None:
        chosen.append((await router.route(request(PREFIX, "late"))).worker.instance_id)

    async with anyio.create_task_group() as tg:
        tg.start_soon(queued)
        await anyio.sleep(0.01)
        assert len(router.queue) == 1
        store(router, 2, PREFIX)  # while it waits, worker 2 caches its prefix
        now[0] += 11  # past the refresh age
        for b in blockers:
            b.first_token()
    # rescored, the cached prefix outweighs worker 2's load; with stale scores, load decides
    assert chosen == [expected]


async def test_a_repeated_image_is_credited_where_its_blocks_are_cached_and_another_image_is_not():
    """Multimodal routing (Dynamo's): the worker's KV event names the image in its blocks'
    ``extra_keys`` as vLLM does; a request whose placeholders carry the same image overlaps all of
    the cached blocks, one with another image at the same token ids only the blocks before it."""
    from prometheus_client import CollectorRegistry as Registry

    from dyn.core.kv.convert import BatchConverter, KvEventMetrics
    from dyn.core.kv.events import BlockStored, KvEventBatch
    from dyn.core.kv.hashing import MediaSpan, mm_key

    image, other = "ab" * 32, "cd" * 32
    tokens = list(range(1000, 1000 + 10 * BS))
    at, length = 3 * BS + 2, 2 * BS  # the placeholders span blocks 3, 4 and 5
    extra = [((image, at),) if 3 <= b <= 5 else None for b in range(10)]
    event = BlockStored([9000 + b for b in range(10)], None, tokens, BS, extra_keys=extra)
    (op,) = BatchConverter(2, BS, KvEventMetrics(Registry())).convert(KvEventBatch(0.0, [event]))
    router = make_router()
    router.indexer.store(op.worker, op.parent_hash, op.block_hashes, op.local_hashes)

    same = await router.route(request(tokens, "same", media=[MediaSpan(at, length, mm_key(image))]))
    assert same.worker.instance_id == 2 and same.decision.overlap_blocks == 10
    same.finished()
    swapped = await router.route(request(tokens, "other", media=[MediaSpan(at, length, mm_key(other))]))
    assert swapped.decision.overlap_blocks == (3 if swapped.worker.instance_id == 2 else 0)
    swapped.finished()
    bare = await router.route(request(tokens, "bare"))
    assert bare.decision.overlap_blocks == (3 if bare.worker.instance_id == 2 else 0)
