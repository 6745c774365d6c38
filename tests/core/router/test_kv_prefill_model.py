"""The KV router with ``--router-prefill-load-model aic``: each booking carries the prefill
duration predicted for its uncached tokens after its cached ones, a worker's oldest prefill
decays over it, queued requests get through as it decays, and until the table is ready (or when
it cannot be built) prompt load stays static, as with ``none``. The predictions come from a fake
estimator: 1 ms per new token and 0.1 ms per cached one."""

from __future__ import annotations

import random
import re
import threading

import anyio
import pytest
from prometheus_client import CollectorRegistry

from dyn.core.kv.hashing import block_hashes
from dyn.core.messages import ActiveSequenceEvent
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.kv import KvRouter
from dyn.core.router.metrics import RouterMetrics
from dyn.core.router.policy import RouteRequest
from dyn.core.router.prefill_model import AicSetup, PrefillDurations
from tests.core.router.doubles import BS, Clock, FakeIngestor, FakePool

pytestmark = pytest.mark.anyio

AIC = {"prefill_load_model": "aic", "aic_backend": "vllm", "aic_system": "h200_sxm", "aic_model_path": "m"}
W = (1, 0)


class Estimator:
    context_length = 8192

    def __init__(self, gate: threading.Event | None = None, fail: Exception | None = None) -> None:
        self.gate, self.fail = gate, fail

    def prefill_ms(self, new_tokens: int, prefix_tokens: int) -> float:
        if self.gate is not None:
            self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return 1.0 * new_tokens + 0.1 * prefix_tokens


def durations(tmp_path, **kw) -> PrefillDurations:
    setup = AicSetup(backend="vllm", system="h200_sxm", model_path="m")
    return PrefillDurations(setup, estimator=lambda s: Estimator(**kw), directory=tmp_path)


def built(tmp_path) -> PrefillDurations:
    d = durations(tmp_path)
    d.build()
    assert d.table is not None
    return d


def make_router(prefill: PrefillDurations, clock: Clock, **config) -> KvRouter:
    return KvRouter(
        FakePool(1),
        KvRouterConfig(**{**AIC, **config}),
        RouterMetrics(CollectorRegistry()),
        ingest=FakeIngestor,
        rng=random.Random(0),
        clock=clock,
        prefill_durations=prefill,
    )


def prompt(start: int, n: int, rid: str) -> RouteRequest:
    return RouteRequest(request_id=rid, token_ids=list(range(start, start + n)))


def tokens_at(router: KvRouter, clock: Clock, at: float) -> int:
    clock.now = at
    return router.load.active_tokens(W)


async def test_the_oldest_prefill_decays_over_its_predicted_duration(tmp_path):
    clock = Clock()
    t0 = clock.now
    router = make_router(built(tmp_path), clock)
    a = await router.route(prompt(0, 400, "a"))  # 400 new tokens: 0.4 s
    assert tokens_at(router, clock, t0) == 400
    assert tokens_at(router, clock, t0 + 0.1005) == 300  # 299.5 left, rounded up
    await router.route(prompt(10_000, 200, "b"))  # behind a: counted whole until a is done
    assert tokens_at(router, clock, t0 + 0.2005) == 200 + 200
    assert tokens_at(router, clock, t0 + 0.5) == 0 + 200  # a decayed fully, never below 0
    a.first_token()  # b is the oldest now, from now on
    assert tokens_at(router, clock, t0 + 0.5) == 200
    assert tokens_at(router, clock, t0 + 0.6005) == 100  # b's 0.2 s about half gone


async def test_the_cached_prefix_is_predicted_as_a_prefix_not_as_new_tokens(tmp_path):
    clock = Clock()
    t0 = clock.now
    router = make_router(built(tmp_path), clock)
    tokens = list(range(500, 660))  # 40 blocks, the first 20 cached on the worker
    local = block_hashes(tokens[:80], BS)
    router.indexer.store(W, None, [h ^ 0xABC for h in local], local)
    await router.route(RouteRequest(request_id="c", token_ids=tokens))
    # 80 new tokens after 80 cached: 80 * 1 + 80 * 0.1 = 88 ms, of which 44.5 have passed
    assert tokens_at(router, clock, t0) == 80
    assert tokens_at(router, clock, t0 + 0.0445) == 40  # 36 had the prefix counted as new tokens


