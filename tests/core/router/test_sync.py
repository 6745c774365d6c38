"""``ReplicaSync``: two KV routers in one process share bookings over real loopback PUB/SUB."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import msgspec
import pytest
import zmq
from prometheus_client import CollectorRegistry

from dyn.core.discovery.services import new_instance_id
from dyn.core.discovery.store import DiscoveryStore
from dyn.core.messages import (
    ACTIVE_SEQUENCES_TOPIC,
    ActiveSequenceEvent,
    WorkerEndpoints,
    WorkerRecord,
)
from dyn.core.router.build import build_router
from dyn.core.router.config import KvRouterConfig
from dyn.core.router.kv import KvRouter
from dyn.core.router.policy import RouteRequest
from dyn.core.router.pool import WorkerPool
from dyn.core.router.registry import router_record, routers_store
from dyn.core.router.sync import MAX_EVENTS_PER_MESSAGE, ReplicaSync
from dyn.core.transport.sockets import async_context, bind_random, configure, sync_context
from tests.memory_discovery import memory_store

pytestmark = pytest.mark.anyio

BLOCK = 16
WORKERS = (1, 2, 3)


def record(instance_id: int) -> WorkerRecord:
    return WorkerRecord(
        instance_id=instance_id,
        namespace="t",
        model_name="m",
        engine="mocker",
        endpoints=WorkerEndpoints(f"tcp://127.0.0.1:{20000 + instance_id}"),
        block_size=BLOCK,
        total_kv_blocks=1024,
        max_num_batched_tokens=8192,
    )


def req(request_id: str, prompt: int = 0) -> RouteRequest:
    return RouteRequest(request_id=request_id, token_ids=[prompt * 1000 + i for i in range(8 * BLOCK)])


async def replica(tg, store: DiscoveryStore) -> tuple[KvRouter, ReplicaSync]:
    pool = WorkerPool(store, "m")
    config = KvRouterConfig(use_kv_events=False, replica_sync=True)
    router = build_router("kv", pool, config, CollectorRegistry(), namespace="t").agg
    assert isinstance(router, KvRouter)
    await tg.start(pool.run)
    await tg.start(router.run)
    sync = router.on_booking.__self__
    assert isinstance(sync, ReplicaSync) and router.router_id == sync.router_id
    return router, sync


async def workers_store(tmp_path) -> DiscoveryStore:
    """An in-memory discovery store holding ``WORKERS``."""
    store = memory_store(tmp_path, "t")
    for i in WORKERS:
        await store.put(record(i), ttl_s=30)
    return store


@contextlib.asynccontextmanager
async def peer_publisher(store: DiscoveryStore) -> AsyncIterator[zmq.Socket]:
    """A PUB socket registered as another router replica of model "m" (its lease held): what it
    publishes reaches every replica that follows its peers."""
    pub = configure(sync_context().socket(zmq.PUB))
    routers = routers_store(store)
    peer = router_record(routers, "m", new_instance_id(), kv_events=bind_random(pub, "127.0.0.1"))
    try:
        async with routers.lease(peer):
            yield pub
    finally:
        pub.close(linger=0)


async def until(predicate, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)


def booked(router: KvRouter) -> int:
    return sum(router.load.num_requests((w, 0)) for w in WORKERS)


async def first_heard(a: KvRouter, b: KvRouter) -> object:
    """Book on ``a`` until ``b`` hears a booking (PUB/SUB drops what is published before the
    subscription is live); returns the route ``b`` heard, the others are finished."""
    for i in range(100):
        route = await a.route(req(f"probe-{i}", prompt=i))
        with anyio.move_on_after(0.2):
            await until(lambda: booked(b) > 0)
            return route
        route.finished()
    raise AssertionError("the peer never heard a booking")


async def test_a_peer_counts_the_other_replicas_bookings_and_follows_its_decisions(tmp_path):
    store = await workers_store(tmp_path)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            a, sync_a = await replica(tg, store)
            b, sync_b = await replica(tg, store)
            assert a.router_id != b.router_id
            await until(lambda: sync_a.peers and sync_b.peers)
            assert list(sync_a.peers.values()) == [sync_b.endpoint]

            route = await first_heard(a, b)
            key = route.decision.worker
            assert b.load.num_requests(key) == 1 and booked(b) == 1
            assert b.load.active_tokens(key) > 0

            route.first_token()  # A's prompt no longer loads the worker, on B too
            await until(lambda: b.load.active_tokens(key) == 0)
            # B knows A's decision (approximate mode): the same prompt goes to the same worker
            again = await b.route(req("again", prompt=int(route.request_id.split("-")[1])))
            assert again.decision.worker == key and again.decision.overlap_blocks == 8
            await until(lambda: a.load.num_requests(key) == 2)

            route.finished()
            again.finished()
            await until(lambda: booked(a) == 0 and booked(b) == 0)
            assert sync_a.applied and sync_b.applied and not sync_a.dropped
            assert a.router_id not in sync_a.heard
            tg.cancel_scope.cancel()


async def test_own_events_and_malformed_messages_are_skipped(tmp_path):
    store = await workers_store(tmp_path)
    encode = msgspec.msgpack.encode
    with anyio.fail_after(15):
        async with peer_publisher(store) as pub, anyio.create_task_group() as tg:
            a, sync_a = await replica(tg, store)
            await until(lambda: sync_a.peers)
            own = ActiveSequenceEvent(a.router_id, "mine", 1, 0, "add", isl_tokens=50)
            for i in range(200):
                pub.send_multipart([ACTIVE_SEQUENCES_TOPIC, encode(own)])
                pub.send_multipart([ACTIVE_SEQUENCES_TOPIC, b"\xc1 not msgpack"])
                pub.send_multipart([ACTIVE_SEQUENCES_TOPIC])
                pub.send_multipart(  # several events a message, a malformed one among them
                    [
                        ACTIVE_SEQUENCES_TOPIC,
                        encode(ActiveSequenceEvent("peer", f"theirs-{i}", 2, 0, "add", isl_tokens=50)),
                        b"\xc1 not msgpack",
                        encode(ActiveSequenceEvent("peer", f"also-{i}", 2, 0, "add", isl_tokens=50)),
                    ]
                )
                with anyio.move_on_after(0.05):
                    await until(lambda: booked(a) > 0)
                    break
            assert booked(a) == 2 and a.load.num_requests((2, 0)) == 2
            assert f"{a.router_id}/mine" not in a.load and sync_a.heard == {"peer"}
            # its own decisions still book normally
            route = await a.route(req("local"))
            assert booked(a) == 3
            route.finished()
            tg.cancel_scope.cancel()


def booking_tap(sync):
    """A SUB socket on ``sync``'s booking changes, to read its messages' frames."""
    tap = configure(async_context().socket(zmq.SUB))
    tap.setsockopt(zmq.SUBSCRIBE, ACTIVE_SEQUENCES_TOPIC)
    tap.connect(sync.endpoint)
    return tap


async def test_one_passs_booking_changes_go_out_as_one_message(tmp_path):
    """A ZMQ send costs as much as a route: the booking changes of one event-loop pass share one
    message, ``[topic, event, event, ...]``."""
    store = await workers_store(tmp_path)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            a, sync_a = await replica(tg, store)
            tap = booking_tap(sync_a)
            try:
                events = [ActiveSequenceEvent("", f"r{i}", 1, 0, "add", isl_tokens=10) for i in range(3)]
                for _ in range(100):  # until the tap's subscription is live
                    for event in events:
                        sync_a.publish(event)
                    with anyio.move_on_after(0.05):
                        frames = await tap.recv_multipart()
                        break
                assert frames[0] == ACTIVE_SEQUENCES_TOPIC and len(frames) == 4
                assert [
                    msgspec.msgpack.decode(f, type=ActiveSequenceEvent).request_id for f in frames[1:]
                ] == [
                    "r0",
                    "r1",
                    "r2",
                ]
            finally:
                tap.close(linger=0)
            tg.cancel_scope.cancel()


async def test_a_pass_booking_more_than_a_message_holds_sends_several(tmp_path):
    """A message carries at most ``MAX_EVENTS_PER_MESSAGE`` events; the rest follow in the next."""
    store = await workers_store(tmp_path)
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            a, sync_a = await replica(tg, store)
            tap = booking_tap(sync_a)
            try:
                for _ in range(100):  # until the tap's subscription is live
                    sync_a.publish(ActiveSequenceEvent("", "probe", 1, 0, "free"))
                    with anyio.move_on_after(0.05):
                        await tap.recv_multipart()
                        break
                total = MAX_EVENTS_PER_MESSAGE + 6
                for i in range(total):
                    sync_a.publish(ActiveSequenceEvent("", f"r{i}", 1, 0, "add", isl_tokens=1))
                sizes, ids = [], []
                while len(ids) < total:
                    frames = await tap.recv_multipart()
                    sizes.append(len(frames) - 1)
                    ids += [
                        msgspec.msgpack.decode(f, type=ActiveSequenceEvent).request_id for f in frames[1:]
                    ]
                assert max(sizes) == MAX_EVENTS_PER_MESSAGE and len(sizes) == 2
                assert ids == [f"r{i}" for i in range(total)]
            finally:
                tap.close(linger=0)
            tg.cancel_scope.cancel()


async def test_a_message_of_more_events_than_a_peer_sends_is_skipped_whole(tmp_path):
    store = await workers_store(tmp_path)
    encode = msgspec.msgpack.encode
    too_many = [
        encode(ActiveSequenceEvent("peer", f"flood-{i}", 2, 0, "add", isl_tokens=5))
        for i in range(MAX_EVENTS_PER_MESSAGE + 1)
    ]
    with anyio.fail_after(15):
        async with peer_publisher(store) as pub, anyio.create_task_group() as tg:
            a, sync_a = await replica(tg, store)
            await until(lambda: sync_a.peers)
            for i in range(200):
                pub.send_multipart([ACTIVE_SEQUENCES_TOPIC, *too_many])
                pub.send_multipart(
                    [
                        ACTIVE_SEQUENCES_TOPIC,
                        encode(ActiveSequenceEvent("peer", f"ok-{i}", 2, 0, "add", isl_tokens=5)),
                    ]
                )
                with anyio.move_on_after(0.05):
                    await until(lambda: booked(a) > 0)
                    break
            await anyio.sleep(0.1)  # a flood sent after the last small one would show up too
            assert booked(a) == 1 and not any(f"peer/flood-{i}" in a.load for i in range(5))
            tg.cancel_scope.cancel()
