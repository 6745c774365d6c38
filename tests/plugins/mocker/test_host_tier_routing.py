"""The mocker's host tier seen by the KV router: its host events, ingested as a live router
ingests them, make a worker whose host memory holds a prompt's prefix the router's choice when
no device cache holds any of it; and the flag works in the offline replay."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from dyn.core.bench.replay import ReplaySettings, replay
from dyn.core.bench.trace import TraceRow
from dyn.core.kv.convert import BatchConverter, KvEventMetrics
from dyn.core.kv.events import KvEventBatch
from dyn.core.kv.ingest import KvEventIngestor
from dyn.core.messages import StopConditions
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.kv import KvRouter
from dyn.core.router.metrics import RouterMetrics
from dyn.core.router.policy import RouteRequest
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.scheduler import Scheduler, SimModel, SimRequest
from dyn.plugins.mocker.simulator import MockerSimulator
from tests.core.router.doubles import BS, FakePool

pytestmark = pytest.mark.anyio

PROMPT = list(range(500, 540))  # 10 blocks of BS (4) tokens


def run(scheduler: Scheduler, router: KvRouter, instance_id: int, metrics: KvEventMetrics, prompt, rid):
    """Serve one request to completion on ``scheduler``, its KV events reaching ``router``."""
    scheduler.add(SimRequest(rid, list(prompt), StopConditions(max_tokens=2, ignore_eos=True)))
    converter = BatchConverter(instance_id, BS, metrics)
    while scheduler.has_work:
        events = scheduler.step().events
        if events:
            router.ingestor.indexers.apply(converter.convert(KvEventBatch(0.0, events)))


def offloaded_prompt_router(seed: int, **config) -> KvRouter:
    """Two workers: worker 1 served PROMPT and then a prompt that evicted all of it from its 12
    device blocks into its host tier; worker 2 served something else."""
    metrics = KvEventMetrics(CollectorRegistry())
    router = KvRouter(
        FakePool(2),
        KvRouterConfig(queue_threshold=None, **config),
        RouterMetrics(CollectorRegistry()),
        ingest=lambda index: KvEventIngestor(index, metrics),
        rng=random.Random(seed),
    )
    model = SimModel(vocab_size=10_000, context_length=4096)
    host = Scheduler(MockerConfig(block_size=BS, num_gpu_blocks=12, num_host_kv_blocks=64), model)
    run(host, router, 1, metrics, PROMPT, "prompt")
    run(host, router, 1, metrics, range(2000, 2044), "flood")
    other = Scheduler(MockerConfig(block_size=BS, num_gpu_blocks=12), model)
    run(other, router, 2, metrics, range(3000, 3040), "else")
    assert not any(host.kv.is_cached(h) for h in host.kv.full_hashes(SimRequest("p", PROMPT).kv, 10))
    return router


async def test_a_prefix_offloaded_to_host_memory_draws_the_request_when_no_device_holds_it():
    for seed in range(4):
        router = offloaded_prompt_router(seed)
        chosen = await router.route(RouteRequest(request_id="again", token_ids=PROMPT))
        d = chosen.decision
        assert chosen.worker.instance_id == 1
        assert (d.overlap_blocks, d.host_blocks) == (0, 10)
        assert d.cached_tokens == round(0.75 * 10 * BS)


async def test_without_the_host_credit_the_offloaded_prefix_does_not_decide():
    chosen = set()
    for seed in range(8):
        router = offloaded_prompt_router(seed, host_cache_hit_weight=0.0)
        route = await router.route(RouteRequest(request_id="again", token_ids=PROMPT))
        assert route.decision.cached_tokens == 0
        chosen.add(route.worker.instance_id)
    assert chosen == {1, 2}


# --------------------------------------------------------------------------- offline replay


def row(ts_ms: float, first_id: int, blocks: int, osl: int) -> TraceRow:
    return TraceRow(
        input_length=16 * blocks,
        output_length=osl,
        hash_ids=tuple(range(first_id, first_id + blocks)),
        timestamp_ms=ts_ms,
    )


# a 4-block prompt; two floods at once (so one reaches each worker) that fill each worker's whole
# 16-block device cache; then the prompt again
TRACE = [row(0.0, 1, 4, 2), row(1000.0, 100, 16, 1), row(1000.0, 200, 16, 1), row(5000.0, 1, 4, 2)]


@pytest.mark.parametrize("host_blocks", [0, 64])
def test_the_offline_replay_onboards_from_the_worker_the_router_picks(host_blocks):
    mocker = MockerConfig(block_size=16, num_gpu_blocks=16, num_host_kv_blocks=host_blocks)
    settings = ReplaySettings(simulator=MockerSimulator(mocker), num_workers=2, trace_block_size=16)
    records = {r.conversation: r for r in replay(TRACE, settings).records}
    first, flood_a, flood_b, again = (records[f"r{i}"] for i in range(4))
    assert flood_a.worker != flood_b.worker  # every device cache was flushed of the prompt
    assert first.cached_tokens == 0
    if host_blocks:
        assert again.worker == first.worker
        assert again.cached_tokens == 48  # 3 blocks onboarded: the last block is computed
        assert again.ttft_s < first.ttft_s
    else:
        assert again.cached_tokens == 0
