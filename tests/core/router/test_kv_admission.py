"""KvRouter admission as one unit (``route_all``), the expiry of bookings that never started and
the router queue's limit: the deadlock of issue 16 (a request's ``n`` choices routed one by one,
the last ones queued behind their own siblings' prefill, which could never start) and its cures.
The pool is the stand-in of ``test_kv``; the indexes, load model, cost and queue are the real ones."""

from __future__ import annotations

import random

import anyio
import pytest
from prometheus_client import CollectorRegistry

from dyn.core.router.config import KvRouterConfig
from dyn.core.router.kv import KvRoute, KvRouter
from dyn.core.router.metrics import RouterMetrics
from dyn.core.router.policy import (
    AllWorkersBusyError,
    NoWorkersError,
    QueueFullError,
    RouteRequest,
    RoutingError,
    TargetRequiredError,
)
from dyn.core.router.simple import DirectRouter, RoundRobinRouter
from tests.core.router.doubles import Clock, FakeIngestor, FakePool

pytestmark = pytest.mark.anyio


def make_router(n: int = 3, clock=None, **config) -> KvRouter:
    kw = {} if clock is None else {"clock": clock}
    return KvRouter(
        FakePool(n),
        KvRouterConfig(**config),
        RouterMetrics(CollectorRegistry()),
        ingest=FakeIngestor,
        rng=random.Random(0),
        **kw,
    )


def request(tokens, rid="r", **kw) -> RouteRequest:
    return RouteRequest(request_id=rid, token_ids=list(tokens), **kw)


# make_router's workers batch 1000 tokens; queue_threshold 0.1 makes a worker busy beyond 100
# active prefill tokens, so two 60-token prompts fill one.
BUSY = {"queue_threshold": 0.1}


def choices(n: int, tokens=range(60), rid: str = "c") -> list:
    """``n`` choices of one prompt, sharing its token list as the frontend's do."""
    shared = list(tokens)
    return [request(shared, f"{rid}{i}") for i in range(n)]


def booked(router) -> dict[int, int]:
    return {k[0]: router.load.num_requests(k) for k in router.load.workers()}


async def test_a_group_bigger_than_the_free_capacity_is_admitted_whole_at_once():
    router = make_router(n=2, **BUSY)
    with anyio.fail_after(2):  # before route_all, the fifth choice waited here for ever
        routes = await router.route_all(choices(8))
    assert len(routes) == 8 and len({r.request_id for r in routes}) == 8
    assert booked(router) == {1: 4, 2: 4}  # spread: each member saw the bookings before it
    assert all(router.load.active_tokens((w, 0)) == 240 for w in (1, 2))  # far over 100: busy
    assert len(router.queue) == 0


async def test_a_queued_group_waits_as_one_entry_and_is_admitted_in_one_step():
    router = make_router(n=2, **BUSY)
    heads = await router.route_all(choices(4, range(500, 560), "head"))  # both workers busy
    done: list[list[KvRoute]] = []

    async def group() -> None:
        done.append(await router.route_all(choices(6)))

    async def single() -> None:
        done.append([await router.route(request(range(900, 960), "other"))])

    async with anyio.create_task_group() as tg:
        tg.start_soon(group)
        await anyio.sleep(0.01)
        tg.start_soon(single)
        await anyio.sleep(0.01)
        assert len(router.queue) == 2 and router.queue.pending_requests == 7
        assert router.queue.pending_isl_tokens == 7 * 60
        assert router.metrics.queue_pending._value.get() == 7
        for head in heads[:2]:  # worker 1's prefill is done: it is free again
            head.first_token()
        await anyio.sleep(0.01)
        # all six members were booked together although three already make worker 1 busy; the
        # single request behind them waits for prefill that will finish
        assert [len(d) for d in done] == [6] and len(router.queue) == 1
        for route in done[0]:
            route.first_token()
        for head in heads[2:]:
            head.first_token()
    assert [len(d) for d in done] == [6, 1] and len(router.queue) == 0


async def test_a_member_that_fails_to_book_frees_the_members_booked_before_it(monkeypatch):
    router = make_router(n=2)
    admit = router._admit
    calls = []

    def flaky(*args):
        calls.append(args)
        if len(calls) == 3:
            raise NoWorkersError("the chosen worker left; retry")
        return admit(*args)

    monkeypatch.setattr(router, "_admit", flaky)
    with pytest.raises(NoWorkersError, match="worker left"):
        await router.route_all(choices(5))
    assert len(calls) == 3 and len(router.load) == 0 and not router._unstarted


async def test_a_member_naming_a_dead_worker_fails_the_group_before_anything_is_booked():
    router = make_router(n=2)
    members = choices(3) + [request(range(60), "pinned", instance_id=9)]
    with pytest.raises(RoutingError, match="worker instance 9 is not live"):
        await router.route_all(members)
    assert len(router.load) == 0


