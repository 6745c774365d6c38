"""The request plane: a worker's ROUTER socket and the DEALER client that talks to it.

Worker side, ``RequestServer``: binds a ROUTER; every received message is
``[identity, kind, payload]``; replies go back to the same identity, one per message (``send``)
or packed into ``ReplyBatch`` messages (``send_replies``). Client side, ``WorkerClient``: one
DEALER per worker, one receiver task that unpacks batches and hands each reply to the stream of
the request it names. A stream ends with ``Finish``; an ``ErrorReply`` for it raises
``RemoteError`` from the iterator. Leaving the iterator early sends ``CancelRequest``.
``generate_batches`` yields, per wakeup, everything that arrived for the request meanwhile, so a
consumer can handle a forward pass's worth of tokens at once; ``generate`` yields one reply at a
time. ``call`` sends a control call and waits for its single ``ControlReply``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import msgspec
import zmq

from dyn.core.messages import (
    CancelRequest,
    ControlReply,
    ErrorReply,
    Finish,
    GenerateRequest,
    ReplyBatch,
    TokenChunk,
)
from dyn.core.transport.codec import ProtocolError, decode_reply, decode_request, encode, encode_replies
from dyn.core.transport.sockets import async_context, bind_random, configure

log = logging.getLogger(__name__)

_DRAIN_BATCH = 256


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

    def send_replies(self, identity: bytes, replies: list[TokenChunk | Finish | ErrorReply]) -> int:
        """Send ``replies`` (in order) to the client with this identity as few messages as
        ``encode_replies`` packs them into, without waiting; returns how many messages that was.

        Never waits: the send high-water mark is unbounded, so each send completes at once (were
        one to find the socket busy, pyzmq would queue it behind, in order), and a ROUTER drops
        messages to a client that went away. The asyncio socket is used, not a blocking shadow:
        a send on the shadow could consume the edge-triggered wakeup a pending ``recv`` waits for.
        """
        send = self._socket.send_multipart
        messages = encode_replies(replies)
        for frames in messages:
            sent = send([identity, *frames])
            if sent.done():
                sent.result()  # raise a send error here
            else:
                sent.add_done_callback(_log_send_error)
        return len(messages)

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket; ``linger_ms`` > 0 lets replies already queued still go out."""
        self._socket.close(linger=linger_ms)


def _log_send_error(sent) -> None:
    if not sent.cancelled() and sent.exception() is not None:
        log.warning("a queued reply could not be sent: %s", sent.exception())


class _ReplyStream:
    """Replies of one in-flight request, buffered until its consumer reads them."""

    __slots__ = ("items", "ready")

    def __init__(self) -> None:
        self.items: list[TokenChunk | Finish | ErrorReply | ControlReply | BaseException] = []
        self.ready = anyio.Event()

    def push(self, item) -> None:
        items = self.items
        items.append(item)
        if len(items) == 1:  # the consumer took everything before: wake it
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
        self.messages_received = 0
        """Reply messages received (a ``ReplyBatch`` counts once), for measurements."""

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
        # One awaited receive, then a bounded non-blocking drain of whatever else is queued: under
        # load many replies arrive together, and each awaited receive costs a future and a wakeup.
        drain = zmq.Socket.shadow(self._socket.underlying)
        while True:
            self._deliver(await self._socket.recv_multipart(copy=True))
            for _ in range(_DRAIN_BATCH):
                try:
                    frames = drain.recv_multipart(zmq.NOBLOCK, copy=True)
                except zmq.Again:
                    break
                self._deliver(frames)

    def _deliver(self, frames: list[bytes]) -> None:
        self.messages_received += 1
        try:
            reply = decode_reply(frames)
        except ProtocolError as exc:
            log.warning("dropping malformed reply from %s: %s", self.endpoint, exc)
            return
        if type(reply) is not ReplyBatch:
            self._route(reply)
            return
        streams = self._streams
        for chunk in reply.chunks:
            stream = streams.get(chunk.request_id)
            if stream is not None:
                stream.push(chunk)
        for finish in reply.finishes:
            stream = streams.get(finish.request_id)
            if stream is not None:
                stream.push(finish)
        for error in reply.errors:
            self._route(error)

    def _route(self, reply: TokenChunk | Finish | ErrorReply | ControlReply) -> None:
        stream = self._streams.get(reply.request_id)
        if stream is not None:
            stream.push(reply)
        elif isinstance(reply, ErrorReply):
            log.warning("worker %s: %s: %s", self.endpoint, reply.code, reply.message)

    async def send(self, message: msgspec.Struct) -> None:
        await self._socket.send_multipart(encode(message))

    async def call(self, message: msgspec.Struct, timeout_s: float = 10.0) -> ControlReply:
        """Send a control call (a struct with a ``request_id`` unique on this client) and return
        its ``ControlReply``. Raises ``RemoteError`` on an ``ErrorReply``, ``WorkerUnavailable``
        when the client closes meanwhile, ``TimeoutError`` after ``timeout_s``."""
        if self._closed:
            raise WorkerUnavailable(f"client for {self.endpoint} is closed")
        rid = message.request_id  # type: ignore[attr-defined]
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in flight on this client")
        stream = self._streams[rid] = _ReplyStream()
        try:
            await self.send(message)
            with anyio.fail_after(timeout_s):
                while not stream.items:
                    await stream.ready.wait()
                    stream.ready = anyio.Event()
        finally:
            del self._streams[rid]
        reply = stream.items[0]
        if isinstance(reply, ControlReply):
            return reply
        if isinstance(reply, ErrorReply):
            raise RemoteError(reply)
        if isinstance(reply, BaseException):
            raise reply
        raise RemoteError(ErrorReply(rid, "bad_reply", f"a control call got a {type(reply).__name__}"))

    async def generate_batches(self, request: GenerateRequest) -> AsyncIterator[list[TokenChunk | Finish]]:
        """Send ``request`` and yield, per wakeup, the non-empty list of its replies that arrived
        since the last yield: ``TokenChunk``s in order, the last list ending with the ``Finish``.

        Raises ``RemoteError`` on an ``ErrorReply`` and ``WorkerUnavailable`` if the client is
        closed or failed meanwhile, after yielding the chunks that came before. Closing the
        iterator before ``Finish`` cancels the request.
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
                items = stream.items
                if not items:
                    continue
                stream.items = []
                end = len(items)
                for i, item in enumerate(items):
                    if type(item) is not TokenChunk:
                        end = i
                        break
                if end == len(items):
                    yield items
                    continue
                finished = True  # a terminal arrived: nothing left to cancel
                terminal = items[end]
                if isinstance(terminal, Finish):
                    yield items[:end + 1] if end + 1 < len(items) else items
                    return
                if end:
                    yield items[:end]
                if isinstance(terminal, ErrorReply):
                    raise RemoteError(terminal)
                raise terminal
        finally:
            del self._streams[rid]
            if not finished and not self._closed:
                with anyio.CancelScope(shield=True):
                    await self.send(CancelRequest(rid))

    async def generate(self, request: GenerateRequest) -> AsyncIterator[TokenChunk | Finish]:
        """Send ``request`` and yield its ``TokenChunk`` replies, then its ``Finish``.

        Raises ``RemoteError`` on an ``ErrorReply`` and ``WorkerUnavailable`` if the client is
        closed or failed meanwhile. Closing the iterator before ``Finish`` cancels the request.
        """
        async with aclosing(self.generate_batches(request)) as batches:
            async for batch in batches:
                for item in batch:
                    yield item
