"""The request/reply layer (``dyn.core.transport.rpc``) over real loopback sockets.

The server side follows SGLang's ``TypeBasedDispatcher`` (sglang/srt/utils: a mapping from request
type to handler) and the client side vLLM v1's core client (vllm/v1/engine/core_client.py: a map
of call id to future, failed when the client closes); the messages are dyn's own indexer and
router planes (``dyn.core.messages``).
"""

from __future__ import annotations

import logging
import time

import anyio
import anyio.lowlevel
import pytest
import zmq
import zmq.asyncio

from dyn.core.messages import (
    OverlapAnswer,
    OverlapQuery,
    OverlapRefused,
    RouteAnswer,
    RouteQuery,
    RouteRefused,
)
from dyn.core.transport.codec import decode_indexer_message, decode_router_message, encode
from dyn.core.transport.rpc import RpcClient, RpcDropped, RpcServer, RpcUnavailable
from dyn.core.transport.sockets import DRAIN_BATCH, async_context, bind_random, configure

pytestmark = pytest.mark.anyio


def indexer_server() -> tuple[RpcServer, str]:
    server = RpcServer(decode_indexer_message, what="malformed query")
    return server, bind_random(server.socket, "127.0.0.1")


def indexer_client(endpoint: str | None = None) -> RpcClient:
    return RpcClient(decode_indexer_message, (OverlapAnswer, OverlapRefused), peer="the test indexer")


async def raw_dealer(endpoint: str) -> zmq.asyncio.Socket:
    sock = configure(async_context().socket(zmq.DEALER))
    sock.connect(endpoint)
    return sock


async def test_the_server_dispatches_by_type_and_answers_malformed_frames():
    server, endpoint = indexer_server()
    seen: list[object] = []
    server.handle(OverlapQuery, lambda identity, q: server.send(identity, OverlapAnswer(q.query_id, 16, [])))
    server.fallback = lambda identity, m: seen.append(type(m).__name__)
    server.on_malformed = lambda identity, body, exc: server.send(identity, OverlapRefused(-1, str(exc)))
    dealer = await raw_dealer(endpoint)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            with anyio.fail_after(5):
                await dealer.send_multipart(encode(OverlapQuery(7, block_hashes=[1])))
                assert decode_indexer_message(await dealer.recv_multipart()) == OverlapAnswer(7, 16, [])
                await dealer.send_multipart([b"q", b"\xc1"])
                refused = decode_indexer_message(await dealer.recv_multipart())
                assert isinstance(refused, OverlapRefused) and refused.query_id == -1
                await dealer.send_multipart(encode(OverlapAnswer(1, 16, [])))  # no handler
                await dealer.send_multipart(encode(OverlapQuery(8, block_hashes=[1])))
                assert decode_indexer_message(await dealer.recv_multipart()).query_id == 8
            assert seen == ["OverlapAnswer"]
            assert server.rejected.total == 1
            tg.cancel_scope.cancel()
    finally:
        dealer.close(linger=0)
        server.close()


async def test_a_failing_handler_is_logged_and_the_server_goes_on(caplog):
    server, endpoint = indexer_server()
    calls = []

    async def handler(identity, query):
        calls.append(query.query_id)
        if query.query_id == 1:
            raise RuntimeError("a handler bug")
        server.send(identity, OverlapAnswer(query.query_id, 16, []))

    server.handle(OverlapQuery, handler)
    dealer = await raw_dealer(endpoint)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            with anyio.fail_after(5):
                await dealer.send_multipart(encode(OverlapQuery(1, block_hashes=[1])))
                await dealer.send_multipart(encode(OverlapQuery(2, block_hashes=[1])))
                assert decode_indexer_message(await dealer.recv_multipart()).query_id == 2
            tg.cancel_scope.cancel()
    finally:
        dealer.close(linger=0)
        server.close()
    assert calls == [1, 2]
    assert any("handling a OverlapQuery failed" in r.getMessage() for r in caplog.records)


