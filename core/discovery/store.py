"""The discovery store interface: which worker instances are alive in a namespace.

A worker registers one ``WorkerRecord`` per instance with a time-to-live and keeps it alive
with heartbeats; a record that is not kept alive expires. Frontends and routers ``list`` the
live records or ``watch`` them come and go. The interface is the intersection of what a runtime
directory of files and etcd (leases plus prefix watches) can both do, so backends are
interchangeable; ``open_store`` picks one by name from the registry in ``backends.py`` (this
module knows no backend).
"""

from __future__ import annotations

import abc
import logging
import math
import re
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from types import TracebackType
from typing import Literal, Protocol, TypeVar

import anyio
import anyio.abc
import msgspec

from dyn.core.messages import WorkerRecord

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 10.0

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


class WorkerAdded(msgspec.Struct, frozen=True):
    """A worker instance is live. Seen again for an already added id: its record was replaced."""

    record: WorkerRecord


class WorkerRemoved(msgspec.Struct, frozen=True):
    """A worker instance is gone: its owner deleted the record, or it was not kept alive in time."""

    instance_id: int
    reason: Literal["deregistered", "expired"]


DiscoveryEvent = WorkerAdded | WorkerRemoved
RemovalReason = Literal["deregistered", "expired"]


class HeldRecord(Protocol):
    """What a watch remembers of a live instance: at least its record."""

    @property
    def record(self) -> WorkerRecord: ...


H = TypeVar("H", bound=HeldRecord)


def scan_events(
    known: dict[int, H], live: dict[int, H], why_gone: Callable[[int, H], RemovalReason]
) -> list[DiscoveryEvent]:
    """What a watch reports between two scans of its backend, ``known`` then updated to ``live``:
    the instances gone first (``why_gone(id, as last seen)``), then those new or with a replaced
    record, each in instance-id order."""
    events: list[DiscoveryEvent] = []
    for instance_id in sorted(known.keys() - live.keys()):
        events.append(
            WorkerRemoved(instance_id=instance_id, reason=why_gone(instance_id, known.pop(instance_id)))
        )
    for instance_id in sorted(live):
        current = live[instance_id]
        previous = known.get(instance_id)
        known[instance_id] = current
        if previous is None or previous.record != current.record:
            events.append(WorkerAdded(record=current.record))
    return events


class Clock(Protocol):
    """The time a store judges expiry by (item 7: tests inject a manual one instead of sleeping)."""

    def time(self) -> float:
        """Seconds since the epoch, comparable with file mtimes."""

    async def sleep(self, seconds: float) -> None:
        """Return once ``time()`` has advanced by ``seconds``; cancellable."""


class SystemClock:
    """The wall clock and anyio's sleep."""

    time = staticmethod(time.time)
    sleep = staticmethod(anyio.sleep)


SYSTEM_CLOCK: Clock = SystemClock()


class LeaseExpired(LookupError):
    """The record to keep alive is gone (deleted, or expired before its heartbeat); put it again."""


def validate_namespace(namespace: str) -> str:
    """Return ``namespace`` if it is a valid name, else raise ``ValueError`` saying what is allowed.

    Valid: 1 to 128 letters, digits, ``-``, ``_`` or ``.``, and not ``.`` or ``..``; such a name
    is safe as a path component and as an etcd key segment.
    """
    valid = isinstance(namespace, str) and _NAMESPACE_RE.fullmatch(namespace) is not None
    if not valid or namespace in (".", ".."):
        raise ValueError(
            f"invalid namespace {namespace!r}: use 1 to 128 letters, digits, '-', '_' or '.' "
            "(not '.' or '..')"
        )
    return namespace


def validate_ttl(ttl_s: float) -> float:
    """Return ``ttl_s`` if it is a positive finite number of seconds, else raise ``ValueError``."""
    if not (isinstance(ttl_s, int | float) and math.isfinite(ttl_s) and ttl_s > 0):
        raise ValueError(f"invalid ttl_s {ttl_s!r}: must be a positive number of seconds")
    return float(ttl_s)


EXPIRY_SLACK_S = 0.001
"""A watch's expiry timer fires this long after a record's ttl (a record is live at exactly its ttl)."""


def expiry_timer(deadlines: Iterable[float], now: float) -> float | None:
    """Seconds a watch waits before it rescans for expired records: until the earliest of
    ``deadlines`` (clock times a record expires at), plus ``EXPIRY_SLACK_S``; None when there are
    none; a negative number when one has already passed (rescan at once)."""
    next_expiry = min(deadlines, default=None)
    if next_expiry is None:
        return None
    timer = next_expiry - now
    return timer if timer < 0 else timer + EXPIRY_SLACK_S


