"""``RemoteRouter`` against an in-test router service (a real ROUTER socket on loopback)."""

from __future__ import annotations

import logging
import time

import anyio
import pytest
import zmq

from dyn.core.discovery.services import new_instance_id
from dyn.core.kv.hashing import MediaSpan
from dyn.core.messages import (
    RouteAnswer,
    RouteProgress,
    RouteQuery,
    RouteRefused,
    WorkerEndpoints,
    WorkerRecord,
)
from dyn.core.router.kv import AllWorkersBusyError
from dyn.core.router.policy import (
    NoWorkersError,
    QueueFullError,
    RouteOverrides,
    RouteRequest,
    RoutingError,
    TargetRequiredError,
    WorkerNotFoundError,
)
from dyn.core.router.pool import WorkerPool
from dyn.core.router.registry import router_record, routers_store
from dyn.core.router.remote import RemoteRoute, RemoteRouter
from dyn.core.router.simple import LeastLoadedRouter
from dyn.core.transport.codec import decode_router_message, encode
from dyn.core.transport.sockets import async_context, bind_random, configure
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


class FakeService:
    """Answers each query by its request id: ``ok`` books worker 1 rank 0, a refusal code is
    refused with it, ``silent`` is never answered (``late`` answers it on demand), ``stranger``
    books worker 999; anything after a ``junk`` query gets a malformed frame and a reply to an
    unknown query first."""

    def __init__(self, endpoint: str | None = None) -> None:
        self.socket = configure(async_context().socket(zmq.ROUTER))
        if endpoint is None:
            self.endpoint = bind_random(self.socket, "127.0.0.1")
        else:
            self.socket.bind(endpoint)
            self.endpoint = endpoint
        self.queries: list[RouteQuery] = []
        self.progress: list[RouteProgress] = []
        self.changed = anyio.Event()
        self.silent: list[tuple[bytes, RouteQuery]] = []

    async def serve(self) -> None:
        try:
            while True:
                identity, *body = await self.socket.recv_multipart()
                msg = decode_router_message(body)
                if isinstance(msg, RouteProgress):
                    self.progress.append(msg)
                else:
                    self.queries.append(msg)
                    await self.answer(identity, msg)
                self.changed.set()
                self.changed = anyio.Event()
        finally:
            self.socket.close(linger=0)

    async def answer(self, identity: bytes, q: RouteQuery) -> None:
        rid = q.request_id
        if rid.startswith("junk"):
            await self.socket.send_multipart([identity, b"A", b"\xc1not msgpack"])
            await self.socket.send_multipart([identity, *encode(RouteAnswer(10**9, 1, 0, 0, 0))])
            rid = "ok"
        if rid.startswith("ok"):
            reply = RouteAnswer(q.query_id, 1, 0, 3, 12, BLOCK)
        elif rid.startswith("stranger"):
            reply = RouteAnswer(q.query_id, 999, 0, 0, 0, BLOCK)
        elif rid.startswith("silent"):
            self.silent.append((identity, q))
            return
        else:
            reply = RouteRefused(q.query_id, rid, f"refused: {rid}")
        await self.socket.send_multipart([identity, *encode(reply)])

    async def answer_silent(self) -> None:
        for identity, q in self.silent:
            await self.socket.send_multipart([identity, *encode(RouteAnswer(q.query_id, 1, 0, 0, 0, BLOCK))])
        self.silent.clear()

    async def wait(self, predicate) -> None:
        with anyio.fail_after(5):
            while not predicate():
                await self.changed.wait()


def req(request_id: str, n: int = 10) -> RouteRequest:
    return RouteRequest(request_id=request_id, token_ids=list(range(n)))


async def started(tmp_path, tg, address: str | None = None, service: FakeService | None = None):
    store = memory_store(tmp_path, "t")
    await store.put(record(1), ttl_s=30)
    pool = WorkerPool(store, "m")
    await tg.start(pool.run)
    service = service or FakeService()
    tg.start_soon(service.serve)
    router = RemoteRouter(pool, address or service.endpoint, timeout_s=0.5, worker_wait_s=0.2)
    await tg.start(router.run)
    return router, service