async def test_a_flood_of_queued_messages_neither_starves_the_event_loop_nor_falls_behind_it():
    """At most ``DRAIN_BATCH`` messages per turn: the other tasks run between batches, and a
    busy process (few turns a second) still keeps up with its peers."""
    server, endpoint = indexer_server()
    handled = 0

    def count(identity, query):
        nonlocal handled
        handled += 1

    server.handle(OverlapQuery, count)
    flood = 20_000
    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.linger = 0
    raw.sndhwm = 0
    raw.connect(endpoint)
    frames = encode(OverlapQuery(1, block_hashes=[1]))
    try:
        for _ in range(flood):  # queued before the server reads the first
            raw.send_multipart(frames)
        ticks_during = 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            with anyio.fail_after(30):
                while handled < flood:
                    await anyio.lowlevel.checkpoint()
                    ticks_during += handled > 0
            tg.cancel_scope.cancel()
        # without a checkpoint between batches this task would run once, after the whole flood;
        # with one message a turn it would run 20,000 times
        assert 100 < ticks_during < flood // 8, ticks_during
    finally:
        raw.close()
        server.close()


async def test_a_client_reads_queued_replies_in_batches():
    client = indexer_client()
    unmatched = 0

    def count(reply):
        nonlocal unmatched
        unmatched += 1

    client.on_unmatched = count
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.linger = 0
    router.sndhwm = 0
    endpoint = bind_random(router, "127.0.0.1")
    replies = 5_000
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(client.run)
            client.connect(endpoint)
            with anyio.fail_after(10):
                while True:  # the DEALER announces itself when it connects
                    try:
                        identity = router.recv(zmq.NOBLOCK)
                        break
                    except zmq.Again:
                        client.send(OverlapQuery(client.new_id(), block_hashes=[1]))
                        await anyio.sleep(0.01)
            frames = encode(OverlapAnswer(1, 16, []))
            for _ in range(replies):
                router.send_multipart([identity, *frames])
            time.sleep(0.5)  # noqa: ASYNC251 - the loop is busy elsewhere; the replies queue up
            turns = 0
            with anyio.fail_after(10):
                while unmatched < replies:
                    await anyio.lowlevel.checkpoint()
                    turns += 1
            tg.cancel_scope.cancel()
        assert turns <= 3 * replies // DRAIN_BATCH, turns
    finally:
        router.close()


async def test_a_mandatory_server_reports_a_peer_that_left_without_logging(caplog):
    server = RpcServer(decode_router_message, mandatory=True)
    bind_random(server.socket, "127.0.0.1")
    try:
        with caplog.at_level(logging.WARNING):
            assert server.send(b"nobody", RouteRefused(0, "probe", "")) is False
        assert not caplog.records
    finally:
        server.close()


async def test_calls_are_matched_to_their_replies_by_id_in_any_order():
    server, endpoint = indexer_server()
    held: list[tuple[bytes, OverlapQuery]] = []

    def hold(identity, query):
        held.append((identity, query))
        if len(held) == 2:  # answer the later call first
            for identity, q in reversed(held):
                server.send(identity, OverlapAnswer(q.query_id, 16, [(q.query_id, 0, 1)]))

    server.handle(OverlapQuery, hold)
    client = indexer_client()
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        await tg.start(client.run)
        client.connect(endpoint)
        results: dict[int, object] = {}

        async def ask(qid: int) -> None:
            results[qid] = await client.call(OverlapQuery(qid, block_hashes=[qid]), 5)

        async with anyio.create_task_group() as calls:
            for _ in range(2):
                calls.start_soon(ask, client.new_id())
        assert results == {qid: OverlapAnswer(qid, 16, [(qid, 0, 1)]) for qid in results}
        assert sorted(results) == [1, 2] and client.pending == 0
        tg.cancel_scope.cancel()
    server.close()


