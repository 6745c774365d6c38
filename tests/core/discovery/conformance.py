"""The contract every discovery backend meets: the docstrings of ``DiscoveryStore`` as tests.

A backend's test module imports these tests (``from tests.core.discovery.conformance import *``)
and provides a ``backend`` fixture: a ``Backend`` that makes stores of that backend over one
shared place (a directory, an etcd cluster) and names the shortest ttl it keeps. Stores made by
``backend.store`` are closed at teardown. Timing is real (a backend's expiry may live in another
process, etcd's), so every wait is bounded and every ttl the backend's short one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field

import anyio
import pytest

from dyn.core.discovery import DiscoveryEvent, DiscoveryStore, LeaseExpired, WorkerAdded, WorkerRemoved
from dyn.core.messages import WorkerEndpoints, WorkerRecord
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio

NS = "conf-ns"


@dataclass
class Backend:
    """How the suite makes stores of one backend."""

    name: str
    make: Callable[[str], DiscoveryStore]
    ttl_s: float
    """A short ttl the backend honours (etcd counts whole seconds, 2 at least)."""
    expiry_slack_s: float
    """How late after its ttl the backend may notice an expiry."""
    stores: list[DiscoveryStore] = field(default_factory=list)

    def store(self, namespace: str = NS) -> DiscoveryStore:
        store = self.make(namespace)
        self.stores.append(store)
        return store


def make_record(instance_id: int, namespace: str = NS, **changes) -> WorkerRecord:
    fields = dict(
        instance_id=instance_id,
        namespace=namespace,
        model_name="dyn-tiny",
        engine="mocker",
        endpoints=WorkerEndpoints(request=f"tcp://127.0.0.1:{5000 + instance_id}"),
        block_size=16,
        total_kv_blocks=1024,
        max_num_batched_tokens=8192,
        pid=os.getpid(),
    )
    fields.update(changes)
    return WorkerRecord(**fields)


async def ids(store: DiscoveryStore) -> list[int]:
    return [r.instance_id for r in await store.list()]


class Events:
    """A running ``watch`` of a store whose events are collected in ``seen``."""

    def __init__(self) -> None:
        self.seen: list[DiscoveryEvent] = []

    async def follow(self, store: DiscoveryStore, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        async with aclosing(store.watch()) as events:
            task_status.started()
            async for event in events:
                self.seen.append(event)

    async def wait(self, count: int, timeout: float = 10.0) -> list[DiscoveryEvent]:
        await wait_until(lambda: len(self.seen) >= count, timeout, f"{count} events, saw {self.seen}")
        return self.seen[:count]


async def test_put_then_list_sorted_by_instance_id(backend: Backend) -> None:
    store = backend.store()
    for instance_id in (30, 10, 20):
        await store.put(make_record(instance_id), ttl_s=60)
    assert await ids(store) == [10, 20, 30]
    assert await store.list() == [make_record(10), make_record(20), make_record(30)]


async def test_put_replaces_the_record_with_the_same_id(backend: Backend) -> None:
    store = backend.store()
    await store.put(make_record(1), ttl_s=60)
    await store.put(make_record(1, model_name="other"), ttl_s=60)
    assert await store.list() == [make_record(1, model_name="other")]


async def test_put_refuses_another_namespace_and_a_bad_ttl(backend: Backend) -> None:
    store = backend.store()
    with pytest.raises(ValueError, match="namespace"):
        await store.put(make_record(1, namespace="elsewhere"), ttl_s=60)
    for ttl in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ttl"):
            await store.put(make_record(1), ttl_s=ttl)
    assert await store.list() == []


async def test_another_store_on_the_same_place_sees_the_records(backend: Backend) -> None:
    writer, reader = backend.store(), backend.store()
    await writer.put(make_record(7), ttl_s=60)
    assert await ids(reader) == [7]
    await reader.delete(7)
    assert await ids(writer) == []


async def test_namespaces_are_isolated(backend: Backend) -> None:
    a, a_routers, b = backend.store("a"), backend.store("a.routers"), backend.store("b")
    await a.put(make_record(1, namespace="a"), ttl_s=60)
    await a_routers.put(make_record(2, namespace="a.routers"), ttl_s=60)
    assert await ids(a) == [1]
    assert await ids(a_routers) == [2]
    assert await ids(b) == []
    events = Events()
    async with anyio.create_task_group() as tg:
        await tg.start(events.follow, b)
        await b.put(make_record(3, namespace="b"), ttl_s=60)
        await a.put(make_record(4, namespace="a"), ttl_s=60)
        await a.delete(1)
        await events.wait(1)
        await anyio.sleep(0.5)  # time for a leak from namespace a to show
        tg.cancel_scope.cancel()
    assert events.seen == [WorkerAdded(make_record(3, namespace="b"))]


async def test_a_record_not_kept_alive_expires(backend: Backend) -> None:
    store = backend.store()
    put_at = time.monotonic()
    await store.put(make_record(1), ttl_s=backend.ttl_s)
    await store.put(make_record(2), ttl_s=60)
    await anyio.sleep(backend.ttl_s / 2)
    assert await ids(store) == [1, 2]  # live until its ttl passes
    deadline = put_at + backend.ttl_s + backend.expiry_slack_s
    while 1 in await ids(store):
        assert time.monotonic() < deadline, "the record outlived its ttl"
        await anyio.sleep(0.05)
    assert await ids(store) == [2]
    with pytest.raises(LeaseExpired):
        await store.keepalive(1)


async def test_keepalive_extends_the_life_of_a_record(backend: Backend) -> None:
    store = backend.store()
    await store.put(make_record(1), ttl_s=backend.ttl_s)
    end = time.monotonic() + 2.5 * backend.ttl_s
    while time.monotonic() < end:
        await anyio.sleep(backend.ttl_s / 3)
        await store.keepalive(1)
        assert await ids(store) == [1]


async def test_keepalive_of_an_absent_or_deleted_record_raises_lease_expired(backend: Backend) -> None:
    store = backend.store()
    with pytest.raises(LeaseExpired):
        await store.keepalive(99)
    await store.put(make_record(1), ttl_s=60)
    await store.delete(1)
    with pytest.raises(LeaseExpired):
        await store.keepalive(1)


async def test_delete_removes_and_deleting_an_absent_record_is_not_an_error(backend: Backend) -> None:
    store = backend.store()
    await store.put(make_record(1), ttl_s=60)
    await store.put(make_record(2), ttl_s=60)
    await store.delete(1)
    await store.delete(1)
    await store.delete(12345)
    assert await ids(store) == [2]


async def test_watch_yields_the_live_records_then_the_changes(backend: Backend) -> None:
    store, other = backend.store(), backend.store()
    await store.put(make_record(2), ttl_s=60)
    await store.put(make_record(1), ttl_s=60)
    events = Events()
    async with anyio.create_task_group() as tg:
        await tg.start(events.follow, store)
        assert await events.wait(2) == [WorkerAdded(make_record(1)), WorkerAdded(make_record(2))]
        await other.put(make_record(3), ttl_s=60)
        await events.wait(3)
        await other.put(make_record(3, model_name="changed"), ttl_s=60)
        await events.wait(4)
        await other.delete(2)
        await events.wait(5)
        await other.put(make_record(4), ttl_s=backend.ttl_s)
        await events.wait(6)
        await events.wait(7, timeout=backend.ttl_s + backend.expiry_slack_s + 1)
        tg.cancel_scope.cancel()
    assert events.seen[2:] == [
        WorkerAdded(make_record(3)),
        WorkerAdded(make_record(3, model_name="changed")),
        WorkerRemoved(instance_id=2, reason="deregistered"),
        WorkerAdded(make_record(4)),
        WorkerRemoved(instance_id=4, reason="expired"),
    ]


async def test_watch_of_an_empty_namespace_waits_and_is_cancellable(backend: Backend) -> None:
    store = backend.store("empty-ns")
    with anyio.move_on_after(0.5) as scope:
        async with aclosing(store.watch()) as events:
            async for event in events:
                raise AssertionError(f"unexpected {event}")
    assert scope.cancelled_caught


async def test_lease_puts_keeps_alive_and_deletes_on_exit(backend: Backend) -> None:
    store, observer = backend.store(), backend.store()
    async with store.lease(make_record(1), ttl_s=backend.ttl_s):
        assert await ids(observer) == [1]
        await anyio.sleep(2.5 * backend.ttl_s)
        assert await ids(observer) == [1]
    assert await ids(observer) == []


async def test_lease_deletes_on_error_and_cancellation(backend: Backend) -> None:
    store = backend.store()
    with pytest.raises(RuntimeError, match="boom"):
        async with store.lease(make_record(1), ttl_s=60):
            raise RuntimeError("boom")
    assert await ids(store) == []
    with anyio.move_on_after(0.2):
        async with store.lease(make_record(2), ttl_s=60):
            await anyio.sleep(10)
    assert await ids(store) == []


async def test_lease_puts_its_record_again_after_losing_it(backend: Backend) -> None:
    store, intruder = backend.store(), backend.store()
    async with store.lease(make_record(1), ttl_s=backend.ttl_s):
        await intruder.delete(1)
        assert await ids(intruder) == []
        deadline = time.monotonic() + backend.ttl_s + backend.expiry_slack_s
        while await ids(intruder) != [1]:
            assert time.monotonic() < deadline, "the lease did not register its record again"
            await anyio.sleep(0.05)
    assert await ids(intruder) == []