async def test_answer_books_and_progress_is_reported_at_block_boundaries_and_finished_once(tmp_path):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            router, service = await started(tmp_path, tg)
            route = await router.route(req("ok-1"))
            assert route.worker.instance_id == 1 and route.dp_rank == 0
            assert (route.decision.overlap_blocks, route.decision.cached_tokens) == (3, 12)
            q = service.queries[0]
            assert (q.request_id, q.token_ids) == ("ok-1", list(range(10)))

            route.first_token()
            route.first_token()
            for n in (1, 2, 3, 4, 6, 7, 9, 9, 12):
                route.progress(n)
            route.finished()
            route.finished()
            route.progress(20)
            await router.route(req("ok-2"))  # same socket, in order: everything before arrived
            assert [(p.request_id, p.event, p.output_tokens) for p in service.progress] == [
                ("ok-1", "first_token", 0),
                ("ok-1", "progress", 4),
                ("ok-1", "progress", 9),
                ("ok-1", "progress", 12),
                ("ok-1", "finished", 12),
            ]
            tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("no_workers", NoWorkersError),
        ("worker_not_found", WorkerNotFoundError),
        ("all_busy", AllWorkersBusyError),
        ("target_required", TargetRequiredError),
        ("queue_full", QueueFullError),
        ("error", RoutingError),
    ],
)
async def test_refusals_raise_the_matching_routing_error(tmp_path, code, error):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            router, _ = await started(tmp_path, tg)
            with pytest.raises(error, match=f"refused: {code}") as caught:
                await router.route(req(code))
            if error is RoutingError:
                assert type(caught.value) is RoutingError
            tg.cancel_scope.cancel()


async def test_no_answer_times_out_and_a_late_booking_is_freed(tmp_path):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            router, service = await started(tmp_path, tg)
            with pytest.raises(NoWorkersError, match="is not answering"):
                await router.route(req("silent-1"))
            await service.wait(lambda: service.progress)  # withdrawn at once
            assert [(p.request_id, p.event) for p in service.progress] == [("silent-1", "finished")]
            await service.answer_silent()  # a router that booked it anyway: freed too
            await service.wait(lambda: len(service.progress) == 2)
            assert service.progress[1].event == "finished"
            tg.cancel_scope.cancel()


async def test_a_cancelled_route_frees_the_booking_that_arrives_later(tmp_path):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            router, service = await started(tmp_path, tg)
            async with anyio.create_task_group() as client:
                client.start_soon(router.route, req("silent-2"))
                await service.wait(lambda: service.silent)
                client.cancel_scope.cancel()
            await service.wait(lambda: service.progress)  # withdrawn at once
            await service.answer_silent()  # a router that booked it anyway: freed too
            await service.wait(lambda: len(service.progress) == 2)
            assert [(p.request_id, p.event) for p in service.progress] == [("silent-2", "finished")] * 2
            tg.cancel_scope.cancel()


async def test_a_worker_the_frontend_does_not_know_is_refused_and_freed(tmp_path):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            router, service = await started(tmp_path, tg)
            with pytest.raises(NoWorkersError, match="worker 999"):
                await router.route(req("stranger"))
            await service.wait(lambda: service.progress)
            assert [(p.request_id, p.event) for p in service.progress] == [("stranger", "finished")]
            tg.cancel_scope.cancel()


async def test_malformed_and_unknown_answers_are_ignored(tmp_path):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            router, _ = await started(tmp_path, tg)
            route = await router.route(req("junk"))
            assert route.worker.instance_id == 1
            assert router._rpc.rejected.total >= 1  # the malformed answer was counted, not fatal
            tg.cancel_scope.cancel()


async def test_route_before_run_or_with_a_bad_address_is_a_clear_error(tmp_path):
    pool = WorkerPool(memory_store(tmp_path, "t"), "m")
    with pytest.raises(NoWorkersError, match="not connected yet"):
        await RemoteRouter(pool, "tcp://127.0.0.1:1").route(req("ok"))
    with pytest.raises(ValueError, match="not a ZMQ address"):
        RemoteRouter(pool, "localhost:5555")


async def test_auto_finds_a_router_in_the_routers_namespace(tmp_path):
    service = FakeService()
    workers = memory_store(tmp_path, "t")
    routers = routers_store(workers)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            syncing_only = router_record(routers, "m", new_instance_id(), kv_events="tcp://127.0.0.1:1")
            other_model = router_record(routers, "other", new_instance_id(), request="tcp://127.0.0.1:2")
            await routers.put(syncing_only, ttl_s=30)
            await routers.put(other_model, ttl_s=30)
            router, _ = await started(tmp_path, tg, "auto", service)
            with pytest.raises(NoWorkersError, match="start one with 'dyn router'"):
                await router.route(req("ok"))
            async with routers.lease(
                router_record(routers, "m", new_instance_id(), request=service.endpoint)
            ):
                while router.endpoint is None:
                    await anyio.sleep(0.02)
                assert router.endpoint == service.endpoint
                assert (await router.route(req("ok"))).worker.instance_id == 1
            while router.endpoint is not None:  # the router left: no service to ask
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()