async def test_a_call_collects_several_replies_and_late_ones_go_to_on_unmatched():
    server = RpcServer(decode_router_message)
    endpoint = bind_random(server.socket, "127.0.0.1")

    def answer(identity, q):
        for member in range(3):
            server.send(identity, RouteAnswer(q.query_id, 10 + member, 0, 0, 0, 16, 0, member))
        server.send(identity, RouteAnswer(q.query_id, 99, 0, 0, 0, 16, 0, 3))  # after the call ended

    server.handle(RouteQuery, answer)
    client = RpcClient(decode_router_message, (RouteAnswer, RouteRefused), peer="the test router")
    late = []
    got: list[RouteAnswer] = []
    client.on_unmatched = late.append
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        await tg.start(client.run)
        client.connect(endpoint)

        def collect(reply):
            got.append(reply)
            return len(got) == 3

        qid = client.new_id()
        with anyio.fail_after(5):
            last = await client.call(RouteQuery(qid, "r", [1]), 5, collect=collect)
            while not late:
                await anyio.sleep(0.01)
        assert [a.instance_id for a in got] == [10, 11, 12] and last is got[-1]
        assert [a.instance_id for a in late] == [99]
        tg.cancel_scope.cancel()
    server.close()


async def test_a_call_times_out_fails_on_close_and_refuses_when_not_running():
    silent = configure(async_context().socket(zmq.ROUTER))
    endpoint = bind_random(silent, "127.0.0.1")
    client = indexer_client()
    with pytest.raises(RpcUnavailable, match="not running"):
        await client.call(OverlapQuery(client.new_id(), block_hashes=[1]), 1)
    failed: list[BaseException] = []

    async def waiting() -> None:
        try:
            await client.call(OverlapQuery(client.new_id(), block_hashes=[1]), 30)
        except RpcUnavailable as exc:
            failed.append(exc)

    try:
        async with anyio.create_task_group() as callers:
            async with anyio.create_task_group() as running:
                await running.start(client.run)
                client.connect(endpoint)
                with pytest.raises(TimeoutError, match="the test indexer did not answer within 0.1 s"):
                    await client.call(OverlapQuery(client.new_id(), block_hashes=[1]), 0.1)
                assert client.pending == 0
                callers.start_soon(waiting)
                with anyio.fail_after(5):
                    while client.pending == 0:
                        await anyio.sleep(0.01)
                client.fail_all(RpcUnavailable("the server left"))
                with anyio.fail_after(5):
                    while not failed:
                        await anyio.sleep(0.01)
                assert [str(e) for e in failed] == ["the server left"]
                callers.start_soon(waiting)
                with anyio.fail_after(5):
                    while client.pending == 0:
                        await anyio.sleep(0.01)
                running.cancel_scope.cancel()  # closing the client fails the call in flight
        assert len(failed) == 2 and "was closed" in str(failed[-1]) and client.pending == 0
    finally:
        silent.close(linger=0)


async def test_a_call_whose_request_cannot_be_queued_is_dropped_and_counted(caplog):
    client = indexer_client()  # a DEALER with no server cannot queue anything
    async with anyio.create_task_group() as tg:
        await tg.start(client.run)
        with pytest.raises(RpcDropped, match="not taking calls"):
            await client.call(OverlapQuery(client.new_id(), block_hashes=[1]), 1)
        assert client.send(OverlapQuery(client.new_id(), block_hashes=[1]))  # queued for the turn's end
        await anyio.lowlevel.checkpoint()
        assert client.dropped == 2 and client.pending == 0
        tg.cancel_scope.cancel()
    assert client.send(OverlapQuery(client.new_id(), block_hashes=[1])) is False  # not running
    assert [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()] == [
        "dropped 1 message(s) to the test indexer: Resource temporarily unavailable"
    ]


