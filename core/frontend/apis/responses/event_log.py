"""``EventLog``: the events of a streamed background response (``background`` and ``stream`` both
true), kept so that any number of readers can follow them from any point, as OpenAI's and
vLLM's ``GET /v1/responses/{id}?stream=true&starting_after=N`` does.

Entry ``i`` is the event whose ``sequence_number`` is ``i`` (the Responses wire numbers every
event it writes from 0), with the annotation events (nvext's, which carry no number) written
just before it. The log's owner bounds its bytes (``BackgroundResponses``): past its budget it
drops a log's oldest entries (``trim``), and a reader that asks for one of those is refused
(``first`` says where the log starts now).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

_END = b"\n\n"
_DATA = b"\ndata: "


class EventLog:
    """The events of one response, appended as its generation writes them (see the module
    docstring); ``on_grow(log, n)`` is told of every ``n`` bytes appended."""

    def __init__(self, on_grow: Callable[[EventLog, int], None] | None = None) -> None:
        self.first = 0
        """The sequence number of the oldest entry kept."""
        self.entries: list[bytes] = []
        self.bytes = 0
        self.done = False
        self.readers = 0
        """The ``follow`` calls reading now."""
        self._on_grow = on_grow
        self._pending = b""
        """Annotation events waiting for the next numbered event."""
        self._wake = asyncio.Event()

    @property
    def end(self) -> int:
        """The sequence number the next entry will have."""
        return self.first + len(self.entries)

    async def emit(self, data: bytes) -> None:
        """``Generation.stream``'s emitter: append the events in ``data`` (whole SSE events)."""
        self.write(data)

    def write(self, data: bytes) -> None:
        """Append the SSE events in ``data`` and wake the readers."""
        if not data or self.done:
            return
        added = 0
        for event in data.split(_END)[:-1]:
            event += _END
            if _DATA not in event:
                self._pending += event
                continue
            entry = self._pending + event if self._pending else event
            self._pending = b""
            self.entries.append(entry)
            added += len(entry)
        if added:
            self.bytes += added
            self._wake_readers()
            if self._on_grow is not None:
                self._on_grow(self, added)

    def close(self) -> None:
        """No more events: readers end once they have read every entry."""
        if self._pending and self.entries:
            self.entries[-1] += self._pending
        self._pending = b""
        self.done = True
        self._wake_readers()

    def trim(self, to_bytes: int) -> int:
        """Drop the oldest entries until the log holds at most ``to_bytes`` (the last entry is
        kept while the log is open, so readers at its end lose nothing); the bytes dropped."""
        keep = 1 if not self.done else 0
        dropped = n = 0
        while len(self.entries) - n > keep and self.bytes - dropped > to_bytes:
            dropped += len(self.entries[n])
            n += 1
        if n:
            del self.entries[:n]
            self.first += n
            self.bytes -= dropped
        return dropped

    async def follow(self, after: int) -> AsyncIterator[bytes]:
        """The entries after sequence number ``after`` (-1: all), as they come, until the log
        closes; each chunk is every entry there was to read. A reader that asks for, or falls
        behind to, entries no longer kept (``trim``) ends there: check ``first`` before."""
        nxt = after + 1
        self.readers += 1
        try:
            while True:
                if nxt < self.first:
                    return
                end = self.end
                if nxt < end:
                    chunk = b"".join(self.entries[nxt - self.first :])
                    nxt = end
                    yield chunk
                    continue
                if self.done:
                    return
                wake = self._wake
                await wake.wait()
        finally:
            self.readers -= 1

    def _wake_readers(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()
