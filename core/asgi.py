"""The few raw-ASGI helpers dyn's HTTP apps (frontend, indexer) share."""

from __future__ import annotations

from typing import Any


class Disconnected(Exception):
    """The client went away before the request body was read."""


class BodyTooLarge(Exception):
    """The request body exceeds the app's limit (``limit`` bytes)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over {limit} bytes")
        self.limit = limit


async def read_body(receive: Any, limit: int) -> bytes:
    """The whole request body; ``Disconnected`` if the client leaves, ``BodyTooLarge`` past
    ``limit`` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def lifespan(receive: Any, send: Any) -> None:
    """Acknowledge the server's startup and shutdown; these apps need no setup of their own."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