async def test_what_a_turn_queues_leaves_together_in_order_and_a_failed_calls_request_stays():
    """Sends and calls of one event-loop turn leave at its end, in order; the server answers
    every call. A call failed (``fail_all``) before its turn ended never reaches the server."""
    server, endpoint = indexer_server()
    received: list[int] = []

    def answer(identity, query):
        received.append(query.query_id)
        server.send(identity, OverlapAnswer(query.query_id, 16, []))

    server.handle(OverlapQuery, answer)
    client = indexer_client()
    unmatched: list[int] = []
    client.on_unmatched = lambda reply: unmatched.append(reply.query_id)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        await tg.start(client.run)
        client.connect(endpoint)
        with anyio.fail_after(10):
            for qid in range(1, 21):  # one turn: nothing leaves until it ends
                assert client.send(OverlapQuery(qid, block_hashes=[qid]))
            assert len(client._outbox) == 20
            await anyio.lowlevel.checkpoint()
            assert client._outbox == []
            while len(unmatched) < 20:
                await anyio.sleep(0.01)
            assert received == list(range(1, 21)) and unmatched == received
            answers: dict[int, object] = {}

            async def ask(qid: int) -> None:
                try:
                    answers[qid] = await client.call(OverlapQuery(qid, block_hashes=[qid]), 5)
                except RpcUnavailable as exc:
                    answers[qid] = str(exc)

            async with anyio.create_task_group() as calls:
                for qid in range(21, 31):
                    calls.start_soon(ask, qid)
            assert answers == {qid: OverlapAnswer(qid, 16, []) for qid in range(21, 31)}
            async with anyio.create_task_group() as calls:
                calls.start_soon(ask, 31)
                await anyio.lowlevel.checkpoint()  # ``ask`` queued its request; the turn goes on
                client.send(OverlapQuery(32, block_hashes=[32]))
                client.fail_all(RpcUnavailable("the server left"))
            assert answers[31] == "the server left"
            while 32 not in received:
                await anyio.sleep(0.01)
            assert received[-1] == 32 and 31 not in received
        tg.cancel_scope.cancel()
    server.close()


async def test_a_client_counts_malformed_and_unexpected_replies(caplog):
    server = configure(async_context().socket(zmq.ROUTER))
    endpoint = bind_random(server, "127.0.0.1")
    client = indexer_client()
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(client.run)
            client.connect(endpoint)
            assert client.send(OverlapQuery(client.new_id(), block_hashes=[1]))
            with anyio.fail_after(5):
                identity = (await server.recv_multipart())[0]
                await server.send_multipart([identity, b"a", b"\xc1"])
                await server.send_multipart([identity, *encode(OverlapQuery(5, block_hashes=[1]))])
                while client.rejected.total < 2:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    finally:
        server.close(linger=0)
    lines = [
        r.getMessage() for r in caplog.records if "malformed message from the test indexer" in r.getMessage()
    ]
    assert lines and lines[0].startswith("rejected a malformed message from the test indexer")


async def test_answers_sent_while_queries_keep_arriving_lose_no_query():
    """The server answers on a plain view of its socket, and then has its asyncio socket look at
    its events again (such a send can take the wakeup a query that just arrived would have given
    the pending receive). Answers go out from a task of their own, as a worker's replies do,
    while eight clients each keep two queries in flight: every query is answered, in time."""
    server, endpoint = indexer_server()
    waiting: list[tuple[bytes, int]] = []
    queued = anyio.Event()

    def take(identity, query):
        waiting.append((identity, query.query_id))
        queued.set()

    async def answer() -> None:
        nonlocal queued
        while True:
            await queued.wait()
            queued = anyio.Event()
            await anyio.lowlevel.checkpoint()  # the receive loop is back to waiting on its socket
            while waiting:
                identity, query_id = waiting.pop(0)
                assert server.send(identity, OverlapAnswer(query_id, 16, []))

    server.handle(OverlapQuery, take)
    clients = [indexer_client() for _ in range(8)]
    calls = 300
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        tg.start_soon(answer)
        for client in clients:
            await tg.start(client.run)
            client.connect(endpoint)

        async def ask(client: RpcClient) -> None:
            for _ in range(calls):
                await client.call(OverlapQuery(client.new_id(), block_hashes=[1]), 5)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as askers:
                for client in clients:
                    askers.start_soon(ask, client)
                    askers.start_soon(ask, client)
        tg.cancel_scope.cancel()
    server.close()
