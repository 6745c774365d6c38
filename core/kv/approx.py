"""``TtlIndexer``: an approximate prefix index built from the router's own decisions (reference 2.3, 2.4).

Without KV events (``--no-router-kv-events``), and for the predicted-route side index
(``--router-predicted-ttl-secs``), the router records each decision as if the chosen (worker,
dp_rank) had stored the whole prompt: a store from the root whose block hashes are the router's
sequence hashes. Each (worker, block) entry expires ``ttl_s`` after it was last recorded;
recording it again refreshes it.

Because a record always covers a whole prefix, an entry never expires later than its ancestors,
and expiry removes deepest first on ties, so every worker's set stays prefix-closed and the
underlying ``RadixIndexer`` answers on its fast path. Expiry is lazy: ``find_matches`` and
``record`` first drop whatever has expired, and ``next_expiry`` tells a timer when to call
``expire``. Timers live in one dict per worker plus a heap with one entry per record (not per
block); a heap entry whose blocks were all refreshed later is skipped when it comes up, and the
heap is rebuilt from the live timers when it holds far more block references than there are
live entries.

``max_merge`` combines the primary index's scores with the side index's: per worker, the larger.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence

from dyn.core.kv.indexer import (
    ApplyStatus,
    DumpedBlock,
    OverlapScores,
    WorkerKey,
    radix_indexer,
)

_REBUILD_FACTOR = 4
_REBUILD_FLOOR = 1 << 16

_Timer = tuple[float, int, WorkerKey, tuple[int, ...], tuple[int, ...] | None]
"""A heap entry: (expiry, tie-break, worker, sequence hashes by depth, their depths or None for 1, 2, ...)."""


class TtlIndexer:
    """Approximate index built from routing decisions, each block expiring ttl_s after it was last recorded."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not ttl_s > 0:
            raise ValueError(f"the TTL must be a positive number of seconds, got {ttl_s}")
        self.ttl_s = float(ttl_s)
        self.clock = clock
        self.tree = radix_indexer()
        self._expiry: dict[WorkerKey, dict[int, float]] = {}  # worker -> seq hash -> expiry
        self._heap: list[_Timer] = []
        self._heap_refs = 0  # block references held by heap entries
        self._live = 0  # entries in _expiry
        self._order = itertools.count()

    def record(self, worker: WorkerKey, local_hashes: Sequence[int], seq_hashes: Sequence[int]) -> None:
        """The request with these prompt hashes was routed to ``worker``: it now (probably) caches
        every block of the prompt, until ``ttl_s`` from now."""
        if len(local_hashes) != len(seq_hashes):
            raise ValueError(
                f"record needs one sequence hash per local hash, got "
                f"{len(seq_hashes)} for {len(local_hashes)}"
            )
        if not local_hashes:
            return
        now = self.clock()
        self.expire(now)
        seqs = tuple(seq_hashes)
        if self.tree._store(worker, None, seqs, local_hashes, seqs) is not ApplyStatus.OK:
            return  # a sequence hash repeated inside one prompt: a hash collision, not indexable
        expires = now + self.ttl_s
        timers = self._expiry.setdefault(worker, {})
        before = len(timers)
        timers.update(dict.fromkeys(seqs, expires))
        self._live += len(timers) - before
        heapq.heappush(self._heap, (expires, next(self._order), worker, seqs, None))
        self._heap_refs += len(seqs)
        if self._heap_refs > _REBUILD_FLOOR and self._heap_refs > _REBUILD_FACTOR * self._live:
            self._rebuild_heap()

    def expire(self, now: float | None = None) -> int:
        """Remove every entry whose expiry is at or before ``now`` (default: the clock); returns
        how many (worker, block) entries were removed."""
        if now is None:
            now = self.clock()
        heap = self._heap
        if not heap or heap[0][0] > now:
            return 0
        due: dict[WorkerKey, list[tuple[int, int]]] = {}  # worker -> (depth, sequence hash)
        while heap and heap[0][0] <= now:
            expires, _, worker, seqs, depths = heapq.heappop(heap)
            self._heap_refs -= len(seqs)
            timers = self._expiry.get(worker)
            if timers is None:
                continue
            pairs = zip(depths, seqs) if depths is not None else enumerate(seqs, 1)
            expired = [(depth, seq) for depth, seq in pairs if timers.get(seq) == expires]
            if expired:
                for _, seq in expired:
                    del timers[seq]
                due.setdefault(worker, []).extend(expired)
        removed = 0
        for worker, entries in due.items():
            self._live -= len(entries)
            entries.sort(reverse=True)  # deepest first
            removed += self.tree._remove_counting(worker, [seq for _, seq in entries])
        return removed

    def next_expiry(self) -> float | None:
        """When the earliest live entry expires, or ``None`` when nothing is indexed."""
        heap = self._heap
        while heap:
            expires, _, worker, seqs, _ = heap[0]
            timers = self._expiry.get(worker)
            if timers is not None and any(timers.get(seq) == expires for seq in reversed(seqs)):
                return expires
            heapq.heappop(heap)
            self._heap_refs -= len(seqs)
        return None

    def find_matches(
        self, local_hashes: Sequence[int], seq_hashes: Sequence[int] | None = None
    ) -> OverlapScores:
        """``RadixIndexer.find_matches`` after dropping what has expired."""
        self.expire()
        return self.tree.find_matches(local_hashes, seq_hashes)

    def remove_worker(self, instance_id: int) -> None:
        """Forget every dp rank of ``instance_id``."""
        for worker in [worker for worker in self._expiry if worker[0] == instance_id]:
            self._live -= len(self._expiry.pop(worker))
        self.tree.remove_worker(instance_id)

    def dump(self) -> list[DumpedBlock]:
        return self.tree.dump()

    @property
    def size(self) -> int:
        return self.tree.size

    def blocks_per_worker(self) -> dict[WorkerKey, int]:
        return self.tree.blocks_per_worker()

    def workers(self) -> list[WorkerKey]:
        return self.tree.workers()

    def depth_histogram(self) -> dict[int, int]:
        return self.tree.depth_histogram()

    def _rebuild_heap(self) -> None:
        """One heap entry per (worker, expiry) over the live timers, blocks ordered by depth."""
        groups: dict[tuple[float, WorkerKey], list[int]] = {}
        for worker, timers in self._expiry.items():
            for seq, expires in timers.items():
                groups.setdefault((expires, worker), []).append(seq)
        heap: list[_Timer] = []
        for (expires, worker), seqs in groups.items():
            by_depth = sorted((self.tree._depth(seq), seq) for seq in seqs)
            heap.append(
                (
                    expires,
                    next(self._order),
                    worker,
                    tuple(seq for _, seq in by_depth),
                    tuple(depth for depth, _ in by_depth),
                )
            )
        heapq.heapify(heap)
        self._heap = heap
        self._heap_refs = self._live


def max_merge(primary: OverlapScores, side: OverlapScores) -> OverlapScores:
    """Per worker, the larger of the two scores; returns ``primary`` itself when ``side`` is empty."""
    if not side:
        return primary
    merged = dict(primary)
    for worker, score in side.items():
        if score > merged.get(worker, 0):
            merged[worker] = score
    return merged
