"""``BoundedStore``: entries kept in memory by key, bounded in count, bytes and age.

An entry has its ``size`` (bytes) and ``expires`` (the store's clock, monotonic seconds); the
store holds at most ``max_count`` entries and ``max_bytes`` of them, each until ``expires``
(``ttl_s`` after it was kept). The least recently used goes first when a bound is reached, and an
entry larger than ``max_bytes`` is not kept. Everything lives in one process: a frontend that
restarts forgets them, and frontends behind one load balancer do not share them.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar


class Sized(Protocol):
    @property
    def size(self) -> int: ...

    @property
    def expires(self) -> float: ...


E = TypeVar("E", bound=Sized)

DEFAULT_MAX_COUNT = 1000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TTL_S = 3600.0
"""The frontend's defaults for its stores (``--responses-store-*``, ``--files-store-*``)."""


class BoundedStore(Generic[E]):
    """Entries by key (see the module docstring); ``clock`` is monotonic seconds."""

    def __init__(
        self,
        max_count: int = DEFAULT_MAX_COUNT,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_count < 1 or max_bytes < 1 or ttl_s <= 0:
            raise ValueError("a store needs max_count, max_bytes and ttl_s above 0")
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[str, E] = OrderedDict()
        self._by_expiry: deque[tuple[float, str]] = deque()
        """(expiry, key) of the entries kept, in the order they were kept, which is the order they
        expire in (one ``ttl_s`` for all); a pair whose entry was replaced or dropped since is
        skipped, and the queue is rebuilt when those outnumber the entries."""
        self.bytes = 0
        """The size of every entry held."""

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[E]:
        """The live entries, least recently used first."""
        self._expire()
        return iter(list(self._entries.values()))

    def keep(self, key: str, entry: E) -> bool:
        """Hold ``entry`` (replacing one of the same key); False when it alone exceeds
        ``max_bytes``."""
        self.delete(key)
        if entry.size > self.max_bytes:
            return False
        self._expire()
        while self._entries and (
            len(self._entries) >= self.max_count or self.bytes + entry.size > self.max_bytes
        ):
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.size
        self._entries[key] = entry
        self._by_expiry.append((entry.expires, key))
        if len(self._by_expiry) > 2 * len(self._entries) + 16:
            self._by_expiry = deque(sorted((e.expires, k) for k, e in self._entries.items()))
        self.bytes += entry.size
        return True

    def get(self, key: str) -> E | None:
        """The live entry of ``key`` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self.delete(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def delete(self, key: str) -> bool:
        """Forget ``key``; False when it was not held."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self.bytes -= entry.size
        return True

    def _expire(self) -> None:
        """Drop the expired entries, oldest kept first; each is looked at once, so keeping one
        costs the same however many the store holds."""
        now = self.clock()
        queue = self._by_expiry
        while queue and queue[0][0] <= now:
            expires, key = queue.popleft()
            entry = self._entries.get(key)
            if entry is not None and entry.expires == expires:
                self.delete(key)
