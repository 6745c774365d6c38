"""An ``RpcClient`` knows whether its server answers (``dyn.core.transport.liveness``), over real
loopback sockets: a server whose socket closes (a process killed: its kernel closes it) is seen at
once, one that stops answering heartbeats (a frozen process, here a relay that stops moving bytes)
within about a second, one never there or never completing a handshake too; the calls waiting
for it fail at once, and it is reachable again when it answers."""

from __future__ import annotations

import socket
import time

import anyio
import anyio.abc
import pytest
import zmq

from dyn.core.messages import OverlapAnswer, OverlapQuery, OverlapRefused
from dyn.core.transport.codec import decode_indexer_message
from dyn.core.transport.liveness import Reachability
from dyn.core.transport.rpc import RpcClient, RpcServer, RpcUnavailable
from dyn.core.transport.sockets import bind_random
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio

SILENT = 999
"""A query with this block hash is never answered."""


def client(heard: list[tuple[bool, str]]) -> RpcClient:
    rpc = RpcClient(decode_indexer_message, (OverlapAnswer, OverlapRefused), peer="the test indexer")
    rpc.on_reachable = lambda reachable, why: heard.append((reachable, why))
    return rpc


def server(endpoint: str | None = None) -> tuple[RpcServer, str]:
    """An indexer-plane server answering every query but ``SILENT`` ones, at ``endpoint`` (or a
    free port)."""
    rpc = RpcServer(decode_indexer_message)
    if endpoint is None:
        endpoint = bind_random(rpc.socket, "127.0.0.1")
    else:
        rpc.socket.bind(endpoint)

    def answer(identity: bytes, query: OverlapQuery) -> None:
        if query.block_hashes != [SILENT]:
            rpc.send(identity, OverlapAnswer(query.query_id, 16, []))

    rpc.handle(OverlapQuery, answer)
    return rpc, endpoint


async def ask(rpc: RpcClient, block: int = 1, timeout_s: float = 30) -> OverlapAnswer:
    return await rpc.call(OverlapQuery(rpc.new_id(), block_hashes=[block]), timeout_s)


async def failure_after(rpc: RpcClient, tg: anyio.abc.TaskGroup) -> tuple[list[BaseException], float]:
    """Start a call that is never answered; returns where its failure lands and when it started."""
    failed: list[BaseException] = []

    async def waiting() -> None:
        try:
            await ask(rpc, SILENT)
        except RpcUnavailable as exc:
            failed.append(exc)

    tg.start_soon(waiting)
    await wait_until(lambda: rpc.pending, 5, "the call to be pending")
    return failed, time.monotonic()


