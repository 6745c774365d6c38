"""Waiting queues of the simulated scheduler; one is picked at construction, so FCFS pays nothing
for priorities.

Both offer ``push`` (a new arrival), ``push_preempted``, ``peek``, ``pop``, ``remove``, ``len`` and
iteration in admission order; ``items`` is the container itself (read only: truthy while a
request waits, which a scheduler checks every pass without a method call).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any


class FifoQueue:
    """Arrival order; preempted requests go in front."""

    __slots__ = ("_q", "items")

    def __init__(self) -> None:
        self._q: deque[Any] = deque()
        self.items = self._q

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._q)

    def push(self, req: Any) -> None:
        self._q.append(req)

    def push_preempted(self, req: Any) -> None:
        self._q.appendleft(req)

    def peek(self) -> Any | None:
        """The next request to admit, or None."""
        return self._q[0] if self._q else None

    def pop(self) -> Any:
        """Remove the request ``peek`` returned."""
        return self._q.popleft()

    def remove(self, req: Any) -> None:
        self._q.remove(req)


class PriorityQueue:
    """Ordered by ``(key(req.priority), req.arrival)``, smallest first. A preempted request keeps
    its key and arrival, so it goes back in front of later arrivals of equal priority (vLLM's
    ``PriorityRequestQueue``)."""

    __slots__ = ("_heap", "_key", "items")

    def __init__(self, key: Callable[[int | None], float]) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._key = key
        self.items = self._heap

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Any]:
        return (item[2] for item in sorted(self._heap, key=lambda item: item[:2]))

    def push(self, req: Any) -> None:
        heapq.heappush(self._heap, (self._key(req.priority), req.arrival, req))

    push_preempted = push

    def peek(self) -> Any | None:
        return self._heap[0][2] if self._heap else None

    def pop(self) -> Any:
        return heapq.heappop(self._heap)[2]

    def remove(self, req: Any) -> None:
        heap = self._heap
        for i, item in enumerate(heap):
            if item[2] is req:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                return
        raise ValueError("request not in the waiting queue")
