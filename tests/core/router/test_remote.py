"""``RemoteRouter`` against an in-test router service (a real ROUTER socket on loopback)."""

from __future__ import annotations

import anyio
import pytest
import zmq

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.discovery.services import new_instance_id
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
    RouteRequest,
    RoutingError,
    TargetRequiredError,
    WorkerNotFoundError,
)
from dyn.core.router.pool import WorkerPool
from dyn.core.router.registry import router_record, routers_store
from dyn.core.router.remote import RemoteRouter
from dyn.core.transport.codec import decode_router_message, encode
from dyn.core.transport.sockets import async_context, bind_random, configure

pytestmark = pytest.mark.anyio

BLOCK = 4


def record(instance_id: int) -> WorkerRecord:
    return WorkerRecord(instance_id=instance_id, namespace="t", model_name="m", engine="mocker",
                        endpoints=WorkerEndpoints(f"tcp://127.0.0.1:{20000 + instance_id}"),
                        block_size=BLOCK, total_kv_blocks=64, max_num_batched_tokens=256)


class FakeService:
    """Answers each query by its request id: ``ok`` books worker 1 rank 0, a refusal code is
    refused with it, ``silent`` is never answered (``late`` answers it on demand), ``stranger``
    books worker 999; anything after a ``junk`` query gets a malformed frame and a reply to an
    unknown query first."""

    def __init__(self) -> None:
        self.socket = configure(async_context().socket(zmq.ROUTER))
        self.endpoint = bind_random(self.socket, "127.0.0.1")
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
    store = FileDiscoveryStore(tmp_path, "t", poll_interval_s=0.02)
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
                ("ok-1", "first_token", 0), ("ok-1", "progress", 4), ("ok-1", "progress", 9),
                ("ok-1", "progress", 12), ("ok-1", "finished", 12)]
            tg.cancel_scope.cancel()


@pytest.mark.parametrize(("code", "error"), [
    ("no_workers", NoWorkersError), ("worker_not_found", WorkerNotFoundError),
    ("all_busy", AllWorkersBusyError), ("target_required", TargetRequiredError),
    ("error", RoutingError),
])
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
            await service.answer_silent()
            await service.wait(lambda: service.progress)
            assert [(p.request_id, p.event) for p in service.progress] == [("silent-1", "finished")]
            tg.cancel_scope.cancel()


async def test_a_cancelled_route_frees_the_booking_that_arrives_later(tmp_path):
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            router, service = await started(tmp_path, tg)
            async with anyio.create_task_group() as client:
                client.start_soon(router.route, req("silent-2"))
                await service.wait(lambda: service.silent)
                client.cancel_scope.cancel()
            await service.answer_silent()
            await service.wait(lambda: service.progress)
            assert [(p.request_id, p.event) for p in service.progress] == [("silent-2", "finished")]
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
            tg.cancel_scope.cancel()


async def test_route_before_run_or_with_a_bad_address_is_a_clear_error(tmp_path):
    pool = WorkerPool(FileDiscoveryStore(tmp_path, "t"), "m")
    with pytest.raises(NoWorkersError, match="not connected yet"):
        await RemoteRouter(pool, "tcp://127.0.0.1:1").route(req("ok"))
    with pytest.raises(ValueError, match="not a ZMQ address"):
        RemoteRouter(pool, "localhost:5555")


async def test_auto_finds_a_router_in_the_routers_namespace(tmp_path):
    service = FakeService()
    workers = FileDiscoveryStore(tmp_path, "t", poll_interval_s=0.02)
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
            async with routers.lease(router_record(routers, "m", new_instance_id(),
                                                   request=service.endpoint)):
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

    store = FileDiscoveryStore(tmp_path, "t", poll_interval_s=0.02)
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