class FreezingRelay:
    """A TCP relay in front of a server that freezes like a SIGSTOPped process: while frozen it
    still accepts connections (a frozen process's kernel does) but moves no byte either way."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._thawed = anyio.Event()
        self._thawed.set()

    def freeze(self) -> None:
        self._thawed = anyio.Event()

    def thaw(self) -> None:
        self._thawed.set()

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started()
        await listener.serve(self._relay)

    async def _relay(self, downstream: anyio.abc.SocketStream) -> None:
        upstream = await anyio.connect_tcp("127.0.0.1", self.target_port)
        async with downstream, upstream, anyio.create_task_group() as tg:
            tg.start_soon(self._pump, downstream, upstream, tg.cancel_scope)
            tg.start_soon(self._pump, upstream, downstream, tg.cancel_scope)

    async def _pump(self, source, sink, scope: anyio.CancelScope) -> None:
        try:
            while True:
                data = await source.receive()
                await self._thawed.wait()
                await sink.send(data)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            scope.cancel()


async def test_a_server_whose_socket_closes_is_unreachable_at_once_and_back_when_it_listens_again():
    heard: list[tuple[bool, str]] = []
    rpc = client(heard)
    first, endpoint = server()
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            await tg.start(rpc.run)
            serving = anyio.CancelScope()

            async def serve_first() -> None:
                with serving:
                    await first.serve()

            tg.start_soon(serve_first)
            rpc.connect(endpoint)
            assert (await ask(rpc)).block_size == 16
            assert rpc.reachable and rpc.down_since is None and rpc.outage() is None
            failed, _ = await failure_after(rpc, tg)

            closed = time.monotonic()
            serving.cancel()
            first.close()
            await wait_until(lambda: failed, 1, "the waiting call to fail")
            assert time.monotonic() - closed < 0.5
            assert "the test indexer is unreachable: the connection closed" in str(failed[0])
            await wait_until(lambda: heard, 1, "the listener to hear it")
            assert heard == [
                (False, "the connection closed (the server died, or stopped answering heartbeats)")
            ]
            assert not rpc.reachable and rpc.down_since is not None
            assert rpc.outage().startswith("unreachable for ")
            started = time.monotonic()
            with pytest.raises(RpcUnavailable, match="the test indexer is unreachable for"):
                await ask(rpc)
            assert time.monotonic() - started < 0.1
            assert rpc.send(OverlapQuery(rpc.new_id(), block_hashes=[1])) is False

            second, _ = server(endpoint)  # restarted on the same port: ZeroMQ reconnects
            tg.start_soon(second.serve)
            await wait_until(lambda: rpc.reachable, 3, "the client to reconnect")
            assert (await ask(rpc)).block_size == 16
            await wait_until(lambda: len(heard) == 2, 1, "the listener to hear the return")
            assert heard[-1] == (True, "answering")
            tg.cancel_scope.cancel()
    second.close()


async def test_a_frozen_server_is_unreachable_within_about_a_second_and_back_when_it_thaws():
    heard: list[tuple[bool, str]] = []
    rpc = client(heard)
    backend, endpoint = server()
    relay = FreezingRelay(int(endpoint.rsplit(":", 1)[1]))
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(rpc.run)
            tg.start_soon(backend.serve)
            await tg.start(relay.serve)
            rpc.connect(f"tcp://127.0.0.1:{relay.port}")
            assert (await ask(rpc)).block_size == 16
            failed, _ = await failure_after(rpc, tg)

            relay.freeze()
            frozen = time.monotonic()
            await wait_until(lambda: failed, 3, "the waiting call to fail")
            seen = time.monotonic() - frozen
            assert 0.7 < seen < 1.6, seen  # the heartbeat timeout (1 s), give or take one interval
            assert not rpc.reachable
            await anyio.sleep(1.5)  # it reconnects to the relay, but no handshake completes
            assert not rpc.reachable and heard == [
                (False, "the connection closed (the server died, or stopped answering heartbeats)")
            ]

            relay.thaw()
            await wait_until(lambda: rpc.reachable, 3, "the client to be back")
            assert (await ask(rpc)).block_size == 16
            assert heard[-1] == (True, "answering")
            tg.cancel_scope.cancel()
    backend.close()


async def test_a_server_never_there_or_never_handshaking_is_unreachable_and_fails_its_calls():
    with socket.socket() as mute:  # the kernel accepts connections; nobody ever speaks
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        with socket.socket() as gone:
            gone.bind(("127.0.0.1", 0))
            nobody = f"tcp://127.0.0.1:{gone.getsockname()[1]}"
        heard: list[tuple[bool, str]] = []
        rpc = client(heard)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                await tg.start(rpc.run)
                assert rpc.reachable  # no server: nothing known to be down
                rpc.connect(nobody)
                await wait_until(lambda: not rpc.reachable, 0.5, "a refused connection to be seen")
                # the listener hears it from the client's own task, a moment after the flag turns
                await wait_until(lambda: heard, 1, "the listener to hear it")
                assert heard == [(False, "cannot connect (nothing listens there)")]
                rpc.disconnect(nobody)
                assert rpc.reachable
                await wait_until(lambda: len(heard) == 2, 1, "the listener to hear it")
                assert heard[1] == (True, "no server is known to be down")

                heard.clear()
                connected = time.monotonic()  # the grace runs from here, not from the call
                rpc.connect(f"tcp://127.0.0.1:{mute.getsockname()[1]}")
                assert rpc.reachable  # in its grace: calls wait for the handshake
                failed, asked = await failure_after(rpc, tg)
                await wait_until(lambda: failed, 2, "the call to fail when the grace ends")
                assert time.monotonic() - connected > 0.8 and time.monotonic() - asked < 1.5
                assert not rpc.reachable and heard[0][0] is False and "no handshake" in heard[0][1]
                tg.cancel_scope.cancel()


def test_reachability_counts_the_servers_it_was_given():
    now = [0.0]
    reach = Reachability(clock=lambda: now[0])
    assert reach.reachable and reach.down_since is None and reach.next_change() is None
    reach.add("tcp://a:1")
    reach.add("tcp://b:1")
    assert reach.next_change() == 1.0
    assert not reach.event(zmq.EVENT_HANDSHAKE_SUCCEEDED, "tcp://a:1")
    now[0] = 5.0  # b's grace is over; a answers
    assert reach.reachable and reach.next_change() is None
    assert reach.event(zmq.EVENT_DISCONNECTED, "tcp://a:1")
    assert not reach.reachable and reach.down_since == 5.0 and "connection closed" in reach.down_reason
    assert not reach.event(zmq.EVENT_CONNECT_RETRIED, "tcp://a:1")  # down already: first reason kept
    assert "connection closed" in reach.down_reason
    assert not reach.event(zmq.EVENT_DISCONNECTED, "tcp://gone:1")  # not one of its servers
    reach.event(zmq.EVENT_HANDSHAKE_SUCCEEDED, "tcp://b:1")
    assert reach.reachable
    reach.remove("tcp://b:1")
    reach.remove("tcp://a:1")
    assert reach.reachable  # none left: nothing known to be down