async def test_against_the_real_service(tmp_path):
    from dyn.core.router.config import KvRouterConfig
    from dyn.core.router.service import RouterService

    store = memory_store(tmp_path, "t")
    for i in (1, 2):
        await store.put(record(i), ttl_s=30)
    service = RouterService(store, "m", KvRouterConfig(use_kv_events=False))
    raw = configure(async_context().socket(zmq.DEALER))
    raw.connect(service.endpoint)
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                await tg.start(service.run)
                assert [r.endpoints.request for r in await routers_store(store).list()] == [service.endpoint]
                pool = WorkerPool(store, "m")
                await tg.start(pool.run)
                router = RemoteRouter(pool, service.endpoint, timeout_s=5)
                await tg.start(router.run)

                route = await router.route(req("a", n=3 * BLOCK))
                assert route.block_size == BLOCK and route.worker.instance_id in (1, 2)
                assert len(service.routes) == 1 and len(service.router.load) == 1
                route.first_token()
                route.progress(BLOCK)
                route.finished()
                with pytest.raises(WorkerNotFoundError, match="worker instance 7"):
                    await router.route(RouteRequest(request_id="b", token_ids=[1], instance_id=7))
                assert not service.routes and len(service.router.load) == 0

                await raw.send_multipart([b"Q", b"\xc1"])
                refused = decode_router_message(await raw.recv_multipart())
                assert (refused.query_id, refused.code) == (-1, "bad_request")
                assert refused.message.startswith("malformed RouteQuery")
                await raw.send_multipart([b"Z", b""])
                refused = decode_router_message(await raw.recv_multipart())
                assert refused.query_id == -1 and "unknown router message kind" in refused.message
                tg.cancel_scope.cancel()
    finally:
        raw.close(linger=0)
    assert await routers_store(store).list() == []  # deregistered on the way out


async def test_lower_tier_blocks_of_the_decision_cross_the_wire(tmp_path):
    from dyn.core.kv.events import StorageTier
    from dyn.core.kv.hashing import block_hashes
    from dyn.core.router.config import KvRouterConfig
    from dyn.core.router.service import RouterService

    store = memory_store(tmp_path, "t")
    await store.put(record(1), ttl_s=30)
    service = RouterService(store, "m", KvRouterConfig())  # KV events: device and lower tiers
    tokens = list(range(5 * BLOCK))
    local = block_hashes(tokens, BLOCK)
    kv = service.router.agg
    kv.indexer.store((1, 0), None, [10, 11], local[:2])
    kv.lower.by_tier[StorageTier.HOST_PINNED].store((1, 0), 11, [12, 13], local[2:4])
    kv.lower.by_tier[StorageTier.DISK].store((1, 0), 13, [14], local[4:5])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(service.run)
            pool = WorkerPool(store, "m")
            await tg.start(pool.run)
            router = RemoteRouter(pool, service.endpoint, timeout_s=5)
            await tg.start(router.run)
            route = await router.route(RouteRequest(request_id="t", token_ids=tokens))
            d = route.decision
            assert (d.overlap_blocks, d.host_blocks, d.disk_blocks) == (2, 2, 1)
            assert d.cached_tokens == (2 + 0.75 * 2 + 0.25 * 1) * BLOCK == 15
            route.finished()
            tg.cancel_scope.cancel()


# --------------------------------------------------------------------------- groups (route_all)


def test_a_group_is_one_query_with_each_prompt_sent_once():
    from dyn.core.router.remote import _group_query

    a, b = list(range(8)), list(range(100, 108))
    group = [RouteRequest(request_id=f"c{i}", token_ids=p, priority=3) for i, p in enumerate((a, a, b, b, a))]
    q = _group_query(7, group)
    assert (q.query_id, q.request_id, q.token_ids, q.priority) == (7, "c0", a, 3)
    assert q.siblings == ["c1", "c2", "c3", "c4"] and q.prompts == [b]
    assert q.sibling_prompts == [0, 1, 1, 0] and q.reports_start
    same = _group_query(8, [RouteRequest(request_id=f"c{i}", token_ids=a) for i in range(3)])
    assert same.sibling_prompts == [] and same.prompts == [] and same.prompt_media == []
    image = MediaSpan(2, 3, 77)
    mixed = _group_query(
        10,
        [
            RouteRequest(request_id="m0", token_ids=a),
            RouteRequest(request_id="m1", token_ids=b, media=[image]),
        ],
    )
    assert mixed.prompt_media == [[], [(2, 3, 77)]]
    blind = RouteOverrides(overlap_score_credit=0.0)
    credited = _group_query(
        11, [RouteRequest(request_id=f"o{i}", token_ids=a, overrides=blind) for i in range(2)]
    )
    assert credited.overlap_score_credit == 0.0 and same.overlap_score_credit is None
    with pytest.raises(ValueError, match="share their routing fields"):
        _group_query(
            9,
            [
                RouteRequest(request_id="x", token_ids=a),
                RouteRequest(request_id="y", token_ids=a, instance_id=1),
            ],
        )


