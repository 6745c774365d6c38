"""The request plane: a worker's ROUTER socket and the DEALER client that talks to it.

Worker side, ``RequestServer``: an ``RpcServer`` (``dyn.core.transport.rpc``) on a ROUTER; every
received message is ``[identity, kind, payload]``; replies go back to the same identity, one per
message (``send``) or packed into ``ReplyBatch`` messages (``send_replies``). Client side, ``WorkerClient``: one
DEALER per worker, read by a callback of the event loop (no task: a reply reaches its stream in
the same loop turn its socket became readable) that unpacks batches and hands each reply to the
stream of the request it names; sends never wait (the DEALER's queue is unbounded) and leave
together at the end of the event-loop turn that queued them. A stream ends with ``Finish``; an ``ErrorReply`` for it raises
``RemoteError`` from the iterator. Leaving the iterator early sends ``CancelRequest``.
``generate_batches`` yields, per wakeup, everything that arrived for the request meanwhile, so a
consumer can handle a forward pass's worth of tokens at once; ``generate`` yields one reply at a
time. ``call`` sends a control call and waits for its single ``ControlReply``; ``embed`` sends an
``EmbedRequest`` and waits for its single ``EmbedReply``.

Liveness (``dyn.core.transport.liveness``): the client's socket sends ZMTP heartbeats and a socket
monitor watches its connection. When the connection drops (the worker process died: the kernel
closes its socket at once) or the heartbeats go unanswered (``HEARTBEAT_TIMEOUT_MS``: a frozen or
unreachable host), or a request waits on a client that never connected (a stale record of a dead
worker), every in-flight stream fails with ``WorkerUnavailable`` and ``on_health`` hears
``(client, False, reason)``; a later successful handshake reports it healthy again. With
silence timeouts set, a stream that gets no reply for ``first_token_timeout_s`` (before its first
reply) or ``inter_token_timeout_s`` (after it) fails with ``WorkerSilent`` and the client reports
itself unhealthy until the worker sends anything again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing, suppress
from typing import cast

import anyio
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from dyn.core.messages import (
    CancelRequest,
    ControlReply,
    EmbedReply,
    EmbedRequest,
    ErrorReply,
    Finish,
    GenerateRequest,
    PinPrefixRequest,
    ReplyBatch,
    SessionControlRequest,
    TokenChunk,
)
from dyn.core.transport.codec import (
    ProtocolError,
    RejectedFrames,
    decode_reply,
    decode_request,
    encode,
    encode_replies,
)
from dyn.core.transport.liveness import CONNECTION_EVENTS, heartbeat, watch_events
from dyn.core.transport.rpc import RpcServer
from dyn.core.transport.sockets import async_context, bind_random, configure, recv_frames

log = logging.getLogger(__name__)

_DRAIN_BATCH = 256


class RemoteError(RuntimeError):
    """The worker answered a request with an ``ErrorReply``."""

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(f"{reply.code}: {reply.message}")
        self.code = reply.code
        self.reply = reply


class WorkerUnavailable(RuntimeError):
    """The worker cannot finish the request: its connection was lost or closed, or it left."""


class WorkerSilent(WorkerUnavailable):
    """The worker sent nothing for a request within its silence timeout."""


HealthListener = Callable[["WorkerClient", bool, str], None]
"""``(client, healthy, reason)``: the client lost or regained its worker."""

_StreamItem = TokenChunk | Finish | ErrorReply | ControlReply | EmbedReply | BaseException
"""What a request's stream receives: its replies, or the local failure that ends it."""

_Batch = list[TokenChunk | Finish]
"""Replies of one request that arrived together: ``TokenChunk``s, the last may be its ``Finish``."""


class RequestServer(RpcServer):
    """A worker's request-plane socket: an ``RpcServer`` of ``decode_request``, bound on ``host``
    at a free port (``endpoint``). Malformed frames are counted as ``malformed request frame``s
    in ``logger``'s name."""

    def __init__(self, host: str = "127.0.0.1", *, logger: logging.Logger = log) -> None:
        super().__init__(decode_request, what="malformed request frame", logger=logger)
        self.endpoint = bind_random(self.socket, host)

    def send_replies(self, identity: bytes, replies: list[TokenChunk | Finish | ErrorReply]) -> int:
        """Send ``replies`` (in order) to the client with this identity as few messages as
        ``encode_replies`` packs them into, without waiting (see ``RpcServer.send_frames``; a
        ROUTER drops messages to a client that went away); returns how many messages that was."""
        send = self.send_frames
        messages = encode_replies(replies)
        for frames in messages:
            send(identity, frames)
        return len(messages)


