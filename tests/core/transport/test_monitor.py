"""Socket monitors never stall libzmq's I/O thread, and a client's sockets close on every path.

libzmq sends monitor events from the context's I/O thread with a blocking send; with the
default high-water mark, about a thousand unread events (two minutes of reconnect retries to a
dead worker) stopped that thread and every socket of the process's context with it. That froze
in-process ZMQ tests in some CI runs, and would freeze a frontend that kept an unread monitor.
"""

import socket

import anyio
import pytest
import zmq
import zmq.asyncio

from dyn.core.transport.request_plane import WorkerClient, watch_events

pytestmark = pytest.mark.anyio

DEAD = "tcp://127.0.0.1:{port}"


def dead_endpoint() -> str:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return DEAD.format(port=s.getsockname()[1])


async def ping(context: zmq.asyncio.Context) -> bool:
    """Whether a message crosses between two fresh sockets of ``context`` within 3 s."""
    server, client = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    server.linger = client.linger = 0
    try:
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client.connect(f"tcp://127.0.0.1:{port}")
        await client.send(b"ping")
        with anyio.move_on_after(3):
            await server.recv_multipart()
            return True
        return False
    finally:
        server.close()
        client.close()


async def test_thousands_of_unread_monitor_events_do_not_stall_the_context():
    context = zmq.asyncio.Context()
    retrying = context.socket(zmq.DEALER)
    retrying.linger = 0
    retrying.reconnect_ivl = 1  # ms: a retry, and an event, every millisecond
    retrying.reconnect_ivl_max = 0
    monitor = watch_events(retrying, zmq.EVENT_CONNECT_RETRIED)
    try:
        retrying.connect(dead_endpoint())
        await anyio.sleep(3)  # nobody reads the monitor meanwhile
        assert await ping(context), "the context stopped delivering"
        unread = 0
        while await monitor.poll(0):
            await monitor.recv_multipart()
            unread += 1
        assert unread > 1500, unread  # past the ~1000 a default pipe holds: the premise held
    finally:
        retrying.close()
        monitor.close()
        context.destroy(linger=0)


async def test_a_cancelled_client_closes_its_socket_and_monitor():
    client = WorkerClient(dead_endpoint())
    with anyio.CancelScope() as scope:
        async with client:
            scope.cancel()
            await anyio.sleep(1)
    assert client._socket.closed and client._monitor.closed


async def test_a_client_never_entered_has_no_monitor_and_does_not_connect():
    client = WorkerClient(dead_endpoint())
    try:
        assert not hasattr(client, "_monitor")
        assert client._socket.get(zmq.LAST_ENDPOINT) == b""
    finally:
        client._socket.close(linger=0)