async def test_a_queued_group_that_fails_at_admission_frees_its_members(monkeypatch):
    router = make_router(n=1, **BUSY)
    head = await router.route(request(range(500, 620), "head"))
    errors: list[Exception] = []

    async def group() -> None:
        try:
            await router.route_all(choices(3))
        except RoutingError as exc:
            errors.append(exc)

    admit = router._admit
    calls = []

    def flaky(*args):
        calls.append(args)
        if len(calls) == 2:
            raise AllWorkersBusyError("no")
        return admit(*args)

    async with anyio.create_task_group() as tg:
        tg.start_soon(group)
        await anyio.sleep(0.01)
        monkeypatch.setattr(router, "_admit", flaky)
        head.first_token()
    assert len(errors) == 1 and len(calls) == 2
    head.finished()
    assert len(router.load) == 0 and len(router.queue) == 0


async def test_a_cancelled_group_leaves_the_queue_whole():
    router = make_router(n=1, **BUSY)
    head = await router.route(request(range(500, 620), "head"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(router.route_all, choices(5))
        await anyio.sleep(0.01)
        assert router.queue.pending_requests == 5
        tg.cancel_scope.cancel()
    assert len(router.queue) == 0 and router.queue.pending_requests == 0
    assert router.metrics.queue_pending._value.get() == 0
    head.finished()
    assert len(router.load) == 0


async def test_the_base_route_all_routes_in_turn_and_fails_whole():
    pool = FakePool(3)
    routes = await RoundRobinRouter(pool).route_all(choices(4))
    assert [r.worker.instance_id for r in routes] == [1, 2, 3, 1]
    with pytest.raises(TargetRequiredError):
        await DirectRouter(pool).route_all([request(range(4), "a", instance_id=1), request(range(4), "b")])


# --------------------------------------------------------------------------- unstarted bookings


def clocked_router(**config):
    clock = Clock()
    return make_router(2, clock, **config), clock


async def test_bookings_not_started_in_time_are_freed_and_started_ones_kept():
    router, clock = clocked_router(unstarted_booking_secs=5.0)
    sent, first, lost = await router.route_all(choices(3))
    sent.started()
    first.first_token()  # a first token implies the request was sent
    clock.now += 4.0
    late = await router.route(request(range(100, 160), "late"))
    router._expire_unstarted(clock.now)
    assert len(router.load) == 4  # nothing is 5 s old yet
    clock.now += 1.5
    router._expire_unstarted(clock.now)
    assert lost.closed and not sent.closed and not first.closed and not late.closed
    assert router.unstarted_expired == 1 and len(router.load) == 3
    lost.started()  # too late: the booking is gone and stays gone
    assert len(router.load) == 3
    clock.now += 10.0
    router._expire_unstarted(clock.now)
    assert late.closed and len(router.load) == 2
    for route in (sent, first):
        route.finished()
    assert len(router.load) == 0 and not router._unstarted


async def test_expiry_off_keeps_unstarted_bookings():
    router, clock = clocked_router(unstarted_booking_secs=None)
    route = await router.route(request(range(60), "a"))
    clock.now += 3600
    router._expire_unstarted(clock.now)
    assert not route.closed and len(router.load) == 1


async def test_the_run_loop_frees_unstarted_bookings_within_a_second_and_lets_the_queue_through():
    # the deadlock as it was: choices routed one by one, the frontend waiting for all of them
    # before starting any; the bookings of the unstarted ones now expire and the last choice goes
    router = make_router(n=1, unstarted_booking_secs=0.3, **BUSY)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(router.run)
            first, second, third = choices(3)
            routes = [await router.route(first), await router.route(second)]  # 120 tokens: busy
            t0 = anyio.current_time()
            stuck = await router.route(third)  # waited in the queue for the two bookings
            waited = anyio.current_time() - t0
            assert 0.3 <= waited < 1.5
            assert all(r.closed for r in routes) and not stuck.closed
            assert router.unstarted_expired == 2
            tg.cancel_scope.cancel()


# --------------------------------------------------------------------------- queue limit


async def test_a_request_arriving_at_a_full_queue_is_refused_at_once_and_counted():
    router = make_router(n=1, max_queued_requests=4, **BUSY)
    head = await router.route(request(range(500, 620), "head"))
    waiting: list[KvRoute] = []

    async def wait(requests) -> None:
        waiting.extend(await router.route_all(requests))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, [request(range(60), "one")])
        await anyio.sleep(0.01)
        tg.start_soon(wait, choices(5))  # 1 waiting < 4: a group may go past the limit
        await anyio.sleep(0.01)
        assert router.queue.pending_requests == 6
        with anyio.fail_after(1), pytest.raises(QueueFullError, match="--router-queue-limit 4"):
            await router.route(request(range(60), "refused"))
        assert isinstance(QueueFullError("x"), AllWorkersBusyError)  # the frontend's 503
        rejected = router.metrics.rejected.labels("decode", "queue_full")._value.get()
        assert rejected == 1 and router.queue.pending_requests == 6
        head.finished()
        while waiting and len(waiting) < 6:
            for route in waiting:
                route.first_token()
            await anyio.sleep(0.01)
        for route in waiting:
            route.first_token()
    assert len(waiting) == 6


async def test_a_request_that_need_not_wait_is_never_refused_by_the_queue_limit():
    router = make_router(n=2, max_queued_requests=1, **BUSY)
    await router.route(request(range(500, 620), "head"))  # worker 1 busy, worker 2 free
    async with anyio.create_task_group() as tg:
        tg.start_soon(router.route, request(range(60), "queued?"))
        await anyio.sleep(0.01)
        assert len(router.queue) == 0
        tg.cancel_scope.cancel()