class _ReplyStream:
    """Replies of one in-flight request, buffered until its consumer reads them. ``touched``:
    something arrived since the silence watchdog last looked; ``since``: when it last saw
    something arrive (or the stream start); ``started``: a first reply has arrived."""

    __slots__ = ("items", "ready", "touched", "since", "started", "timed_out")

    def __init__(self) -> None:
        self.items: list[_StreamItem] = []
        self.ready = asyncio.Event()  # asyncio's own: this client runs on asyncio alone
        self.touched = False
        self.since = time.monotonic()
        self.started = False
        self.timed_out = False

    def push(self, item: _StreamItem) -> None:
        self.touched = True
        items = self.items
        items.append(item)
        if len(items) == 1:  # the consumer took everything before: wake it
            self.ready.set()


_Outgoing = GenerateRequest | CancelRequest | SessionControlRequest | PinPrefixRequest | EmbedRequest
"""What a client sends a worker: each names the request it belongs to."""


class WorkerClient:
    """Client of one worker's request plane. Use as ``async with WorkerClient(endpoint) as c``.

    ``generate`` may be called concurrently from many tasks; request ids must be unique among the
    requests in flight on this client. ``healthy`` and ``on_health``: see the module docstring
    (0 disables a silence timeout).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        first_token_timeout_s: float = 0.0,
        inter_token_timeout_s: float = 0.0,
        on_health: HealthListener | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.first_token_timeout_s = first_token_timeout_s
        self.inter_token_timeout_s = inter_token_timeout_s
        self.on_health = on_health
        # a plain socket in the asyncio context: read by ``_on_readable``, not by pyzmq's futures,
        # and its monitor (inproc, same context) is an asyncio socket
        self._socket: zmq.Socket[bytes] = heartbeat(configure(zmq.Socket(async_context(), zmq.DEALER)))
        self._streams: dict[str, _ReplyStream] = {}
        self._outbox: list[tuple[str, list[bytes]]] = []
        """(request id, frames) queued this event-loop turn (see ``send``)."""
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False
        self.healthy = True
        """False while the worker is unreachable or silent (see the module docstring)."""
        self._handshaken = False
        self._silent = False
        self._rejected = RejectedFrames(log, f"malformed reply from {endpoint}", "malformed replies")
        self.messages_received = 0
        """Reply messages received (a ``ReplyBatch`` counts once), for measurements."""

    async def __aenter__(self) -> WorkerClient:
        # monitor and connect only once a task reads the monitor: see ``watch_events``
        self._monitor = watch_events(self._socket, CONNECTION_EVENTS)
        self._socket.connect(self.endpoint)
        self._loop = asyncio.get_running_loop()
        self._fd = cast(int, self._socket.getsockopt(zmq.FD))
        self._loop.add_reader(self._fd, self._on_readable)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._watch_connection)
        if self.first_token_timeout_s > 0 or self.inter_token_timeout_s > 0:
            self._tg.start_soon(self._watch_silence)
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.fail_all(WorkerUnavailable(f"client for {self.endpoint} closed"))
        self._closed = True
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(*exc_info)
        finally:  # also when the caller is cancelled: a socket left open would retry forever
            self._loop.remove_reader(self._fd)
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._socket.close(linger=0)

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def fail_all(self, error: BaseException) -> None:
        """End every in-flight stream with ``error`` (e.g. the worker left discovery)."""
        for stream in self._streams.values():
            stream.push(error)

    def _set_health(self, healthy: bool, reason: str) -> None:
        if healthy == self.healthy:
            return
        self.healthy = healthy
        if not healthy:
            self.fail_all(WorkerUnavailable(f"worker at {self.endpoint}: {reason}"))
        if self.on_health is not None:
            try:
                self.on_health(self, healthy, reason)
            except Exception:
                log.exception("worker health listener failed")

    async def _watch_connection(self) -> None:
        """Follow the socket monitor: a dropped connection (or one never made) is a dead worker."""
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshaken = True
                self._silent = False
                self._set_health(True, "connected")
            elif event == zmq.EVENT_DISCONNECTED:
                self._set_health(
                    False, "the connection closed (the worker died or stopped answering heartbeats)"
                )
            elif event == zmq.EVENT_CONNECT_RETRIED and not self._handshaken and self._streams:
                # never connected and a request waits on it: a stale record of a dead worker
                self._set_health(False, "cannot connect")

    async def _watch_silence(self) -> None:
        """Fail the streams whose worker has been silent past their timeout."""
        limits = [t for t in (self.first_token_timeout_s, self.inter_token_timeout_s) if t > 0]
        interval = min(1.0, max(0.02, min(limits) / 4))
        while True:
            await anyio.sleep(interval)
            now = time.monotonic()
            silent = 0
            for rid, stream in list(self._streams.items()):
                if stream.touched:
                    stream.touched = False
                    stream.started = True
                    stream.since = now
                    continue
                limit = self.inter_token_timeout_s if stream.started else self.first_token_timeout_s
                if limit > 0 and not stream.timed_out and now - stream.since > limit:
                    stream.timed_out = True
                    silent += 1
                    what = "between tokens" if stream.started else "before the first token"
                    stream.push(
                        WorkerSilent(
                            f"worker at {self.endpoint} sent nothing for request {rid} for {limit:g} s {what}"
                        )
                    )
            if silent and self.healthy:
                self._silent = True
                self._set_health(False, f"silent for {silent} request(s)")

    def _on_readable(self) -> None:
        """Receive what is queued, at most ``_DRAIN_BATCH`` messages per loop turn (the rest in
        the next turn, after the streams this turn woke). The socket's descriptor only signals
        that its state may have changed, so reading goes on until nothing is left."""
        socket = self._socket
        if socket.closed:
            return
        for _ in range(_DRAIN_BATCH):
            try:
                frames = recv_frames(socket)
            except zmq.Again:
                return
            try:
                self._deliver(frames)
            except Exception:  # a bug here must not stop this worker's replies
                log.exception("delivering a reply from %s failed", self.endpoint)
        self._loop.call_soon(self._on_readable)

    def _deliver(self, frames: list[bytes]) -> None:
        self.messages_received += 1
        if self._silent:
            self._silent = False
            self._set_health(True, "answering again")
        try:
            reply = decode_reply(frames)
        except ProtocolError as exc:
            self._rejected.reject(exc)
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

    def _route(self, reply: TokenChunk | Finish | ErrorReply | ControlReply | EmbedReply) -> None:
        stream = self._streams.get(reply.request_id)
        if stream is not None:
            stream.push(reply)
        elif isinstance(reply, ErrorReply):
            log.warning("worker %s: %s: %s", self.endpoint, reply.code, reply.message)

    def send(self, message: _Outgoing) -> None:
        """Queue ``message`` for the worker; never waits. It goes out at the end of this
        event-loop turn with every other message queued in the turn: one wakeup of ZeroMQ's I/O
        thread and one look at the socket's events for all of them, not one per message (at 128
        streams that cut the I/O thread's CPU per request by two thirds). The DEALER's queue is
        unbounded and keeps messages while the connection is down. ``WorkerUnavailable`` when the
        socket is closed; should it refuse the message later (never expected), the stream of the
        request the message names fails with ``WorkerUnavailable``."""
        if self._socket.closed:
            raise WorkerUnavailable(f"cannot send to the worker at {self.endpoint}: its socket is closed")
        outbox = self._outbox
        if not outbox:
            self._loop.call_soon(self._flush)
        outbox.append((message.request_id, encode(message)))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        socket = self._socket
        for request_id, frames in outbox:
            try:
                socket.send_multipart(frames, zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # closed meanwhile, or (never expected) a full queue
                stream = self._streams.get(request_id)
                if stream is not None:
                    stream.push(WorkerUnavailable(f"cannot send to the worker at {self.endpoint}: {exc}"))
        # sending may consume the descriptor's signal of replies that arrived meanwhile
        if not socket.closed and cast(int, socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self._on_readable()

    async def call(
        self, message: SessionControlRequest | PinPrefixRequest, timeout_s: float = 10.0
    ) -> ControlReply:
        """Send a control call (its ``request_id`` unique on this client) and return
        its ``ControlReply``. Raises ``RemoteError`` on an ``ErrorReply``, ``WorkerUnavailable``
        when the client closes meanwhile, ``TimeoutError`` after ``timeout_s``."""
        reply = await self._single_reply(message, timeout_s)
        if isinstance(reply, ControlReply):
            return reply
        raise RemoteError(
            ErrorReply(message.request_id, "bad_reply", f"a control call got a {type(reply).__name__}")
        )

    async def embed(self, request: EmbedRequest, timeout_s: float) -> EmbedReply:
        """Send ``request`` and return its ``EmbedReply``; fails as ``call`` does, and with
        ``WorkerUnavailable`` at once when the client is unhealthy."""
        if not self.healthy:
            raise WorkerUnavailable(f"client for {self.endpoint} is unhealthy")
        reply = await self._single_reply(request, timeout_s)
        if isinstance(reply, EmbedReply):
            return reply
        raise RemoteError(
            ErrorReply(request.request_id, "bad_reply", f"an embed request got a {type(reply).__name__}")
        )

    async def _single_reply(
        self, message: SessionControlRequest | PinPrefixRequest | EmbedRequest, timeout_s: float
    ) -> _StreamItem:
        """Send a message answered by one reply (its ``request_id`` unique on this client) and
        return that reply; an ``ErrorReply`` or a local failure is raised."""
        if self._closed:
            raise WorkerUnavailable(f"client for {self.endpoint} is closed")
        rid = message.request_id
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in flight on this client")
        stream = self._streams[rid] = _ReplyStream()
        try:
            self.send(message)
            with anyio.fail_after(timeout_s):
                while not stream.items:
                    await stream.ready.wait()
                    stream.ready.clear()
        finally:
            del self._streams[rid]
        reply = stream.items[0]
        if isinstance(reply, ErrorReply):
            raise RemoteError(reply)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def generate_batches(self, request: GenerateRequest) -> AsyncGenerator[_Batch, None]:
        """Send ``request`` and yield, per wakeup, the non-empty list of its replies that arrived
        since the last yield: ``TokenChunk``s in order, the last list ending with the ``Finish``.

        Raises ``RemoteError`` on an ``ErrorReply`` and ``WorkerUnavailable`` if the client is
        closed or unhealthy, or fails meanwhile (after yielding the chunks that came before).
        Closing the iterator before ``Finish`` cancels the request.
        """
        if self._closed or not self.healthy:
            # unhealthy: its in-flight streams failed already; a request routed just before must too
            state = "closed" if self._closed else "unhealthy"
            raise WorkerUnavailable(f"client for {self.endpoint} is {state}")
        rid = request.request_id
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in flight on this client")
        stream = self._streams[rid] = _ReplyStream()
        finished = False
        try:
            self.send(request)
            while True:
                await stream.ready.wait()
                stream.ready.clear()
                items = stream.items
                if not items:
                    continue
                stream.items = []
                end = len(items)
                for i, item in enumerate(items):
                    if type(item) is not TokenChunk:
                        end = i
                        break
                # items[:end] are TokenChunks (checked just above)
                if end == len(items):
                    yield cast(_Batch, items)
                    continue
                terminal = items[end]
                # a reply ends the request on the worker; a local failure (silence) may not have
                finished = not isinstance(terminal, BaseException)
                if isinstance(terminal, Finish):
                    yield cast(_Batch, items[: end + 1] if end + 1 < len(items) else items)
                    return
                if end:
                    yield cast(_Batch, items[:end])
                if isinstance(terminal, ErrorReply):
                    raise RemoteError(terminal)
                if isinstance(terminal, BaseException):
                    raise terminal
                raise RemoteError(ErrorReply(rid, "bad_reply", "a generate request got a control reply"))
        finally:
            del self._streams[rid]
            if not finished and not self._closed:
                with suppress(WorkerUnavailable):
                    self.send(CancelRequest(rid))

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[TokenChunk | Finish, None]:
        """Send ``request`` and yield its ``TokenChunk`` replies, then its ``Finish``.

        Raises ``RemoteError`` on an ``ErrorReply`` and ``WorkerUnavailable`` if the client is
        closed or failed meanwhile. Closing the iterator before ``Finish`` cancels the request.
        """
        async with aclosing(self.generate_batches(request)) as batches:
            async for batch in batches:
                for item in batch:
                    yield item