async def test_prompt_load_is_static_until_the_table_is_ready(tmp_path):
    clock = Clock()
    t0 = clock.now
    gate = threading.Event()
    prefill = durations(tmp_path, gate=gate).start()  # its thread waits for the gate
    router = make_router(prefill, clock)
    a = await router.route(prompt(0, 400, "a"))
    assert tokens_at(router, clock, t0 + 60) == 400  # booked as with none: no duration
    gate.set()
    assert prefill.wait(10) is not None
    await router.route(prompt(10_000, 200, "b"))  # booked with its 0.2 s
    assert tokens_at(router, clock, t0 + 61) == 600  # a, the oldest, still has no duration
    a.first_token()
    assert tokens_at(router, clock, t0 + 61.1005) == 100


async def test_a_table_that_cannot_be_built_degrades_the_router_to_static_load(tmp_path):
    clock = Clock()
    prefill = durations(tmp_path, fail=RuntimeError("context MLA data missing"))
    prefill.build()
    router = make_router(prefill, clock)
    await router.route(prompt(0, 400, "a"))
    assert tokens_at(router, clock, clock.now + 60) == 400
    reason = router.degraded()
    assert reason is not None and "context MLA data missing" in reason and "does not decay" in reason
    assert make_router(built(tmp_path / "ok"), clock).degraded() is None


async def test_a_peers_bookings_get_the_same_prediction(tmp_path):
    clock = Clock()
    t0 = clock.now
    router = make_router(built(tmp_path), clock, replica_sync=True)
    router.apply_remote(
        ActiveSequenceEvent(
            "peer", "r1", 1, 0, "add", tracked_hashes=[7, 8], isl_tokens=300, cached_tokens=100
        )
    )
    # 200 new after 100 cached: 210 ms
    assert tokens_at(router, clock, t0) == 200
    assert tokens_at(router, clock, t0 + 0.1055) == 100


async def test_queued_requests_get_through_as_the_prefill_decays_without_any_event(tmp_path):
    clock = Clock()
    # busy above 0.1 * 1000 batched tokens = 100 active prefill tokens
    router = make_router(built(tmp_path), clock, queue_threshold=0.1)
    await router.route(prompt(0, 400, "a"))  # 0.4 s of prefill, never finished here
    admitted: list[str] = []

    async def send() -> None:
        await router.route(prompt(10_000, 40, "b"))
        admitted.append("b")

    async with anyio.create_task_group() as tg:
        await tg.start(router.run)
        tg.start_soon(send)
        await anyio.sleep(0.25)  # two rechecks: a still holds 400 tokens at the frozen clock
        assert admitted == [] and len(router.queue) == 1
        clock.now += 0.35  # a is 7/8 done: 50 tokens left, under the threshold
        with anyio.fail_after(0.6):  # the 100 ms recheck lets b in (1 s without the model)
            while not admitted:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert len(router.queue) == 0


@pytest.mark.parametrize(
    ("mode", "address", "says"),
    [
        ("round-robin", None, "it needs --router-mode kv, not round-robin"),
        (
            "kv",
            "tcp://127.0.0.1:1",
            "pass --router-prefill-load-model aic and the --aic-* flags to the dyn router",
        ),
    ],
)
def test_build_router_refuses_the_aic_model_where_no_kv_router_of_its_own_routes(mode, address, says):
    from dyn.core.router.build import build_router

    with pytest.raises(ValueError, match=re.escape(says)):
        build_router(mode, FakePool(1), KvRouterConfig(**AIC), CollectorRegistry(), router_address=address)
