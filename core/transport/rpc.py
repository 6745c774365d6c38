"""One request/reply layer over ZeroMQ: ``RpcServer`` (a ROUTER) and ``RpcClient`` (a DEALER).

Every plane that answers requests (a worker's request plane, ``dyn router``, ``dyn indexer``)
serves through an ``RpcServer``; every client that waits for an answer by id (``RemoteRouter``,
``RemoteIndexer``) calls through an ``RpcClient``. Messages are the catalogue structs of
``dyn.core.messages``, framed by ``dyn.core.transport.codec``; a ``decode`` function (one per
plane, e.g. ``decode_router_message``) turns frames into a struct or raises ``ProtocolError``.

``RpcServer`` contract:

- ``handle(cls, handler)`` registers the handler of one message type; ``serve()`` receives until
  cancelled, decodes each message once and calls the handler of its exact type with
  ``(identity, message)`` (a dict lookup: no ``isinstance`` chain). A handler may return an
  awaitable, which is awaited before the next message. A type with no handler goes to
  ``fallback`` (default: dropped with a debug line).
- A malformed message is counted and logged through ``RejectedFrames`` (``rejected``) and passed
  to ``on_malformed(identity, body, error)`` so the peer can be answered. A handler that raises is
  logged; nothing a peer sends stops the loop.
- The loop takes what is queued, at most ``DRAIN_BATCH`` messages, then yields to the event loop
  (pyzmq does not yield while messages are queued), so a flood cannot starve the other tasks of
  the process, and a busy process still keeps up with its peers.
- ``send`` / ``send_frames`` never wait (the high-water marks are unbounded): they return False
  when the send failed at once (a peer that left, with ``mandatory``: silently; otherwise
  logged), and a send that completes later logs its failure.

``RpcClient`` contract:

- ``run()`` owns the DEALER and its receive loop until cancelled (``started()`` once the socket
  exists); ``connect`` / ``disconnect`` choose the servers. On exit every pending call fails
  with ``RpcUnavailable``.
- The client knows whether its servers answer (``dyn.core.transport.liveness``): its DEALER sends
  ZMTP heartbeats and a socket monitor follows each connection, so a server that died is seen at
  once and a frozen one within ``HEARTBEAT_TIMEOUT_MS``. ``reachable`` is False from then until
  a handshake succeeds again (ZeroMQ reconnects by itself); ``down_since`` and ``outage()`` say
  since when and why; ``on_reachable(reachable, reason)`` hears each change. When a server goes
  down every pending call fails at once with ``RpcUnavailable`` (which server a call went to is
  not known); while the client is unreachable ``call`` raises ``RpcUnavailable`` at once and
  ``send`` drops its message (returns False): what it says belongs to a connection that is gone.
- ``call(message, timeout_s)`` sends ``message`` (its ``id_of`` is a ``new_id()``) and returns
  the reply whose ``id_of`` matches: a map from id to a pending call (a future), filled by the
  receive loop. With ``collect``, each matching reply is passed to it and the call ends when it
  returns True (one query, several answers). Raises ``TimeoutError`` after ``timeout_s``,
  ``RpcUnavailable`` when the client does not run or fails its pending calls (``fail_all``,
  closing), ``RpcDropped`` (one) when the socket refused the request. A call that ends any way
  takes its id out of the map.
- Replies for no pending call go to ``on_unmatched`` (default: dropped); a reply of a type the
  client does not take, or malformed frames, are counted and logged through ``rejected``.
- ``send`` queues a message without waiting (False when the client does not run or is
  unreachable). What one event-loop turn queues (sends and calls) leaves at the end of the turn,
  in order, together: one wakeup of ZeroMQ's I/O thread and one look at the socket's events for
  all of it. A message the
  socket refuses then (full: the server stopped reading) is dropped, counted in ``dropped`` and
  logged on the first and every thousandth; a call's request fails its call with ``RpcDropped``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from operator import attrgetter
from typing import Any, cast

import anyio
import anyio.lowlevel
import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from dyn.core.transport.codec import ProtocolError, RejectedFrames, encode
from dyn.core.transport.liveness import (
    CONNECTION_EVENTS,
    HANDSHAKE_FAILED,
    Reachability,
    heartbeat,
    watch_events,
)
from dyn.core.transport.sockets import DRAIN_BATCH, async_context, configure, plain_view, receive_queued

log = logging.getLogger(__name__)

Sent = asyncio.Future[zmq.MessageTracker | None]
"""What an asyncio socket's send returns (pyzmq's stubs say only ``Awaitable``)."""

Decode = Callable[[Sequence[bytes]], Any]
Handler = Callable[[bytes, Any], Awaitable[None] | None]
SEND_HWM = 10_000
"""A client's high-water marks: a server that stops reading makes ``send`` drop, not queue forever."""


