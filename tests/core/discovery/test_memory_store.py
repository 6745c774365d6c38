"""The in-memory discovery backend: what the file store's unit tests check, on a manual clock,
plus how it is found by name (and refused where it cannot work). The shared contract runs in
``test_conformance.py``."""

from __future__ import annotations

import gc
from contextlib import aclosing

import anyio
import pytest

from dyn.core.config import DiscoveryConfig
from dyn.core.discovery import (
    BACKENDS,
    LeaseExpired,
    MemoryDiscoveryStore,
    MemoryHub,
    WorkerAdded,
    WorkerRemoved,
    listed_backends,
    open_store,
    register_backend,
    registered_backends,
)
from dyn.core.discovery.services import service_store
from dyn.core.messages import WorkerRecord
from tests.core.discovery import conformance
from tests.core.discovery.test_file_store import ManualClock, next_event

pytestmark = pytest.mark.anyio

NS = "test-ns"


def make_record(instance_id: int, namespace: str = NS, **changes) -> WorkerRecord:
    return conformance.make_record(instance_id, namespace, **changes)


async def test_put_then_list_sorted_and_another_store_on_the_hub_sees_it() -> None:
    hub = MemoryHub()
    store = MemoryDiscoveryStore(hub, NS)
    assert await store.list() == []
    await store.put(make_record(7), ttl_s=30)
    await store.put(make_record(3), ttl_s=30)
    assert await store.list() == [make_record(3), make_record(7)]
    await store.put(make_record(7, total_kv_blocks=2048), ttl_s=30)
    assert await store.list() == [make_record(3), make_record(7, total_kv_blocks=2048)]
    assert await MemoryDiscoveryStore(hub, NS).list() == await store.list()
    assert await MemoryDiscoveryStore(MemoryHub(), NS).list() == []  # another hub: another place


async def test_namespaces_are_isolated_and_bad_ones_refused() -> None:
    hub = MemoryHub()
    a, b = MemoryDiscoveryStore(hub, "stack-a"), MemoryDiscoveryStore(hub, "stack-b")
    await a.put(make_record(1, "stack-a"), ttl_s=30)
    await b.put(make_record(2, "stack-b"), ttl_s=30)
    assert [r.instance_id for r in await a.list()] == [1]
    assert [r.instance_id for r in await b.list()] == [2]
    for namespace in ("", "..", "a/b", "x" * 129):
        with pytest.raises(ValueError, match="invalid namespace"):
            MemoryDiscoveryStore(hub, namespace)
        with pytest.raises(ValueError, match="invalid namespace"):
            open_store("memory", namespace, hub.name)


async def test_expired_record_is_not_listed_and_is_collected() -> None:
    clock = ManualClock()
    hub = MemoryHub()
    store = MemoryDiscoveryStore(hub, NS, clock=clock)
    await store.put(make_record(1), ttl_s=5)
    clock.advance(5)
    assert [r.instance_id for r in await store.list()] == [1]  # live at exactly its ttl
    clock.advance(1)
    await store.put(make_record(2), ttl_s=5)
    assert [r.instance_id for r in await store.list()] == [2]
    assert list(hub._namespace(NS).entries) == [2]  # collected, not just hidden


async def test_keepalive_refreshes_or_reports_lost_lease() -> None:
    clock = ManualClock()
    store = MemoryDiscoveryStore(MemoryHub(), NS, clock=clock)
    with pytest.raises(LeaseExpired):
        await store.keepalive(1)
    await store.put(make_record(1), ttl_s=5)
    clock.advance(3)
    await store.keepalive(1)
    clock.advance(4)  # 7 s after the put, 4 after the keepalive
    assert await store.list() == [make_record(1)]
    clock.advance(6)
    with pytest.raises(LeaseExpired):
        await store.keepalive(1)
    assert await store.list() == []
    await store.delete(1)
    await store.delete(1)  # absent: not an error
    with pytest.raises(LeaseExpired):
        await store.keepalive(1)


async def test_watch_sees_add_change_deregister_and_expiry() -> None:
    clock = ManualClock()
    hub = MemoryHub()
    store = MemoryDiscoveryStore(hub, NS, clock=clock)
    other = MemoryDiscoveryStore(hub, NS, clock=clock)  # the workers' side
    await other.put(make_record(2), ttl_s=30)
    await other.put(make_record(1), ttl_s=30)
    async with aclosing(store.watch()) as events:
        assert await next_event(events) == WorkerAdded(make_record(1))
        assert await next_event(events) == WorkerAdded(make_record(2))

        await other.put(make_record(3), ttl_s=60)
        assert await next_event(events) == WorkerAdded(make_record(3))

        await other.put(make_record(3), ttl_s=60)  # the same record again: no event
        await other.put(make_record(3, total_kv_blocks=9), ttl_s=60)
        assert await next_event(events) == WorkerAdded(make_record(3, total_kv_blocks=9))

        await other.delete(1)
        assert await next_event(events) == WorkerRemoved(1, "deregistered")

        clock.advance(31)  # the watcher's expiry timer runs on the clock: no waiting out the ttl
        assert await next_event(events) == WorkerRemoved(2, "expired")
        assert await other.list() == [make_record(3, total_kv_blocks=9)]