async def test_a_router_older_than_groups_gets_the_members_one_query_each(tmp_path):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            router, service = await started(tmp_path, tg)
            routes = await router.route_all([req(f"ok-{i}") for i in range(3)])
            assert [q.request_id for q in service.queries] == ["ok-0", "ok-1", "ok-2"]
            assert service.queries[0].siblings == ["ok-1", "ok-2"]
            for route in routes:
                route.started()  # an old router would refuse "started": not sent
                route.finished()
            await service.wait(lambda: len(service.progress) == 3)
            assert [(p.request_id, p.event) for p in service.progress] == [
                ("ok-0", "finished"),
                ("ok-1", "finished"),
                ("ok-2", "finished"),
            ]
            tg.cancel_scope.cancel()


def real_service(store, **config):
    from dyn.core.router.config import KvRouterConfig
    from dyn.core.router.service import RouterService

    return RouterService(store, "m", KvRouterConfig(use_kv_events=False, **config))


async def serving(tmp_path, tg, **config):
    """A real RouterService over workers 1 and 2 and a RemoteRouter asking it."""
    store = memory_store(tmp_path, "t")
    for i in (1, 2):
        await store.put(record(i), ttl_s=30)
    service = real_service(store, **config)
    await tg.start(service.run)
    pool = WorkerPool(store, "m")
    await tg.start(pool.run)
    router = RemoteRouter(pool, service.endpoint, timeout_s=5)
    await tg.start(router.run)
    return service, router


