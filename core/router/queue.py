"""The router queue: requests held back while every eligible rank is busy with prefill.

A request is queued only if *every* eligible (worker, rank) has more than
``threshold * max_num_batched_tokens`` active prefill tokens (``all_busy``). The queue orders
waiting requests by a policy key, computed once at push time (higher leaves first):

- ``fcfs``: ``jump - arrival_offset`` (a priority jump works as "arrived that many seconds
  earlier"; best tail TTFT);
- ``lcfs``: ``jump + arrival_offset`` (for comparison experiments);
- ``wspt``: ``(1 + jump) / max(1, isl - max_cached_tokens)`` (Smith's rule; best mean TTFT),

where ``jump = max(priority_jump, 0)`` and ``arrival_offset`` is seconds since the queue was made.
Equal keys leave in push order. An entry may stand for several engine requests (the ``n``
choices of one client request, admitted as one unit): it is keyed by its first request and
counted ``requests`` times in ``pending_requests``. The queue does not decide busy-ness: the
router drains it.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

QUEUE_POLICIES = ("fcfs", "lcfs", "wspt")
DEFAULT_MAX_NUM_BATCHED_TOKENS = 10_000_000


def priority_jump(priority: float | None, latency_sensitivity: float | None) -> float:
    """The queue jump of a request: ``max(priority, 0)`` from ``nvext.agent_hints.priority``,
    else the deprecated ``latency_sensitivity``, else 0."""
    if priority is not None:
        return float(max(priority, 0))
    if latency_sensitivity is not None:
        return float(latency_sensitivity)
    return 0.0


def queue_key(
    policy: str,
    *,
    priority_jump: float,
    arrival_offset_secs: float,
    isl_tokens: int,
    max_cached_tokens: float,
) -> float:
    """The policy's priority for one request; higher is dequeued first."""
    jump = max(priority_jump, 0.0)
    if policy == "fcfs":
        return jump - arrival_offset_secs
    if policy == "lcfs":
        return jump + arrival_offset_secs
    if policy == "wspt":
        return (1.0 + jump) / max(1.0, isl_tokens - max_cached_tokens)
    raise ValueError(f"unknown queue policy {policy!r}; expected one of {', '.join(QUEUE_POLICIES)}")


def all_busy(
    active_tokens: Iterable[float], threshold: float, max_num_batched_tokens: Iterable[int | None]
) -> bool:
    """Whether every eligible rank is over ``threshold * max_num_batched_tokens`` active prefill
    tokens (the two iterables run in step; ``None`` capacity means the default 10,000,000).
    No eligible rank is "not busy": the request then fails to route instead of waiting."""
    seen = False
    for tokens, cap in zip(active_tokens, max_num_batched_tokens, strict=True):
        seen = True
        if tokens <= threshold * (DEFAULT_MAX_NUM_BATCHED_TOKENS if cap is None else cap):
            return False
    return seen


class QueueEntry:
    """A waiting request in a ``RouterQueue``; ``payload`` is whatever the router pushed."""

    __slots__ = (
        "_live",
        "_seq",
        "enqueued_at",
        "isl_tokens",
        "key",
        "max_cached_tokens",
        "payload",
        "priority_jump",
        "requests",
        "tokens",
    )

    def __init__(
        self,
        payload: Any,
        key: float,
        isl_tokens: int,
        priority_jump: float,
        max_cached_tokens: float,
        enqueued_at: float,
        seq: int,
        requests: int = 1,
        tokens: int | None = None,
    ) -> None:
        self.payload = payload
        self.key = key
        self.isl_tokens = isl_tokens
        self.requests = requests
        self.tokens = isl_tokens if tokens is None else tokens
        self.priority_jump = priority_jump
        self.max_cached_tokens = max_cached_tokens
        self.enqueued_at = enqueued_at
        self._seq = seq
        self._live = True

    def __lt__(self, other: QueueEntry) -> bool:
        if self.key != other.key:
            return self.key > other.key
        return self._seq < other._seq


class RouterQueue:
    """A max-heap of waiting requests under one policy, with lazy removal of cancelled waiters.

    ``peek``/``pop`` return payloads (``None`` when empty); ``push`` returns the entry that
    ``remove`` takes.
    """

    def __init__(self, policy: str = "fcfs", clock: Callable[[], float] = time.monotonic) -> None:
        if policy not in QUEUE_POLICIES:
            raise ValueError(f"unknown queue policy {policy!r}; expected one of {', '.join(QUEUE_POLICIES)}")
        self.policy = policy
        self._clock = clock
        self.started_at = clock()
        self._heap: list[QueueEntry] = []
        self._count = itertools.count()
        self._len = 0
        self._pending_requests = 0
        self._pending_isl = 0

    def push(
        self,
        payload: Any,
        *,
        priority_jump: float = 0.0,
        isl_tokens: int,
        max_cached_tokens: float = 0.0,
        requests: int = 1,
        tokens: int | None = None,
    ) -> QueueEntry:
        """Queue ``payload``, keyed by one request's ``isl_tokens`` and ``max_cached_tokens``;
        it stands for ``requests`` engine requests of ``tokens`` prompt tokens in all
        (default: one request of ``isl_tokens``)."""
        now = self._clock()
        key = queue_key(
            self.policy,
            priority_jump=priority_jump,
            arrival_offset_secs=now - self.started_at,
            isl_tokens=isl_tokens,
            max_cached_tokens=max_cached_tokens,
        )
        entry = QueueEntry(
            payload,
            key,
            isl_tokens,
            priority_jump,
            max_cached_tokens,
            now,
            next(self._count),
            requests,
            tokens,
        )
        heapq.heappush(self._heap, entry)
        self._len += 1
        self._pending_requests += entry.requests
        self._pending_isl += entry.tokens
        return entry

    def peek(self) -> Any:
        """The head's payload, or None."""
        entry = self._head()
        return None if entry is None else entry.payload

    def peek_entry(self) -> QueueEntry | None:
        return self._head()

    def pop(self) -> Any:
        """Remove the head and return its payload, or None when empty."""
        entry = self._head()
        if entry is None:
            return None
        heapq.heappop(self._heap)
        self._forget(entry)
        return entry.payload

    def remove(self, entry: QueueEntry) -> bool:
        """Drop a waiting entry (a cancelled waiter); False if it already left."""
        if not entry._live:
            return False
        self._forget(entry)
        if len(self._heap) > 2 * self._len + 64:  # mostly dead: compact
            self._heap = [e for e in self._heap if e._live]
            heapq.heapify(self._heap)
        else:
            self._head()
        return True

    def __len__(self) -> int:
        """Waiting entries (a group of requests counts once)."""
        return self._len

    @property
    def pending_requests(self) -> int:
        """Engine requests waiting (a group counts each of its requests)."""
        return self._pending_requests

    @property
    def pending_isl_tokens(self) -> int:
        """Prompt tokens of every waiting request."""
        return self._pending_isl

    def _head(self) -> QueueEntry | None:
        heap = self._heap
        while heap and not heap[0]._live:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _forget(self, entry: QueueEntry) -> None:
        entry._live = False
        self._len -= 1
        self._pending_requests -= entry.requests
        self._pending_isl -= entry.tokens
