"""The few raw-ASGI helpers dyn's HTTP apps (frontend, router, indexer, workers) share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

JSON = (b"content-type", b"application/json")


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


async def respond(send: Any, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]]) -> None:
    """Send a whole response: ``headers``, its content-length, then ``body``."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


WRITE_BYTES = 1 << 20
"""A body given in parts is written about this much at a time (``respond_parts``)."""


async def respond_parts(
    send: Any, status: int, parts: Sequence[bytes], headers: Sequence[tuple[bytes, bytes]]
) -> None:
    """``respond`` with a body given in ``parts`` (joined, they are the body): one write when
    the body is under ``WRITE_BYTES``, else a write per ``WRITE_BYTES`` or so, each waiting for
    the transport to drain as the server's flow control says. Tens of megabytes are then never
    one copy that holds the event loop (joining 40 MB takes 25 ms here, writing it more)."""
    size = sum(map(len, parts))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(size).encode())],
        }
    )
    if size < WRITE_BYTES:
        await send({"type": "http.response.body", "body": b"".join(parts)})
        return
    group: list[bytes] = []
    held = 0
    for part in parts:
        group.append(part)
        held += len(part)
        if held >= WRITE_BYTES:
            await send({"type": "http.response.body", "body": b"".join(group), "more_body": True})
            group.clear()
            held = 0
    await send({"type": "http.response.body", "body": b"".join(group)})


async def lifespan(receive: Any, send: Any) -> None:
    """Acknowledge the server's startup and shutdown; these apps need no setup of their own."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def http_request(scope: dict[str, Any], receive: Any, send: Any) -> bool:
    """Whether ``scope`` is an HTTP request for the app to answer. A lifespan scope is served
    here (``lifespan``) and any other (a websocket) is left unanswered; both give False."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return False
    return scope["type"] == "http"


DISCONNECT_HOOK = "dyn.disconnect_hook"
"""The key of a request's ``DisconnectHook`` in its ASGI scope (servers run with
``json_error_protocol`` put one there)."""


class DisconnectHook:
    """Tells an app that its request's client went away (the connection was lost before the
    response completed), with no task of its own blocked in ``receive()`` to find out.

    ``watch(callback)``: ``callback()`` runs once, on the event loop, when the connection is lost,
    or at once if it already was; ``unwatch()`` drops it. ``lost``: whether it was."""

    __slots__ = ("_callback", "lost")

    def __init__(self) -> None:
        self._callback: Callable[[], None] | None = None
        self.lost = False

    def watch(self, callback: Callable[[], None]) -> None:
        if self.lost:
            callback()
        else:
            self._callback = callback

    def unwatch(self) -> None:
        self._callback = None

    def fire(self) -> None:
        """The connection was lost (called by the protocol)."""
        self.lost = True
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


class HeadWithBody:
    """A connection's transport that sends a response's status line and headers together with
    the response's first body write: one TCP write, one segment, one wakeup of the client where
    uvicorn makes two. A head that no write follows in the same event-loop turn (an interim
    ``100 Continue``, a response whose body comes later) goes out at the end of the turn, and
    before the connection closes. Everything else is the wrapped transport's."""

    __slots__ = ("_transport", "_head", "_loop")

    def __init__(self, transport: Any, loop: Any) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self._loop = loop

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif data.startswith(b"HTTP/1.1 "):  # uvicorn writes a response's head on its own
            self._head = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def json_error_protocol(error_body: Callable[[str], bytes]) -> type | str:
    """uvicorn's httptools protocol, but its own 400s (a request it cannot parse, before any app
    sees it: a control character in a header, a malformed request line) carry
    ``error_body(reason)`` as JSON instead of a line of plain text, a response's head goes
    out with its first body write (``HeadWithBody``), and each request's scope holds a
    ``DisconnectHook`` (``DISCONNECT_HOOK``) that fires when its connection is lost. Pass it as
    ``uvicorn.Config(http=...)``; uvicorn is imported only when this is called. A uvicorn laid out differently gets its own
    protocol back (``"httptools"``), plain-text 400s, separate head writes and no hook."""
    try:
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError:
        return "httptools"

    class JsonErrorProtocol(HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(cast(Any, HeadWithBody(transport, self.loop)))

        def on_headers_complete(self) -> None:
            self.scope[DISCONNECT_HOOK] = DisconnectHook()  # type: ignore[literal-required]
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            cycle = self.cycle
            hook = None if cycle is None or cycle.response_complete else cycle.scope.get(DISCONNECT_HOOK)
            super().connection_lost(exc)
            if isinstance(hook, DisconnectHook):
                hook.fire()

        def send_400_response(self, msg: str) -> None:
            body = error_body(msg)
            head = [STATUS_LINE[400]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode() + b"\r\n",
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

    return JsonErrorProtocol