async def until(predicate, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


async def test_route_all_round_trip_with_the_real_service(tmp_path):
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            service, router = await serving(tmp_path, tg)
            a, b = list(range(3 * BLOCK)), list(range(100, 100 + 3 * BLOCK))
            group = [RouteRequest(request_id=f"c{i}", token_ids=p) for i, p in enumerate((a, a, a, b, b, b))]
            routes = await router.route_all(group)
            assert [r.request_id for r in routes] == [f"c{i}" for i in range(6)]
            assert {r.worker.instance_id for r in routes} == {1, 2}  # spread over both
            assert len(service.routes) == 6 and len(service.router.load) == 6
            assert len(service.router._unstarted) == 6
            for route in routes:
                route.started()
            await until(lambda: not service.router._unstarted)
            for route in routes:
                route.first_token()
                route.finished()
            await until(lambda: not service.routes and len(service.router.load) == 0)
            tg.cancel_scope.cancel()


async def busy(service, router) -> list:
    """Fill both workers over the queue threshold (0.1 * 256 tokens each)."""
    routes = [
        await router.route(RouteRequest(request_id=f"fill-{i}", token_ids=list(range(i, i + 40))))
        for i in (1000, 2000)
    ]
    assert {r.worker.instance_id for r in routes} == {1, 2}
    return routes


async def test_a_queued_group_withdrawn_by_its_caller_leaves_the_service_queue(tmp_path):
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            service, router = await serving(tmp_path, tg, queue_threshold=0.1, max_queued_requests=3)
            fill = await busy(service, router)
            async with anyio.create_task_group() as client:
                client.start_soon(router.route_all, [req(f"g{i}") for i in range(3)])
                await until(lambda: service.router.queue.pending_requests == 3)
                assert len(service.router.queue) == 1
                with pytest.raises(QueueFullError, match="--router-queue-limit 3"):
                    await router.route(req("one-too-many"))
                client.cancel_scope.cancel()  # the HTTP client went away
            await until(lambda: len(service.router.queue) == 0 and not service._waiting)
            for route in fill:
                route.finished()
            await until(lambda: len(service.router.load) == 0)
            assert not service.routes
            tg.cancel_scope.cancel()


async def raw_client(endpoint: str):
    sock = configure(async_context().socket(zmq.DEALER))
    sock.connect(endpoint)
    return sock


async def test_a_client_that_disconnects_loses_its_queries_and_bookings_within_seconds(tmp_path):
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            service, router = await serving(tmp_path, tg, queue_threshold=0.1)
            booker = await raw_client(service.endpoint)
            await booker.send_multipart(encode(RouteQuery(1, "held", list(range(40)))))
            answer = decode_router_message(await booker.recv_multipart())
            assert isinstance(answer, RouteAnswer) and answer.member == 0
            other = await router.route(RouteRequest(request_id="fill", token_ids=list(range(500, 540))))
            assert [service.router.load.num_requests((i, 0)) for i in (1, 2)] == [1, 1]
            waiter = await raw_client(service.endpoint)
            await waiter.send_multipart(
                encode(RouteQuery(1, "w0", list(range(8)), siblings=["w1"], reports_start=True))
            )
            await until(lambda: service.router.queue.pending_requests == 2)
            assert len(service.routes) == 2
            booker.close(linger=0)  # a frontend that crashed: one booked, two waiting
            waiter.close(linger=0)
            await until(lambda: len(service.router.queue) == 0 and not service._waiting, 3)
            await until(lambda: len(service.routes) == 1, 3)
            assert len(service.router.load) == 1  # only the live frontend's booking is left
            other.finished()
            await until(lambda: len(service.router.load) == 0)
            tg.cancel_scope.cancel()


async def test_a_booking_never_started_is_freed_unless_the_client_predates_start_reports(tmp_path):
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            # long enough that the answers are read before it can expire, on a loaded machine too
            service, _ = await serving(tmp_path, tg, unstarted_booking_secs=1.5)
            client = await raw_client(service.endpoint)
            try:
                await client.send_multipart(encode(RouteQuery(1, "new", [1, 2, 3, 4], reports_start=True)))
                await client.send_multipart(encode(RouteQuery(2, "old", [1, 2, 3, 4])))
                for _ in range(2):
                    assert isinstance(decode_router_message(await client.recv_multipart()), RouteAnswer)
                assert len(service.routes) == 2
                # the frontend that asked "new" crashed or hung between routing and sending
                await until(lambda: len(service.routes) == 1, 6)
                assert next(iter(service.routes))[1] == "old" and len(service.router.load) == 1
                assert service.router.unstarted_expired == 1
                with anyio.move_on_after(0.5):
                    while True:  # probes only: ignored by every client
                        probe = decode_router_message(await client.recv_multipart())
                        assert (probe.query_id, probe.code) == (0, "probe")
            finally:
                client.close(linger=0)
            tg.cancel_scope.cancel()


async def test_the_service_refuses_a_malformed_group(tmp_path):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            service, _ = await serving(tmp_path, tg)
            client = await raw_client(service.endpoint)
            try:
                for query, needle in (
                    (RouteQuery(1, "a", [1], siblings=["a"]), "must differ"),
                    (RouteQuery(2, "a", [1], siblings=["b"], sibling_prompts=[0, 0]), "2 entries"),
                    (RouteQuery(3, "a", [1], siblings=["b"], sibling_prompts=[2]), "outside 0..0"),
                    (RouteQuery(4, "a", [1, 2], prompt_media=[[], []]), "2 entries for 1 prompts"),
                    (RouteQuery(5, "a", [1, 2], prompt_media=[[(1, 2, 3)]]), "outside its prompt"),
                    (RouteQuery(7, "a", [1, 2], prompt_media=[[(0, 1, 3)] * 3]), "outside its prompt"),
                    (RouteQuery(6, "a", [1, 2], prompt_media=[[(0, 1, -1)]]), "not a u64"),
                    (RouteQuery(8, "a", [1, 2], overlap_score_credit=1.5), "from 0.0 to 1.0"),
                ):
                    await client.send_multipart(encode(query))
                    refused = decode_router_message(await client.recv_multipart())
                    assert (refused.query_id, refused.code) == (query.query_id, "bad_request")
                    assert needle in refused.message
                assert not service.routes and not service._waiting
            finally:
                client.close(linger=0)
            tg.cancel_scope.cancel()


# --------------------------------------------------------------------------- a router that is lost


def closable(tg, service: FakeService) -> anyio.CancelScope:
    """Serve ``service`` until the returned scope is cancelled, which closes its socket (as the
    kernel closes a killed process's)."""
    scope = anyio.CancelScope()

    async def serve() -> None:
        with scope:
            await service.serve()

    tg.start_soon(serve)
    return scope


async def with_fallback(tmp_path, tg, address: str, *, fallback: bool = True) -> RemoteRouter:
    store = memory_store(tmp_path, "t")
    for i in (1, 2):
        await store.put(record(i), ttl_s=30)
    pool = WorkerPool(store, "m")
    await tg.start(pool.run)
    router = RemoteRouter(
        pool, address, timeout_s=30, worker_wait_s=0.2, fallback=LeastLoadedRouter(pool) if fallback else None
    )
    await tg.start(router.run)
    return router


def messages(caplog, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


async def test_a_lost_router_is_routed_around_at_once_and_used_again_when_it_is_back(tmp_path, caplog):
    caplog.set_level(logging.INFO, "dyn.router.remote")
    service = FakeService()
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            serving = closable(tg, service)
            router = await with_fallback(tmp_path, tg, service.endpoint)
            booked = await router.route(req("ok-1"))
            assert isinstance(booked, RemoteRoute) and router.degraded() is None
            waiting: list = []

            async def wait_for_silent() -> None:
                waiting.append(await router.route(req("silent-1")))

            tg.start_soon(wait_for_silent)
            await service.wait(lambda: service.silent)

            lost = time.monotonic()
            serving.cancel()  # the dyn router dies: its socket closes
            while not waiting:
                await anyio.sleep(0.005)
            assert time.monotonic() - lost < 0.5  # the waiting query did not wait its 30 s
            assert not isinstance(waiting[0], RemoteRoute)
            started = time.monotonic()
            route = await router.route(req("ok-2"))
            named = await router.route(RouteRequest(request_id="ok-3", token_ids=[1], instance_id=2))
            assert time.monotonic() - started < 0.1
            assert not isinstance(route, RemoteRoute) and named.worker.instance_id == 2
            degraded = router.degraded()
            assert degraded.startswith(f"the dyn router at {service.endpoint} is unreachable for ")
            assert degraded.endswith(
                ": the connection closed (the server died, or stopped answering "
                "heartbeats); routing by least load"
            )
            assert router.unroutable() is None
            booked.finished()  # its report to the lost router is dropped without harm

            back = FakeService(service.endpoint)  # restarted on the same port
            tg.start_soon(back.serve)
            while not router.reachable:
                await anyio.sleep(0.02)
            assert isinstance(await router.route(req("ok-4")), RemoteRoute)
            assert [q.request_id for q in back.queries] == ["ok-4"] and router.degraded() is None
            tg.cancel_scope.cancel()
    assert len(messages(caplog, logging.WARNING, "is unreachable")) == 1
    assert messages(caplog, logging.INFO, "answers again") == [
        f"the dyn router at {service.endpoint} answers again; routing through it"
    ]


async def test_without_a_fallback_a_lost_router_fails_requests_at_once(tmp_path):
    service = FakeService()
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            serving = closable(tg, service)
            router = await with_fallback(tmp_path, tg, service.endpoint, fallback=False)
            await router.route(req("ok-1"))
            assert router.unroutable() is None
            serving.cancel()
            while router.reachable:
                await anyio.sleep(0.005)
            started = time.monotonic()
            with pytest.raises(NoWorkersError, match="is unreachable for .* check that 'dyn router' runs"):
                await router.route(req("ok-2"))
            assert time.monotonic() - started < 0.1
            assert router.unroutable().endswith("; no request can be routed") and router.degraded() is None
            tg.cancel_scope.cancel()


async def test_auto_moves_to_another_live_router_when_the_one_in_use_is_lost(tmp_path):
    first, second = FakeService(), FakeService()
    workers = memory_store(tmp_path, "t")
    routers = routers_store(workers)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            serving = closable(tg, first)
            tg.start_soon(second.serve)
            for instance_id, service in ((1, first), (2, second)):  # the first is chosen first
                await routers.put(
                    router_record(routers, "m", instance_id, request=service.endpoint), ttl_s=30
                )
            router = await with_fallback(tmp_path, tg, "auto")
            assert router.endpoint == first.endpoint
            assert isinstance(await router.route(req("ok-1")), RemoteRoute)
            serving.cancel()  # its record stays until its lease ends
            lost = time.monotonic()
            while router.endpoint != second.endpoint:
                await anyio.sleep(0.01)
            assert time.monotonic() - lost < 0.5
            assert isinstance(await router.route(req("ok-2")), RemoteRoute)
            assert [q.request_id for q in second.queries] == ["ok-2"]
            tg.cancel_scope.cancel()
