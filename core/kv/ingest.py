"""KV event ingestion for a changing set of workers: one ``KvEventSubscriber`` per worker.

``KvEventIngestor`` keeps the indexers in step with the workers' engines. ``add_worker`` and
``remove_worker`` are synchronous, for membership listeners (``follow(membership)`` wires that up
for any ``dyn.core.kv.membership.Membership``, such as the router's ``WorkerPool``);
``run`` owns the subscriptions until cancelled. Removing a worker stops its subscription and
drops all its blocks from every tier's index. A worker whose ranks publish on sockets of their own
(``dyn indexer``'s ``--workers`` and ``/register``) has a subscription per rank
(``add_worker(record, dp_rank)``), and ``remove_rank`` drops one of them with that rank's blocks.

Nothing a worker publishes can claim more than its discovery record advertises
(``KvEventBounds``): before an op reaches the indexers, a ``stored`` op that would take a rank
past its capacity (plus a small slack, see there) and any op for a dp rank the record does not
have are refused, counted per worker (``dynamo_component_kv_events_rejected_by_worker``) and
logged at most once per few seconds per worker. The capacity check reads the device indexer's
own count (``blocks_held``), so it holds however the blocks got there. Lower tiers (host, disk,
external; ``add_lower_tiers``) are bounded the same way, by the fixed per-rank
``lower_tier_limit``, whatever the record says.

Event threads (``--router-event-threads N``, default 4):

- ``N == 1``: every subscription runs on the caller's event loop.
- ``N > 1``: each worker is pinned to one of N OS threads (``instance_id % N``), each running its
  own event loop. Receiving, msgpack decoding, sequence/gap handling and local-hash
  recomputation happen there; the converted ``IndexOp``s are handed to the caller's loop, which
  applies them in slices of at most 2 ms. The indexers thus keep a single writer, and the
  routing code reads them on the same loop without locks.

Python threads share the GIL: event threads move decode work off the routing loop, they do not
add parallel CPU. On a machine with few cores the GIL hand-offs can cost more than they save;
``N == 1`` also yields the loop after every batch, so both modes keep routing responsive.

Hand-offs of a removed worker that are still in flight are dropped, so its blocks stay removed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from dyn.core.kv.convert import (
    IndexOp,
    KvEventMetrics,
    KvIndexWriter,
    RejectedOp,
    RejectReason,
    StoreOp,
    TieredIndexers,
)
from dyn.core.kv.events import StorageTier
from dyn.core.kv.membership import Member, Membership
from dyn.core.kv.subscriber import (
    DEFAULT_REPLAY_TIMEOUT,
    KvEventBounds,
    KvEventSubscriber,
    SubscriptionKey,
    subscription_key,
)
from dyn.core.messages import WorkerRecord

log = logging.getLogger(__name__)

DEFAULT_EVENT_THREADS = 1
THREAD_JOIN_TIMEOUT = 5.0


class KvEventIngestor:
    """Subscribes to the KV events of every added worker and applies them to the indexers.

    ``block_size`` is the router's KV block size; None uses each worker's advertised one.
    """

    def __init__(
        self,
        indexer: KvIndexWriter,
        metrics: KvEventMetrics,
        *,
        lower_tiers: Mapping[StorageTier, KvIndexWriter] | None = None,
        block_size: int | None = None,
        event_threads: int = DEFAULT_EVENT_THREADS,
        replay_timeout: float = DEFAULT_REPLAY_TIMEOUT,
    ) -> None:
        if event_threads < 1:
            raise ValueError(f"--router-event-threads must be at least 1, got {event_threads}")
        if block_size is not None and block_size <= 0:
            raise ValueError(f"--kv-cache-block-size must be positive, got {block_size}")
        self.indexers = TieredIndexers(indexer, metrics)
        self._held: dict[StorageTier, Callable[[tuple[int, int]], int]] = {}
        held = getattr(indexer, "blocks_held", None)
        if held is not None:
            self._held[StorageTier.DEVICE] = held
        self.add_lower_tiers(lower_tiers or {})
        self.metrics = metrics
        self.block_size = block_size
        self.event_threads = event_threads
        self.replay_timeout = replay_timeout
        self._subscribers: dict[SubscriptionKey, KvEventSubscriber] = {}
        self._running = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._threads: list[_EventThread] = []
        self._inbox: _LoopInbox | None = None

    def add_lower_tiers(self, lower_tiers: Mapping[StorageTier, KvIndexWriter]) -> None:
        """Index these lower tiers' events from now on, each rank bounded to its record's
        ``lower_tier_limit`` blocks per tier."""
        self.indexers.add_lower_tiers(lower_tiers)
        for tier, writer in lower_tiers.items():
            held = getattr(writer, "blocks_held", None)
            if tier is not StorageTier.DEVICE and held is not None:
                self._held[tier] = held

    # ----------------------------------------------------------------- membership (sync)

    def follow(self, membership: Membership) -> None:
        """Add and remove workers as ``membership`` reports them (current ones are added at once)."""
        membership.add_listener(self._on_membership_change)

    def _on_membership_change(self, member: Member, joined: bool) -> None:
        if joined:
            self.add_worker(member.record)
        else:
            self.remove_worker(member.record.instance_id)

    def add_worker(self, record: WorkerRecord, dp_rank: int | None = None) -> None:
        """Start following ``record``'s KV events (a worker without a KV-event endpoint is
        skipped). A record with new endpoints for a known instance restarts it from scratch.
        ``dp_rank``: the socket publishes that one rank of the instance (its events default to
        it), and other ranks of the instance may have sockets of their own."""
        key = subscription_key(record.instance_id, dp_rank)
        current = self._subscribers.get(key)
        if record.endpoints.kv_events is None:
            log.info(
                "worker %d publishes no KV events; the router will not see its cache", record.instance_id
            )
            if current is not None:
                self._drop(key)
            return
        if current is not None:
            if (current.record.endpoints.kv_events, current.record.endpoints.kv_replay) == (
                record.endpoints.kv_events,
                record.endpoints.kv_replay,
            ):
                return
            self._drop(key)
        if self.event_threads == 1:

            def deliver(ops: list[IndexOp]) -> None:
                self._apply(subscriber, ops)
        else:

            def deliver(ops: list[IndexOp]) -> None:
                self._hand_over(subscriber, ops)

        subscriber = KvEventSubscriber(
            record,
            deliver,
            self.metrics,
            block_size=self.block_size,
            dp_rank=dp_rank,
            replay_timeout=self.replay_timeout,
        )
        self._subscribers[key] = subscriber
        if self._running:
            self._start(subscriber)

    def remove_worker(self, instance_id: int) -> None:
        """Stop following the worker (each of its ranks' sockets) and drop all of its blocks."""
        for key in self._keys_of(instance_id):
            self._unsubscribe(key)
        self.indexers.remove_worker(instance_id)
        self.metrics.forget_worker(instance_id)

    def remove_rank(self, instance_id: int, dp_rank: int) -> None:
        """Stop following the socket added for ``dp_rank`` of the instance and drop that rank's
        blocks (the instance's other ranks stay)."""
        self._unsubscribe((instance_id, dp_rank))
        self.indexers.remove_rank((instance_id, dp_rank))
        if not self._keys_of(instance_id):
            self.metrics.forget_worker(instance_id)

    def _keys_of(self, instance_id: int) -> list[SubscriptionKey]:
        return [k for k in self._subscribers if (k[0] if isinstance(k, tuple) else k) == instance_id]

    def _drop(self, key: SubscriptionKey) -> None:
        if isinstance(key, tuple):
            self.remove_rank(*key)
        else:
            self.remove_worker(key)

    def _unsubscribe(self, key: SubscriptionKey) -> None:
        subscriber = self._subscribers.pop(key, None)
        if subscriber is not None and self._running:
            self._stop(subscriber)

    def subscriber(self, instance_id: int) -> KvEventSubscriber | None:
        return self._subscribers.get(instance_id)

    # ----------------------------------------------------------------- running

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow every added worker until cancelled; ``started()`` once subscriptions run."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                if self.event_threads > 1:
                    self._inbox = _LoopInbox(asyncio.get_running_loop(), self._apply)
                    await self._start_threads()
                self._running = True
                for subscriber in self._subscribers.values():
                    self._start(subscriber)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._running = False
            self._tg = None
            if self._inbox is not None:
                self._inbox.close()
            with anyio.CancelScope(shield=True):
                await self._stop_threads()
            self._inbox = None

    def _start(self, subscriber: KvEventSubscriber) -> None:
        if self._threads:
            self._thread_of(subscriber).spawn(subscriber)
        else:
            assert self._tg is not None
            self._tg.start_soon(subscriber.run)

    def _stop(self, subscriber: KvEventSubscriber) -> None:
        if self._threads:
            self._thread_of(subscriber).call(subscriber.cancel)
        else:
            subscriber.cancel()

    def _thread_of(self, subscriber: KvEventSubscriber) -> _EventThread:
        return self._threads[subscriber.instance_id % len(self._threads)]

    def _apply(self, subscriber: KvEventSubscriber, ops: list[IndexOp]) -> None:
        """Apply on the router's loop, unless the subscriber was removed meanwhile; ops beyond
        the worker's bounds are refused (one at a time, so each sees the count before it)."""
        if not (self._running and self._subscribers.get(subscriber.key) is subscriber):
            return
        bounds = subscriber.bounds
        try:
            if bounds.dp_size is None and self._held.keys() <= {StorageTier.DEVICE}:  # nothing to check
                self.indexers.apply(ops)
                return
            for op in ops:
                refused = self._refusal(bounds, op)
                if refused is None:
                    self.indexers.apply((op,))
                else:
                    subscriber.reject(refused[0], refused[1])
        except Exception:
            log.exception("applying KV events of worker %d failed", subscriber.instance_id)

    def _refusal(self, bounds: KvEventBounds, op: IndexOp) -> tuple[RejectReason, str] | None:
        """Why ``op`` is beyond what the worker's record allows, or None."""
        if isinstance(op, RejectedOp):
            return None
        rank = op.worker[1]
        if bounds.dp_size is not None and not 0 <= rank < bounds.dp_size:
            return (
                RejectReason.UNKNOWN_DP_RANK,
                f"an event for dp rank {rank}, but its record has {bounds.dp_size} rank(s)",
            )
        if not isinstance(op, StoreOp):
            return None
        held_of = self._held.get(op.tier)
        if op.tier is StorageTier.DEVICE:
            limit, what = bounds.block_limit, "its record allows (total_kv_blocks plus slack)"
        else:
            limit, what = bounds.lower_tier_limit, f"a rank may hold in the {op.tier} tier"
        if limit is None or held_of is None:
            return None
        held = held_of(op.worker)
        after = held + len(op.block_hashes)
        if after <= limit:
            return None
        why = (
            f"storing {len(op.block_hashes)} blocks would take rank {rank} from {held} to "
            f"{after}, past the {limit} {what}"
        )
        return RejectReason.OVER_CAPACITY, why

    def _hand_over(self, subscriber: KvEventSubscriber, ops: list[IndexOp]) -> None:
        """Called on an event thread: queue the ops for the router's loop."""
        if self._inbox is not None:
            self._inbox.put(subscriber, ops)

    async def _start_threads(self) -> None:
        self._threads = [_EventThread(f"kv-events-{i}") for i in range(self.event_threads)]
        for thread in self._threads:
            thread.start()
        for thread in self._threads:
            if not await anyio.to_thread.run_sync(thread.ready.wait, THREAD_JOIN_TIMEOUT):
                raise RuntimeError(f"KV event thread {thread.name} did not start")

    async def _stop_threads(self) -> None:
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.stop()
        for thread in threads:
            await anyio.to_thread.run_sync(thread.join, THREAD_JOIN_TIMEOUT)
            if thread.is_alive():
                log.warning("KV event thread %s did not stop within %g s", thread.name, THREAD_JOIN_TIMEOUT)


class _LoopInbox:
    """Converted batches from event threads, applied on the router's loop in bounded slices.

    ``put`` (any thread) appends and schedules one drain on the loop if none is pending; a drain
    applies batches for at most ``SLICE_SECONDS``, then yields the loop to other tasks. FIFO overall, so each
    worker's batches keep their order. Above ``HIGH_WATER`` queued batches a putting thread
    waits (backpressure on that thread's sockets) until the loop catches up or the inbox closes.
    """

    SLICE_SECONDS = 0.002
    HIGH_WATER = 4096

    def __init__(
        self, loop: asyncio.AbstractEventLoop, apply: Callable[[KvEventSubscriber, list[IndexOp]], None]
    ) -> None:
        self._loop = loop
        self._apply = apply
        self._queue: deque[tuple[KvEventSubscriber, list[IndexOp]]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self._closed = False

    def put(self, subscriber: KvEventSubscriber, ops: list[IndexOp]) -> None:
        while len(self._queue) >= self.HIGH_WATER and not self._closed:
            time.sleep(0.001)
        if self._closed:
            return
        self._queue.append((subscriber, ops))
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the router's loop is closed: we are shutting down
            self._closed = True

    def _drain(self) -> None:
        deadline = time.perf_counter() + self.SLICE_SECONDS
        while self._queue and time.perf_counter() < deadline:
            subscriber, ops = self._queue.popleft()
            self._apply(subscriber, ops)
        with self._lock:
            if self._queue and not self._closed:
                self._loop.call_soon(self._drain)
            else:
                self._scheduled = False

    def close(self) -> None:
        """Drop what is queued and refuse more (the loop side; releases waiting threads)."""
        self._closed = True
        self._queue.clear()


class _EventThread:
    """An OS thread running its own event loop, on which subscribers are spawned and cancelled.

    Every method is called from another thread and returns at once (``call_soon_threadsafe``).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._tg: anyio.abc.TaskGroup | None = None
        self._stopping: anyio.Event | None = None

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        try:
            anyio.run(self._serve, backend="asyncio")
        except Exception:
            log.exception("KV event thread %s failed", self.name)
        finally:
            self.ready.set()  # never leave a starter waiting

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = anyio.Event()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self.ready.set()
            await self._stopping.wait()
            tg.cancel_scope.cancel()

    def call(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # its loop already ended
            pass

    def spawn(self, subscriber: KvEventSubscriber) -> None:
        self.call(self._spawn, subscriber)

    def _spawn(self, subscriber: KvEventSubscriber) -> None:
        if self._tg is not None:
            self._tg.start_soon(subscriber.run)

    def stop(self) -> None:
        if self._stopping is not None:
            self.call(self._stopping.set)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()
