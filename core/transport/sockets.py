"""Small helpers around pyzmq sockets shared by both planes."""

from __future__ import annotations

import zmq
import zmq.asyncio


def async_context() -> zmq.asyncio.Context:
    """The process-wide asyncio ZMQ context."""
    return zmq.asyncio.Context.instance()


def sync_context() -> zmq.Context:
    """The process-wide plain ZMQ context, for sockets that never block (PUB)."""
    return zmq.Context.instance()


def bind_random(socket: zmq.Socket, host: str) -> str:
    """Bind ``socket`` to a free TCP port on ``host`` and return its ``tcp://host:port`` endpoint."""
    port = socket.bind_to_random_port(f"tcp://{host}")
    return f"tcp://{host}:{port}"


def configure(socket: zmq.Socket, *, hwm: int = 0) -> zmq.Socket:
    """Linger 0 (closing never hangs) and the given high-water marks (0 = unbounded)."""
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, hwm)
    socket.setsockopt(zmq.RCVHWM, hwm)
    return socket