class DiscoveryStore(abc.ABC):
    """Live worker records of one namespace; every method is safe to call from several processes.

    Records are keyed by ``instance_id``; ``put`` replaces a record with the same id. A record is
    live from its ``put`` until ``ttl_s`` seconds pass without a ``put`` or ``keepalive`` of it,
    or until it is deleted. Expiry is noticed by a watcher's timer (set for the next record to
    expire) or at the next ``list``.
    """

    namespace: str
    clock: Clock = SYSTEM_CLOCK
    """What expiry and the lease heartbeat are timed by."""

    def checked_ttl(self, record: WorkerRecord, ttl_s: float) -> float:
        """``put``'s checks: ``ttl_s`` as ``validate_ttl`` returns it; ``ValueError`` for a bad
        ``ttl_s`` or a ``record`` of another namespace than this store's."""
        ttl_s = validate_ttl(ttl_s)
        if record.namespace != self.namespace:
            raise ValueError(
                f"record of instance {record.instance_id} is for namespace {record.namespace!r}, "
                f"not this store's {self.namespace!r}"
            )
        return ttl_s

    @abc.abstractmethod
    async def put(self, record: WorkerRecord, ttl_s: float) -> None:
        """Register or replace ``record``, live for ``ttl_s`` seconds from now.

        Raises ``ValueError`` if ``record.namespace`` is not this store's namespace or ``ttl_s``
        is not positive.
        """

    @abc.abstractmethod
    async def keepalive(self, instance_id: int) -> None:
        """Extend the record's life by its ttl from now; ``LeaseExpired`` if it is not live."""

    @abc.abstractmethod
    async def delete(self, instance_id: int) -> None:
        """Deregister the record; deleting an absent record is not an error."""

    @abc.abstractmethod
    async def list(self) -> list[WorkerRecord]:
        """The live records, sorted by ``instance_id``. Unreadable records are skipped (logged)."""

    @abc.abstractmethod
    def watch(self) -> AsyncGenerator[DiscoveryEvent, None]:
        """Yield ``WorkerAdded`` for every live record, then the changes as they happen.

        After the initial events, yields ``WorkerAdded`` when a record appears or is replaced
        and ``WorkerRemoved`` when it is deleted (``"deregistered"``) or expires (``"expired"``).
        Runs until cancelled or closed; waiting for changes is a cancellable sleep. Use it as
        ``async with contextlib.aclosing(store.watch()) as events: async for event in events``.
        """

    def for_namespace(self, namespace: str) -> DiscoveryStore | None:
        """A store of the same backend over the same place (directory, cluster, hub) for
        ``namespace``, or ``None`` if the backend cannot make one; ``services.service_store``
        makes the stores of a namespace's routers and indexers with it."""
        return None

    async def aclose(self) -> None:  # noqa: B027 (a default, not a stub: backends may hold nothing)
        """Release connections the backend holds (none for the file backend)."""

    def lease(self, record: WorkerRecord, ttl_s: float = DEFAULT_TTL_S) -> Lease:
        """An async context manager that keeps ``record`` registered while it is open.

        On entry: ``put(record, ttl_s)`` (its errors propagate). While open: ``keepalive`` every
        ``ttl_s / 3`` seconds in a background task; a lost record (``LeaseExpired``) is put again,
        and other errors are logged and retried, never raised into the body. On exit, also by
        error or cancellation: the heartbeat stops, then the record is deleted; a delete that
        fails (the store is unreachable) is logged, not raised: the record expires within its ttl.
        """
        return Lease(self, record, validate_ttl(ttl_s))


class Lease:
    """A registration held open by ``DiscoveryStore.lease``; see there."""

    def __init__(self, store: DiscoveryStore, record: WorkerRecord, ttl_s: float) -> None:
        self.store = store
        self.record = record
        self.ttl_s = ttl_s
        self._task_group: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Lease:
        await self.store.put(self.record, self.ttl_s)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        task_group.start_soon(self._heartbeat)
        self._task_group = task_group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The body's exception is not passed to the task group, which would wrap it in an
        # ExceptionGroup; it propagates unchanged.
        assert self._task_group is not None
        try:
            self._task_group.cancel_scope.cancel()
            await self._task_group.__aexit__(None, None, None)
        finally:
            self._task_group = None
            with anyio.CancelScope(shield=True):
                try:
                    await self.store.delete(self.record.instance_id)
                except Exception as exc:
                    log.warning(
                        "could not deregister instance %d (%s); its record expires within %g s",
                        self.record.instance_id,
                        exc,
                        self.ttl_s,
                    )

    async def _heartbeat(self) -> None:
        instance_id = self.record.instance_id
        failing = False
        while True:
            await self.store.clock.sleep(self.ttl_s / 3)
            try:
                try:
                    await self.store.keepalive(instance_id)
                except LeaseExpired:
                    log.warning(
                        "discovery record of instance %d expired or vanished; registering it again",
                        instance_id,
                    )
                    await self.store.put(self.record, self.ttl_s)
            except Exception as exc:
                if not failing:
                    log.warning("discovery heartbeat of instance %d failed (retrying): %s", instance_id, exc)
                failing = True
            else:
                if failing:
                    log.info("discovery heartbeat of instance %d recovered", instance_id)
                failing = False
