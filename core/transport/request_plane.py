"""The request plane: a worker's ROUTER socket and the DEALER client that talks to it.

Worker side, ``RequestServer``: binds a ROUTER; every received message is
``[identity, kind, payload]``; replies go back to the same identity. Client side,
``WorkerClient``: one DEALER per worker, one receiver task that hands each reply to the stream of
the request it names. A stream ends with ``Finish``; an ``ErrorReply`` for it raises
``RemoteError`` from the iterator. Leaving the iterator early sends ``CancelRequest``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator

import anyio
import msgspec
import zmq

from dyn.core.messages import (
    CancelRequest,
    ErrorReply,
    Finish,
    GenerateRequest,
    TokenChunk,
)
from dyn.core.transport.codec import ProtocolError, decode_reply, decode_request, encode
from dyn.core.transport.sockets import async_context, bind_random, configure

log = logging.getLogger(__name__)


class RemoteError(RuntimeError):
    """The worker answered a request with an ``ErrorReply``."""

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(f"{reply.code}: {reply.message}")
        self.code = reply.code
        self.reply = reply


class WorkerUnavailable(RuntimeError):
    """The connection to the worker was closed while a request was in flight."""


class RequestServer:
    """A worker's request-plane socket (ROUTER), bound on ``host`` at a free port."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._socket = configure(async_context().socket(zmq.ROUTER))
        self.endpoint = bind_random(self._socket, host)

    async def recv(self) -> tuple[bytes, msgspec.Struct | ProtocolError]:
        """Wait for the next message: ``(identity, message)``, or ``(identity, error)`` when the
        frames were malformed, so the caller can answer the peer."""
        frames = await self._socket.recv_multipart(copy=True)
        identity, body = frames[0], frames[1:]
        try:
            return identity, decode_request(body)
        except ProtocolError as exc:
            return identity, exc

    async def send(self, identity: bytes, message: msgspec.Struct) -> None:
        """Send one reply to the client with this identity (dropped if it went away)."""
        await self._socket.send_multipart([identity, *encode(message)])

    def close(self) -> None:
        self._socket.close(linger=0)


class _ReplyStream:
    """Replies of one in-flight request, buffered until its consumer reads them."""

    __slots__ = ("items", "ready", "done")

    def __init__(self) -> None:
        self.items: deque[TokenChunk | Finish | ErrorReply | BaseException] = deque()
        self.ready = anyio.Event()
        self.done = False

    def push(self, item) -> None:
        self.items.append(item)
        self.ready.set()


class WorkerClient:
    """Client of one worker's request plane. Use as ``async with WorkerClient(endpoint) as c``.

    ``generate`` may be called concurrently from many tasks; request ids must be unique among the
    requests in flight on this client.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._socket = configure(async_context().socket(zmq.DEALER))
        self._socket.connect(endpoint)
        self._streams: dict[str, _ReplyStream] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    async def __aenter__(self) -> "WorkerClient":
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._receive_loop)
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.fail_all(WorkerUnavailable(f"client for {self.endpoint} closed"))
        self._closed = True
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(*exc_info)
        self._socket.close(linger=0)

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def fail_all(self, error: BaseException) -> None:
        """End every in-flight stream with ``error`` (e.g. the worker left discovery)."""
        for stream in self._streams.values():
            stream.push(error)

    async def _receive_loop(self) -> None:
        while True:
            frames = await self._socket.recv_multipart(copy=True)
            try:
                reply = decode_reply(frames)
            except ProtocolError as exc:
                log.warning("dropping malformed reply from %s: %s", self.endpoint, exc)
                continue
            stream = self._streams.get(reply.request_id)
            if stream is not None:
                stream.push(reply)
            elif isinstance(reply, ErrorReply):
                log.warning("worker %s: %s: %s", self.endpoint, reply.code, reply.message)

    async def send(self, message: msgspec.Struct) -> None:
        await self._socket.send_multipart(encode(message))

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finish]:
        """Send ``request`` and yield its ``TokenChunk`` replies, then its ``Finish``.

        Raises ``RemoteError`` on an ``ErrorReply`` and ``WorkerUnavailable`` if the client is
        closed or failed meanwhile. Closing the iterator before ``Finish`` cancels the request.
        """
        if self._closed:
            raise WorkerUnavailable(f"client for {self.endpoint} is closed")
        rid = request.request_id
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in flight on this client")
        stream = self._streams[rid] = _ReplyStream()
        finished = False
        try:
            await self.send(request)
            while True:
                await stream.ready.wait()
                stream.ready = anyio.Event()
                while stream.items:
                    item = stream.items.popleft()
                    if isinstance(item, TokenChunk):
                        yield item
                    elif isinstance(item, Finish):
                        finished = True
                        yield item
                        return
                    elif isinstance(item, ErrorReply):
                        finished = True
                        raise RemoteError(item)
                    else:
                        finished = True
                        raise item
        finally:
            del self._streams[rid]
            if not finished and not self._closed:
                with anyio.CancelScope(shield=True):
                    await self.send(CancelRequest(rid))