async def test_watch_reports_expiry_noticed_by_someone_else() -> None:
    clock = ManualClock()
    hub = MemoryHub()
    watcher, other = MemoryDiscoveryStore(hub, NS, clock=clock), MemoryDiscoveryStore(hub, NS, clock=clock)
    await other.put(make_record(1), ttl_s=1.0)
    async with aclosing(watcher.watch()) as events:
        assert await next_event(events) == WorkerAdded(make_record(1))
        # the watcher is suspended; the record expires and another reader collects it
        clock.advance(1.2)
        assert await other.list() == []
        assert await next_event(events) == WorkerRemoved(1, "expired")


async def test_changes_while_the_watcher_is_suspended_come_removals_first_each_sorted() -> None:
    clock = ManualClock()
    hub = MemoryHub()
    store = MemoryDiscoveryStore(hub, NS, clock=clock)
    for instance_id in (1, 2, 3, 4):
        await store.put(make_record(instance_id), ttl_s=10 if instance_id == 3 else 60)
    async with aclosing(store.watch()) as events:
        for instance_id in (1, 2, 3, 4):
            assert await next_event(events) == WorkerAdded(make_record(instance_id))
        # the watcher is suspended at its last yield: these coalesce, as the file store's do
        await store.put(make_record(6), ttl_s=60)
        await store.delete(4)
        await store.put(make_record(5), ttl_s=60)
        await store.put(make_record(2, model_name="changed"), ttl_s=60)
        await store.delete(1)
        await store.put(make_record(1), ttl_s=60)  # gone and back: the same record, no event
        clock.advance(11)
        seen = [await next_event(events) for _ in range(5)]
    assert seen == [
        WorkerRemoved(3, "expired"),
        WorkerRemoved(4, "deregistered"),
        WorkerAdded(make_record(2, model_name="changed")),
        WorkerAdded(make_record(5)),
        WorkerAdded(make_record(6)),
    ]


async def test_watch_of_an_empty_namespace_waits_without_a_timer_and_is_cancellable() -> None:
    store = MemoryDiscoveryStore(MemoryHub(), NS)
    seen: list = []

    async def collect() -> None:
        async with aclosing(store.watch()) as events:
            async for event in events:
                seen.append(event)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            await anyio.sleep(0.05)
            assert seen == []
            await store.put(make_record(4), ttl_s=30)
            while not seen:
                await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
    assert seen == [WorkerAdded(make_record(4))]
    assert store._records.waiters == set()  # a closed watcher leaves nothing behind


async def test_lease_heartbeat_runs_on_the_store_clock() -> None:
    clock = ManualClock()
    store = MemoryDiscoveryStore(MemoryHub(), NS, clock=clock)
    with anyio.fail_after(10):
        async with store.lease(make_record(1), ttl_s=3):
            for _ in range(10):  # ten ttls of the clock, kept alive by the heartbeat every ttl/3
                await clock.sleeping()
                clock.advance(1.0)
                while store._records.entries[1].refreshed_at != clock.time():
                    await anyio.sleep(0.005)
                assert await store.list() == [make_record(1)]
        assert await store.list() == []


async def test_lease_registers_again_after_losing_its_record() -> None:
    clock = ManualClock()
    store = MemoryDiscoveryStore(MemoryHub(), NS, clock=clock)
    with anyio.fail_after(10):
        async with store.lease(make_record(1), ttl_s=3):
            await store.delete(1)
            await clock.sleeping()
            clock.advance(1.0)
            while await store.list() != [make_record(1)]:
                await anyio.sleep(0.005)


def test_open_store_finds_a_living_hub_by_name_and_refuses_otherwise() -> None:
    hub = MemoryHub()
    store = open_store("memory", NS, hub.name)
    assert isinstance(store, MemoryDiscoveryStore) and store.hub is hub
    config = DiscoveryConfig(namespace=NS, backend="memory", dir=hub.name)
    assert config.open().hub is hub
    named = MemoryHub("my-hub")
    assert open_store("memory", NS, "my-hub").hub is named
    with pytest.raises(ValueError, match="exists already"):
        MemoryHub("my-hub")
    with pytest.raises(ValueError, match="inside one process.*'nowhere' names none.*file or etcd"):
        open_store("memory", NS, "nowhere")
    with pytest.raises(ValueError, match="inside one process.*MemoryHub made in this process;"):
        open_store("memory", NS)  # what `--discovery-backend memory` gets: no hub in a command
    del store, config, named
    gc.collect()
    with pytest.raises(ValueError, match="'my-hub' names none"):  # hubs are held weakly by name
        open_store("memory", NS, "my-hub")


def test_memory_is_registered_but_not_listed_where_the_command_line_lists_backends() -> None:
    assert BACKENDS == listed_backends() == ("file", "etcd")
    assert list(registered_backends()) == ["file", "etcd", "memory"]
    assert not registered_backends()["memory"].listed
    with pytest.raises(ValueError, match=r"^unknown discovery backend 'consul'; choose one of: file, etcd$"):
        open_store("consul", NS)
    with pytest.raises(ValueError, match="already registered"):
        register_backend("memory", lambda *a, **k: MemoryDiscoveryStore(MemoryHub(), NS))


async def test_service_stores_share_the_hub_in_their_own_namespace() -> None:
    clock = ManualClock()
    workers = MemoryDiscoveryStore(MemoryHub(), NS, clock=clock)
    routers = service_store(workers, "routers")
    assert isinstance(routers, MemoryDiscoveryStore)
    assert (routers.hub, routers.namespace, routers.clock) == (workers.hub, f"{NS}.routers", clock)
    await routers.put(make_record(1, f"{NS}.routers"), ttl_s=30)
    assert await workers.list() == []
    assert await service_store(workers, "routers").list() == [make_record(1, f"{NS}.routers")]
