"""``ResponseStore``: the responses a client may read back (``GET /v1/responses/{id}``) or continue
(``previous_response_id``), kept in memory and bounded.

Each entry is a response's JSON body and its ``conversation``: the input items that led to it
(those of the responses it continued included; ``instructions`` are not carried over, as OpenAI
does not carry them) followed by its output items, as a JSON array, so that the next turn reads
one entry whatever the length of the chain; and where the request's own input items stand in it.
The store holds at most ``max_count`` entries and ``max_bytes`` of them (the encoded sizes), each
for ``ttl_s`` seconds from when it was stored; the least recently used goes first when a bound is
reached, and an entry larger than ``max_bytes`` is not kept. Everything lives in one process: a
frontend that restarts forgets them, and frontends behind one load balancer do not share them.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import NamedTuple

log = logging.getLogger(__name__)

DEFAULT_MAX_COUNT = 1000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TTL_S = 3600.0


class StoredResponse(NamedTuple):
    body: bytes
    """The response object, as ``GET`` returns it."""
    conversation: bytes
    """The input and output items a ``previous_response_id`` continues (a JSON array)."""
    expires: float
    inputs: tuple[int, int] = (0, 0)
    """Where the request's own input items stand in ``conversation`` (start, end): what
    ``GET /v1/responses/{id}/input_items`` lists."""

    @property
    def size(self) -> int:
        return len(self.body) + len(self.conversation)


class ResponseStore:
    """Stored responses by id (see the module docstring); ``clock`` is monotonic seconds."""

    def __init__(
        self,
        max_count: int = DEFAULT_MAX_COUNT,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_count < 1 or max_bytes < 1 or ttl_s <= 0:
            raise ValueError("a response store needs max_count, max_bytes and ttl_s above 0")
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._by_expiry: deque[tuple[float, str]] = deque()
        """(expiry, id) of the entries put, in the order they were put, which is the order they
        expire in (one ``ttl_s`` for all); a pair whose entry was replaced or dropped since is
        skipped, and the queue is rebuilt when those outnumber the entries."""
        self.bytes = 0
        """The encoded size of every entry held."""

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self, response_id: str, body: bytes, conversation: bytes, inputs: tuple[int, int] = (0, 0)
    ) -> bool:
        """Keep a response (replacing one of the same id); False when it alone exceeds ``max_bytes``.
        ``inputs``: where the request's own input items stand in ``conversation``."""
        self.delete(response_id)
        entry = StoredResponse(body, conversation, self.clock() + self.ttl_s, inputs)
        if entry.size > self.max_bytes:
            log.warning(
                "response %s is not stored: its %d bytes exceed the store's %d (previous_response_id "
                "and GET will not find it)",
                response_id,
                entry.size,
                self.max_bytes,
            )
            return False
        self._expire()
        while self._entries and (
            len(self._entries) >= self.max_count or self.bytes + entry.size > self.max_bytes
        ):
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.size
        self._entries[response_id] = entry
        self._by_expiry.append((entry.expires, response_id))
        if len(self._by_expiry) > 2 * len(self._entries) + 16:
            self._by_expiry = deque(sorted((e.expires, rid) for rid, e in self._entries.items()))
        self.bytes += entry.size
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        """The live entry of ``response_id`` (now the most recently used), or None."""
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self.delete(response_id)
            return None
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        """Forget ``response_id``; False when it was not held."""
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.bytes -= entry.size
        return True

    def _expire(self) -> None:
        """Drop the expired entries, oldest put first; each put is looked at once, so a put costs
        the same however many entries the store holds."""
        now = self.clock()
        queue = self._by_expiry
        while queue and queue[0][0] <= now:
            expires, response_id = queue.popleft()
            entry = self._entries.get(response_id)
            if entry is not None and entry.expires == expires:
                self.delete(response_id)