class RpcUnavailable(RuntimeError):
    """The client cannot call now: not running, cannot send, or its pending calls were failed."""


class RpcDropped(RpcUnavailable):
    """A call's request was dropped: the client's socket is full (the server stopped reading)."""


def _log_send_error(sent: Sent) -> None:
    """Done-callback of a send that could not complete at once: log its failure, if any."""
    if not sent.cancelled() and sent.exception() is not None:
        log.warning("a queued message could not be sent: %s", sent.exception())


# ------------------------------------------------------------------------------- server


class RpcServer:
    """A ROUTER socket that dispatches decoded messages by type (see the module docstring).

    The socket is made here and not bound: bind ``socket`` (``sockets.bind_random`` or the
    service's ``bind_zmq``) and keep its endpoint. ``mandatory`` sets ``ROUTER_MANDATORY``: a send
    to a peer that left fails (``send`` returns False) instead of being dropped silently.
    """

    def __init__(
        self,
        decode: Decode,
        *,
        what: str = "malformed message",
        plural: str | None = None,
        mandatory: bool = False,
        logger: logging.Logger = log,
    ) -> None:
        self.socket: zmq.asyncio.Socket = configure(async_context().socket(zmq.ROUTER))
        if mandatory:
            self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._decode = decode
        self._log = logger
        self.rejected = RejectedFrames(logger, what, plural)
        self._handlers: dict[type, Handler] = {}
        self._send_now = plain_view(self.socket).send_multipart
        self._recheck: Callable[[], None] | None = getattr(self.socket, "_schedule_remaining_events", None)
        self.fallback: Handler = self._drop
        self.on_malformed: Callable[[bytes, list[bytes], ProtocolError], object] | None = None

    def handle(self, cls: type, handler: Handler) -> None:
        """Call ``handler(identity, message)`` for every message of exactly type ``cls``."""
        self._handlers[cls] = handler

    async def serve(self) -> None:
        """Receive, decode and dispatch until cancelled (see the module docstring)."""
        recv = self.socket.recv_multipart
        queued = plain_view(self.socket)
        checkpoint = anyio.lowlevel.checkpoint
        while True:
            # a queued message does not make pyzmq yield: a flood must not starve the loop
            await checkpoint()
            await self._dispatch(await recv(copy=True))
            for frames in receive_queued(queued, DRAIN_BATCH - 1):
                await self._dispatch(frames)

    async def _dispatch(self, frames: list[bytes]) -> None:
        identity, body = frames[0], frames[1:]
        try:
            message = self._decode(body)
        except ProtocolError as exc:
            self.rejected.reject(exc)
            if self.on_malformed is not None:
                self.on_malformed(identity, body, exc)
            return
        try:
            done = self._handlers.get(type(message), self.fallback)(identity, message)
            if done is not None:
                await done
        except Exception:  # a handler bug must not stop the server
            self._log.exception("handling a %s failed", type(message).__name__)

    async def recv(self) -> tuple[bytes, Any]:
        """The next message as ``(identity, message)``, or ``(identity, ProtocolError)`` for
        malformed frames (not counted: ``serve`` is the loop that counts), for callers that
        drive their own loop."""
        frames = await self.socket.recv_multipart(copy=True)
        identity, body = frames[0], frames[1:]
        try:
            return identity, self._decode(body)
        except ProtocolError as exc:
            return identity, exc

    def send(self, identity: bytes, message: msgspec.Struct) -> bool:
        """Send ``message`` to the peer ``identity`` without waiting; False if it failed."""
        return self.send_frames(identity, encode(message))

    def send_frames(self, identity: bytes, frames: Sequence[bytes]) -> bool:
        """Send encoded ``frames`` to the peer ``identity`` without waiting; False if it failed.

        A direct non-blocking send on a plain view of the socket (no future per message), after
        which the asyncio socket looks at its events again: a send on the view can consume the
        edge-triggered wakeup a pending receive waits for. Were the socket busy, the message goes
        through the asyncio socket, which queues it behind the others, in order, and logs its
        failure; so does every send where pyzmq lacks that re-check (its internals changed).
        """
        message = [identity, *frames]
        if self._recheck is not None:
            try:
                self._send_now(message, zmq.NOBLOCK)
            except zmq.Again:
                pass
            except zmq.ZMQError as exc:
                return self._send_failed(exc)
            else:
                self._recheck()
                return True
        try:
            # the asyncio socket returns a Future; pyzmq's stub says Awaitable (see Sent)
            sent: Sent = self.socket.send_multipart(message)  # type: ignore[assignment]
        except zmq.ZMQError as exc:
            return self._send_failed(exc)
        if sent.done():
            error = sent.exception()
            return error is None or self._send_failed(error)
        sent.add_done_callback(_log_send_error)
        return True

    def _send_failed(self, exc: BaseException) -> bool:
        if not (isinstance(exc, zmq.ZMQError) and exc.errno == zmq.EHOSTUNREACH):
            self._log.warning("could not answer a client: %s", exc)
        return False

    def _drop(self, identity: bytes, message: Any) -> None:
        self._log.debug("dropping a %s: no handler", type(message).__name__)

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket; ``linger_ms`` > 0 lets messages already queued still go out."""
        self.socket.close(linger=linger_ms)


# ------------------------------------------------------------------------------- client


class _Call:
    """A call waiting for its reply (or, with ``collect``, its replies)."""

    __slots__ = ("collect", "done", "reply", "error")

    def __init__(self, collect: Callable[[Any], bool] | None) -> None:
        self.collect = collect
        self.done = anyio.Event()
        self.reply: Any = None
        self.error: BaseException | None = None


class RpcClient:
    """A DEALER that matches replies to calls by id (see the module docstring).

    ``reply_types`` are the messages the servers send back; ``id_of`` reads the call id of a
    request or reply (default: its ``query_id``). ``peer`` names the servers in messages.
    """

    def __init__(
        self,
        decode: Decode,
        reply_types: tuple[type, ...],
        *,
        peer: str,
        id_of: Callable[[Any], int] = attrgetter("query_id"),
        hwm: int = SEND_HWM,
        logger: logging.Logger = log,
    ) -> None:
        self.peer = peer
        self._decode = decode
        self._reply_types = frozenset(reply_types)
        self._id_of = id_of
        self._hwm = hwm
        self._log = logger
        self.socket: zmq.asyncio.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._send_now: Callable[..., Any] | None = None
        self._recheck: Callable[[], None] | None = None
        self._outbox: list[tuple[int | None, list[bytes]]] = []
        """What this turn queued: (the id of the call it starts, or None; its frames)."""
        self._pending: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        self.on_unmatched: Callable[[Any], None] | None = None
        self.rejected = RejectedFrames(
            logger, f"malformed message from {peer}", f"malformed messages from {peer}"
        )
        self.dropped = 0
        """Messages dropped because the socket was full or gone."""
        self._reach = Reachability()
        self._changed = anyio.Event()
        self.on_reachable: Callable[[bool, str], None] | None = None
        """Hears ``(reachable, reason)`` on each change of ``reachable``."""

    @property
    def pending(self) -> int:
        """Calls waiting for their reply."""
        return len(self._pending)

    def new_id(self) -> int:
        """A call id no other call of this client has used."""
        return next(self._ids)

    @property
    def reachable(self) -> bool:
        """Whether a server answers, or none is connected (see the module docstring)."""
        return self._reach.reachable

    @property
    def down_since(self) -> float | None:
        """When (``time.monotonic``) the client lost its last server; None while reachable."""
        return self._reach.down_since

    def outage(self) -> str | None:
        """``unreachable for 1.2 s: WHY``, or None while reachable."""
        since = self._reach.down_since
        if since is None:
            return None
        return f"unreachable for {max(time.monotonic() - since, 0.0):.1f} s: {self._reach.down_reason}"

    # ----------------------------------------------------------------- lifetime

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Own the DEALER, its monitor and the receive loop until cancelled; ``started()`` once
        the socket exists."""
        socket = heartbeat(configure(async_context().socket(zmq.DEALER), hwm=self._hwm))
        # monitor before any connect, read from the start: see ``watch_events``
        monitor = watch_events(socket, CONNECTION_EVENTS | HANDSHAKE_FAILED)
        try:
            self.socket = socket
            self._loop = asyncio.get_running_loop()
            queued = plain_view(socket)
            # sends go straight out on the plain view where pyzmq has the events re-check they need
            self._recheck = getattr(socket, "_schedule_remaining_events", None)
            self._send_now = queued.send_multipart if self._recheck is not None else None
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, monitor)
                tg.start_soon(self._follow_reachability)
                task_status.started()
                while True:
                    await anyio.lowlevel.checkpoint()
                    self._deliver(await socket.recv_multipart(copy=True))
                    for frames in receive_queued(queued, DRAIN_BATCH - 1):
                        self._deliver(frames)
        finally:
            self.socket = None
            self._outbox = []
            self._reach = Reachability()
            self.fail_all(RpcUnavailable(f"the client of {self.peer} was closed"))
            socket.disable_monitor()
            monitor.close(linger=0)
            socket.close(linger=0)

    def connect(self, endpoint: str) -> None:
        """Connect to a server (``zmq.ZMQError`` for a bad endpoint); the client must run."""
        assert self.socket is not None, "connect needs a running client"
        self.socket.connect(endpoint)
        self._reach.add(endpoint)
        self._changed.set()

    def disconnect(self, endpoint: str) -> None:
        """Stop talking to a server (a server never connected is ignored)."""
        self._reach.remove(endpoint)
        self._changed.set()
        if self.socket is not None:
            try:
                self.socket.disconnect(endpoint)
            except zmq.ZMQError:
                pass

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """Follow the socket monitor: a server that went down fails the pending calls at once."""
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            endpoint = event["endpoint"].decode(errors="replace")
            if self._reach.event(event["event"], endpoint):
                self.fail_all(RpcUnavailable(f"{self.peer} is unreachable: {self._reach.down_reason}"))
            self._changed.set()

    async def _follow_reachability(self) -> None:
        """Tell ``on_reachable`` each change of ``reachable``, including a server's grace that
        ends without a handshake (which fails the calls waiting for it)."""
        told = True
        while True:
            wake_at = self._reach.next_change()
            delay = math.inf if wake_at is None else max(wake_at - time.monotonic(), 0.0) + 0.001
            with anyio.move_on_after(delay):
                await self._changed.wait()
            self._changed = anyio.Event()
            reachable = self._reach.reachable
            if reachable == told:
                continue
            told = reachable
            if reachable:
                reason = "answering" if self._reach.answering else "no server is known to be down"
            else:
                reason = self._reach.down_reason
            if not reachable:
                self.fail_all(RpcUnavailable(f"{self.peer} is unreachable: {reason}"))
            if self.on_reachable is not None:
                try:
                    self.on_reachable(reachable, reason)
                except Exception:
                    self._log.exception("a reachability listener of %s failed", self.peer)

    def fail_all(self, error: BaseException) -> None:
        """End every pending call with ``error`` (raised by its ``call``); their requests still
        queued do not leave."""
        pending, self._pending = self._pending, {}
        self._outbox = [queued for queued in self._outbox if queued[0] is None]
        for call in pending.values():
            call.error = error
            call.done.set()

    def _deliver(self, frames: list[bytes]) -> None:
        try:
            reply = self._decode(frames)
        except ProtocolError as exc:
            self.rejected.reject(exc)
            return
        if type(reply) not in self._reply_types:
            self.rejected.reject(f"a {type(reply).__name__} is not a reply")
            return
        call_id = self._id_of(reply)
        call = self._pending.get(call_id)
        if call is None:
            if self.on_unmatched is not None:
                self.on_unmatched(reply)
            return
        call.reply = reply
        if call.collect is None or call.collect(reply):
            del self._pending[call_id]
            call.done.set()

    # ----------------------------------------------------------------- calls

    def send(self, message: msgspec.Struct) -> bool:
        """Queue ``message`` to leave at the end of this event-loop turn; False when the client
        does not run or is unreachable (see the module docstring for a message the socket
        refuses)."""
        return self._queue(None, encode(message))

    def _queue(self, call_id: int | None, frames: list[bytes]) -> bool:
        if self.socket is None or self._loop is None or not self._reach.reachable:
            return False
        if not self._outbox:
            self._loop.call_soon(self._flush)
        self._outbox.append((call_id, frames))
        return True

    def _flush(self) -> None:
        """Send what this turn queued. Each direct send on a plain view of the socket, then one
        look at its events (a send can take the wakeup a pending receive waits for); where pyzmq
        lacks that look (its internals changed), each goes through the asyncio socket."""
        outbox, self._outbox = self._outbox, []
        socket = self.socket
        if socket is None:  # closed meanwhile: its calls were failed
            return
        send, recheck = self._send_now, self._recheck
        for call_id, frames in outbox:
            try:
                if send is not None:
                    send(frames, zmq.NOBLOCK)
                    continue
                # the asyncio socket returns a Future; pyzmq's stub says Awaitable (see Sent)
                sent: Sent = socket.send_multipart(frames, flags=zmq.NOBLOCK)  # type: ignore[assignment]
            except zmq.ZMQError as exc:  # full (the server stopped reading), or closed under us
                self._dropped(call_id, exc)
                continue
            if not sent.done():
                sent.add_done_callback(_log_send_error)
            elif sent.exception() is not None:
                self._dropped(call_id, cast(BaseException, sent.exception()))
        if recheck is not None:
            recheck()

    def _dropped(self, call_id: int | None, exc: BaseException) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % 1000 == 0:
            self._log.warning("dropped %d message(s) to %s: %s", self.dropped, self.peer, exc)
        call = self._pending.pop(call_id, None) if call_id is not None else None
        if call is not None:
            call.error = RpcDropped(f"{self.peer} is not taking calls (its socket is full)")
            call.done.set()

    async def call(
        self, message: msgspec.Struct, timeout_s: float, *, collect: Callable[[Any], bool] | None = None
    ) -> Any:
        """Send ``message`` and return its reply (see the module docstring)."""
        if self.socket is None:
            raise RpcUnavailable(f"the client of {self.peer} is not running")
        if not self._reach.reachable:
            raise RpcUnavailable(f"{self.peer} is {self.outage()}")
        call_id = self._id_of(message)
        if call_id in self._pending:
            raise ValueError(f"call id {call_id!r} is already pending on this client")
        call = self._pending[call_id] = _Call(collect)
        try:
            self._queue(call_id, encode(message))
            with anyio.move_on_after(timeout_s):
                await call.done.wait()
        finally:
            if self._pending.get(call_id) is call:
                del self._pending[call_id]
        if call.error is not None:
            raise call.error
        if not call.done.is_set():
            raise TimeoutError(f"{self.peer} did not answer within {timeout_s:g} s")
        return call.reply
