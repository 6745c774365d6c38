"""``ResponseStore``: the responses a client may read back (``GET /v1/responses/{id}``) or continue
(``previous_response_id``), kept in memory and bounded.

Each entry is a response's JSON body and its ``conversation``: the input items that led to it
(those of the responses it continued included; ``instructions`` are not carried over, as OpenAI
does not carry them) followed by its output items, as a JSON array, so that the next turn reads
one entry whatever the length of the chain; and where the request's own input items stand in it.
The store holds at most ``max_count`` entries and ``max_bytes`` of them (the encoded sizes), each
for ``ttl_s`` seconds from when it was stored; the least recently used goes first when a bound is
reached, and an entry larger than ``max_bytes`` is not kept (``BoundedStore``). Everything lives in
one process: a frontend that restarts forgets them, and frontends behind one load balancer do not
share them.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from dyn.core.frontend.bounded_store import BoundedStore

log = logging.getLogger(__name__)


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


class ResponseStore(BoundedStore[StoredResponse]):
    """Stored responses by id (see the module docstring); ``clock`` is monotonic seconds."""

    def put(
        self, response_id: str, body: bytes, conversation: bytes, inputs: tuple[int, int] = (0, 0)
    ) -> bool:
        """Keep a response (replacing one of the same id); False when it alone exceeds ``max_bytes``.
        ``inputs``: where the request's own input items stand in ``conversation``."""
        entry = StoredResponse(body, conversation, self.clock() + self.ttl_s, inputs)
        if self.keep(response_id, entry):
            return True
        log.warning(
            "response %s is not stored: its %d bytes exceed the store's %d (previous_response_id "
            "and GET will not find it)",
            response_id,
            entry.size,
            self.max_bytes,
        )
        return False
