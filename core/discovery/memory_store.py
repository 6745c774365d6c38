"""The in-memory discovery backend: worker records in a ``MemoryHub``, inside one process.

For tests (and other in-process uses) that need a discovery store but not the file or etcd
backend: a put is a dict write and a watcher hears of it at once, with no files, threads or
servers. **Its records live in one process**: a worker in another process can neither see nor
register in them, which is why the command line does not offer it (``backends``: registered as
``memory`` but not listed; ``--discovery-backend memory`` is refused unless the process itself
made the hub its ``--discovery-dir`` names, which a command never does).

A ``MemoryHub`` is the place the stores share, as file stores share a directory: the records of
every namespace, each with its ttl and the time of its last heartbeat (by the writing store's
``Clock``). ``MemoryDiscoveryStore(hub, namespace)`` makes a store on it directly;
``open_store("memory", namespace, root=hub.name)`` (or a ``DiscoveryConfig`` with
``backend="memory", dir=hub.name``) finds it by name while it lives: hubs are held weakly by
name, so a test's hub goes with the test.

The semantics are the file store's: a record is live while ``now - last heartbeat <= ttl_s``
(``now`` from the reading store's clock); whoever lists, keeps alive or watches collects an
expired record; a watcher rescans on every change (changes that come while it is suspended
coalesce, as the file store's do) and on a timer set for the next record to expire, reporting
removals (sorted by id) before additions and replacements (sorted by id). A removal is
``"deregistered"`` when it was a ``delete`` and ``"expired"`` when the record was collected.
A hub and its stores belong to one event loop thread at a time: nothing is locked.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Literal, NamedTuple

import anyio

from dyn.core.discovery.store import (
    SYSTEM_CLOCK,
    Clock,
    DiscoveryEvent,
    DiscoveryStore,
    LeaseExpired,
    expiry_timer,
    scan_events,
    validate_namespace,
)
from dyn.core.messages import WorkerRecord

_hubs: weakref.WeakValueDictionary[str, MemoryHub] = weakref.WeakValueDictionary()
_hub_numbers = itertools.count(1)


class _Entry(NamedTuple):
    record: WorkerRecord
    ttl_s: float
    refreshed_at: float


class _Namespace:
    """The records of one namespace in a hub, why the ones that went are gone, and its watchers."""

    def __init__(self) -> None:
        self.entries: dict[int, _Entry] = {}
        self.gone: dict[int, Literal["deregistered", "expired"]] = {}
        self.waiters: set[anyio.Event] = set()

    def remove(self, instance_id: int, reason: Literal["deregistered", "expired"]) -> bool:
        if self.entries.pop(instance_id, None) is None:
            return False
        self.gone[instance_id] = reason
        return True

    def changed(self) -> None:
        for waiter in self.waiters:
            waiter.set()


class MemoryHub:
    """Where memory stores keep their records (see the module docstring).

    ``name``: how ``open_store("memory", ..., root=name)`` finds the hub while it lives; default
    ``memory-<n>``, unique in the process. ``ValueError`` if a living hub has the name already.
    """

    def __init__(self, name: str | None = None) -> None:
        if name is None:
            name = f"memory-{next(_hub_numbers)}"
            while name in _hubs:
                name = f"memory-{next(_hub_numbers)}"
        elif name in _hubs:
            raise ValueError(f"a memory discovery hub named {name!r} exists already")
        self.name = name
        self._namespaces: dict[str, _Namespace] = {}
        _hubs[name] = self

    def __repr__(self) -> str:
        return f"MemoryHub({self.name!r})"

    def _namespace(self, namespace: str) -> _Namespace:
        found = self._namespaces.get(namespace)
        if found is None:
            found = self._namespaces[namespace] = _Namespace()
        return found


def hub_named(root: str | Path | MemoryHub | None) -> MemoryHub:
    """The living hub ``root`` names (or is); ``ValueError`` saying what the backend is for if none."""
    if isinstance(root, MemoryHub):
        return root
    hub = _hubs.get(str(root)) if root is not None else None
    if hub is None:
        named = "" if root is None else f", and {str(root)!r} names none"
        raise ValueError(
            "the memory discovery backend keeps its records inside one process (for tests): its "
            f"root must name a MemoryHub made in this process{named}; between processes use the "
            "file or etcd backend"
        )
    return hub


class MemoryDiscoveryStore(DiscoveryStore):
    """Worker records of ``namespace`` in ``hub``, within this process; see the module docstring.

    Several stores may share a hub (the stand-ins of several processes in one test); ``clock`` is
    what expiry is judged by and what the heartbeat times written say (tests pass a manual one).
    """

    def __init__(self, hub: MemoryHub, namespace: str, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.namespace = validate_namespace(namespace)
        self.hub = hub
        self.clock = clock
        self._records = hub._namespace(namespace)

    def for_namespace(self, namespace: str) -> MemoryDiscoveryStore:
        return MemoryDiscoveryStore(self.hub, namespace, clock=self.clock)

    async def put(self, record: WorkerRecord, ttl_s: float) -> None:
        ttl_s = self.checked_ttl(record, ttl_s)
        self._records.entries[record.instance_id] = _Entry(record, ttl_s, self.clock.time())
        self._records.gone.pop(record.instance_id, None)
        self._records.changed()

    async def keepalive(self, instance_id: int) -> None:
        entry = self._records.entries.get(instance_id)
        if entry is None:
            raise LeaseExpired(f"no discovery record for instance {instance_id}")
        now = self.clock.time()
        if now - entry.refreshed_at > entry.ttl_s:
            self._records.remove(instance_id, "expired")
            self._records.changed()
            raise LeaseExpired(f"the discovery record of instance {instance_id} expired")
        self._records.entries[instance_id] = entry._replace(refreshed_at=now)

    async def delete(self, instance_id: int) -> None:
        if self._records.remove(instance_id, "deregistered"):
            self._records.changed()

    async def list(self) -> list[WorkerRecord]:
        live = self._scan()
        return [live[instance_id].record for instance_id in sorted(live)]

    async def watch(self) -> AsyncGenerator[DiscoveryEvent, None]:
        known: dict[int, _Entry] = {}
        records = self._records
        while True:
            # registered before the scan: a change made after it (also while the caller holds
            # us at a yield) wakes the wait below at once
            wake = anyio.Event()
            records.waiters.add(wake)
            try:
                live = self._scan()
                for event in scan_events(known, live, lambda iid, _: records.gone.get(iid, "expired")):
                    yield event
                timer = expiry_timer((e.refreshed_at + e.ttl_s for e in known.values()), self.clock.time())
                if timer is not None and timer < 0:  # it expired while the caller held us: rescan now
                    continue
                await self._wait(wake, timer)
            finally:
                records.waiters.discard(wake)

    def _scan(self) -> dict[int, _Entry]:
        """The live records by instance id; expired ones are collected (and watchers told)."""
        now = self.clock.time()
        records = self._records
        expired = [i for i, e in records.entries.items() if now - e.refreshed_at > e.ttl_s]
        for instance_id in expired:
            records.remove(instance_id, "expired")
        if expired:
            records.changed()
        return dict(records.entries)

    async def _wait(self, wake: anyio.Event, timeout: float | None) -> None:
        """Return when ``wake`` is set or ``timeout`` seconds of the store's clock have passed."""
        if timeout is None:
            await wake.wait()
            return
        async with anyio.create_task_group() as tg:

            async def timer() -> None:
                await self.clock.sleep(timeout)
                tg.cancel_scope.cancel()

            tg.start_soon(timer)
            await wake.wait()
            tg.cancel_scope.cancel()
