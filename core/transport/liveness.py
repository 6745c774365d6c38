"""Whether a client's server is there: ZMTP heartbeats, a socket monitor, and what they tell.

A dead server process's socket is closed by its kernel, so the client sees its connection drop
within a millisecond. A frozen process (SIGSTOP) or an unreachable host keeps the connection open
and says nothing, so every client socket sends ZMTP heartbeats (``heartbeat``): a PING every
``HEARTBEAT_IVL_MS``, answered by the peer's libzmq I/O thread (not by its application), and the
connection is closed when nothing came back within ``HEARTBEAT_TIMEOUT_MS``. A socket monitor
(``watch_events``) reports either as ``EVENT_DISCONNECTED``, a completed handshake as
``EVENT_HANDSHAKE_SUCCEEDED`` and a failed connection attempt as ``EVENT_CONNECT_RETRIED``;
ZeroMQ reconnects by itself.

The request plane's ``WorkerClient`` follows its one worker this way. ``Reachability`` keeps the
same account for a client of services (``RpcClient``), per server:

- a server is *up* from its handshake until its connection drops, a connection attempt fails or
  its handshake fails; once down, it is up again only when a handshake completes;
- a server just connected counts as up for ``HEARTBEAT_TIMEOUT_MS`` while its first handshake is
  pending (requests queue meanwhile), then as down: a frozen process accepts TCP connections (its
  kernel does) but never completes a handshake;
- the client is ``reachable`` while one of its servers is up, or it has none (nothing is known to
  be down: ZeroMQ refuses to queue a message with nowhere to go). ``down_since`` and
  ``down_reason`` say since when (``time.monotonic``) and why it is not.

The monitor names a server by its endpoint as given to ``connect`` until a reconnect, then by the
address it resolved to (``tcp://[::ffff:127.0.0.1]:5555`` for ``tcp://localhost:5555``), so an
event for an endpoint not connected applies to the TCP servers of the same port (every client
here has one server at a time; two servers on one port of different hosts would share events).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import cast

import zmq
import zmq.asyncio

from dyn.core.transport.sockets import SocketT, configure, plain

HEARTBEAT_IVL_MS = 200
HEARTBEAT_TIMEOUT_MS = 1000
CONNECTION_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_monitor_ids = itertools.count()


def heartbeat(socket: SocketT) -> SocketT:
    """Turn on ZMTP heartbeats on a client socket (see the module docstring)."""
    socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    return socket


def watch_events(socket: zmq.Socket, events: int) -> zmq.asyncio.Socket:
    """An asyncio PAIR socket receiving ``socket``'s monitor ``events`` (``socket`` belongs to the
    asyncio context), which never blocks libzmq.

    libzmq sends monitor events from its I/O thread with a blocking send: once the monitor's pipe
    is full (its high-water mark, about a thousand events: under two minutes of reconnect retries
    to a dead worker) that thread stops, and with it every socket of the context. The receiving
    end here takes any number (RCVHWM 0, which makes the inproc pipe unbounded); its owner reads
    it for as long as the socket lives and closes both together.
    """
    address = f"inproc://dyn-monitor-{os.getpid()}-{next(_monitor_ids)}"
    socket.monitor(address, events)
    # unbounded, and inproc needs no keys
    monitor = plain(configure(cast(zmq.asyncio.Socket, socket.context.socket(zmq.PAIR))))
    monitor.connect(address)
    return monitor


CONNECT_GRACE_S = HEARTBEAT_TIMEOUT_MS / 1000
"""How long a server just connected counts as up while its first handshake is pending."""


class _Server:
    """One server's state: ``up``, else down from ``since`` (maybe in the future: a server just
    connected, in its grace) for ``reason``."""

    __slots__ = ("up", "since", "reason")

    def __init__(self, since: float) -> None:
        self.up = False
        self.since = since
        self.reason = "no handshake within a second (the server is frozen, or its host does not answer)"


class Reachability:
    """Which of a client's servers are up, from its monitor's events (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._servers: dict[str, _Server] = {}
        self._up = 0

    def add(self, endpoint: str) -> None:
        """``endpoint`` was connected: in its grace until its handshake."""
        self.remove(endpoint)
        self._servers[endpoint] = _Server(self._clock() + CONNECT_GRACE_S)

    def remove(self, endpoint: str) -> None:
        """``endpoint`` was disconnected: what its monitor says from now on is ignored."""
        server = self._servers.pop(endpoint, None)
        if server is not None and server.up:
            self._up -= 1

    def event(self, event: int, endpoint: str) -> bool:
        """Apply one monitor event; True when it took a server down (its calls are lost)."""
        server = self._servers.get(endpoint)
        if server is not None:
            return self._apply(server, event)
        port = _tcp_port(endpoint)
        down = False
        for known, server in self._servers.items():
            if port is not None and _tcp_port(known) == port:
                down = self._apply(server, event) or down
        return down

    def _apply(self, server: _Server, event: int) -> bool:
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if not server.up:
                server.up = True
                self._up += 1
            return False
        now = self._clock()
        if event == zmq.EVENT_DISCONNECTED:
            why = "the connection closed (the server died, or stopped answering heartbeats)"
        elif event == zmq.EVENT_CONNECT_RETRIED:
            why = "cannot connect (nothing listens there)"
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            why = "the server refused this client's key (--plane-keys)"
        elif event & HANDSHAKE_FAILED:
            why = "the handshake failed (do both sides use the same --plane-keys?)"
        else:
            return False
        if server.up:
            server.up = False
            self._up -= 1
        elif server.since <= now:  # down already: keep the first reason
            return False
        server.since = now
        server.reason = why
        return True

    @property
    def answering(self) -> bool:
        """Whether a server completed its handshake and is up."""
        return self._up > 0

    @property
    def reachable(self) -> bool:
        if self._up or not self._servers:
            return True
        now = self._clock()
        return any(server.since > now for server in self._servers.values())

    @property
    def down_since(self) -> float | None:
        """When the client lost its last server (``time.monotonic``); None while reachable."""
        if self.reachable:
            return None
        return max(server.since for server in self._servers.values())

    @property
    def down_reason(self) -> str:
        """Why the server lost last is down ("" while reachable)."""
        if self.reachable:
            return ""
        return max(self._servers.values(), key=lambda server: server.since).reason

    def next_change(self) -> float | None:
        """When a server's grace ends next (``time.monotonic``), or None: no state changes by
        itself before the next event."""
        now = self._clock()
        pending = [s.since for s in self._servers.values() if not s.up and s.since > now]
        return min(pending, default=None)


def _tcp_port(endpoint: str) -> str | None:
    return endpoint.rpartition(":")[2] if endpoint.startswith("tcp://") else None
