"""Request plane and event plane over real ZMQ sockets on loopback."""

from contextlib import aclosing

import anyio
import msgspec
import pytest
import zmq
import zmq.asyncio

from dyn.core.kv.events import REPLAY_END_SEQ, BlockRemoved, decode_event_batch, encode_seq, split_frames
from dyn.core.messages import (
    LOAD_METRICS_TOPIC,
    CancelRequest,
    ErrorReply,
    Finish,
    GenerateRequest,
    LoadMetrics,
    TokenChunk,
    Usage,
)
from dyn.core.transport.event_plane import KvEventPublisher, MetricsPublisher, decode_load_metrics
from dyn.core.transport.request_plane import (
    RemoteError,
    RequestServer,
    WorkerClient,
    WorkerSilent,
    WorkerUnavailable,
)

pytestmark = pytest.mark.anyio


async def echo_worker(server: RequestServer, cancelled: list[str]) -> None:
    """Answers each generate with its prompt back in two chunks, unless the prompt is [0]."""
    while True:
        identity, msg = await server.recv()
        if isinstance(msg, GenerateRequest):
            if msg.token_ids == [0]:
                continue  # hang: the client will cancel
            if msg.token_ids == [13]:
                server.send(identity, ErrorReply(msg.request_id, "bad_request", "unlucky"))
                continue
            half = len(msg.token_ids) // 2
            server.send(identity, TokenChunk(msg.request_id, msg.token_ids[:half]))
            server.send(identity, TokenChunk(msg.request_id, msg.token_ids[half:]))
            server.send(
                identity, Finish(msg.request_id, "length", Usage(len(msg.token_ids), len(msg.token_ids)))
            )
        elif isinstance(msg, CancelRequest):
            cancelled.append(msg.request_id)
        else:
            server.send(identity, ErrorReply("", "bad_request", str(msg)))


async def test_generate_streams_chunks_then_finish_and_cancel_on_early_exit():
    server = RequestServer()
    cancelled: list[str] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(echo_worker, server, cancelled)
            async with WorkerClient(server.endpoint) as client:

                async def one(i):
                    out = [
                        m async for m in client.generate(GenerateRequest(f"r{i}", [i, i + 1, i + 2, i + 3]))
                    ]
                    assert [type(m) for m in out] == [TokenChunk, TokenChunk, Finish]
                    assert out[0].token_ids + out[1].token_ids == [i, i + 1, i + 2, i + 3]

                async with anyio.create_task_group() as many:
                    for i in range(1, 20):
                        many.start_soon(one, i)

                with pytest.raises(RemoteError, match="unlucky"):
                    async for _ in client.generate(GenerateRequest("bad", [13])):
                        pass

                with anyio.move_on_after(0.2):
                    async for _ in client.generate(GenerateRequest("hang", [0])):
                        pass
                while not cancelled:
                    await anyio.sleep(0.01)
                assert cancelled == ["hang"]
                assert client.in_flight == 0
            tg.cancel_scope.cancel()
    server.close()


async def test_malformed_frames_get_an_error_reply_not_a_crash():
    server = RequestServer()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(echo_worker, server, [])
            raw = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            raw.setsockopt(zmq.LINGER, 0)
            raw.connect(server.endpoint)
            await raw.send_multipart([b"G", b"\xc1not msgpack"])
            kind, payload = await raw.recv_multipart()
            reply = msgspec.msgpack.decode(payload, type=ErrorReply)
            assert kind == b"E" and reply.code == "bad_request" and "GenerateRequest" in reply.message
            await raw.send_multipart([b"only-one-frame-and", b"another", b"and-a-third"])
            kind, payload = await raw.recv_multipart()
            assert "2 frames" in msgspec.msgpack.decode(payload, type=ErrorReply).message
            raw.close()
            # the server still works
            async with WorkerClient(server.endpoint) as client:
                out = [m async for m in client.generate(GenerateRequest("ok", [1, 2]))]
                assert isinstance(out[-1], Finish)
            tg.cancel_scope.cancel()
    server.close()


async def test_kv_events_reach_a_plain_sub_and_replay_resends_from_a_seq():
    pub = KvEventPublisher(topic="kv-events")
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    with anyio.fail_after(10):
        # PUB/SUB joins asynchronously: publish until the subscriber sees something
        while True:
            pub.publish([BlockRemoved([pub.next_seq])], dp_rank=0)
            if await sub.poll(50):
                break
        topic, seq, payload = split_frames(await sub.recv_multipart())
        assert topic == b"kv-events"
        batch = decode_event_batch(payload)
        assert batch.events == [BlockRemoved([seq])] and batch.data_parallel_rank == 0

        async with anyio.create_task_group() as tg:
            tg.start_soon(pub.serve_replay)
            replay = ctx.socket(zmq.DEALER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.connect(pub.replay_endpoint)
            await replay.send_multipart([b"", encode_seq(1)])
            got = []
            while True:
                empty, seq_frame, body = await replay.recv_multipart()
                assert empty == b""
                if seq_frame == REPLAY_END_SEQ:
                    assert body == b""
                    break
                got.append((int.from_bytes(seq_frame, "big"), decode_event_batch(body).events))
            assert [s for s, _ in got] == list(range(1, pub.next_seq))
            assert all(events == [BlockRemoved([s])] for s, events in got)
            await replay.send_multipart([b"", b"short"])  # malformed: answered with the end marker only
            assert (await replay.recv_multipart())[1] == REPLAY_END_SEQ
            replay.close()
            tg.cancel_scope.cancel()
    sub.close()
    pub.close()


async def test_replay_buffer_is_bounded():
    pub = KvEventPublisher(buffer_size=3)
    for i in range(5):
        pub.publish([BlockRemoved([i])])
    assert [s for s, _ in pub.replay_from(0)] == [2, 3, 4]
    assert [s for s, _ in pub.replay_from(4)] == [4]
    pub.close()


async def test_load_metrics_have_their_own_topic():
    pub = MetricsPublisher()
    sub = zmq.asyncio.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, LOAD_METRICS_TOPIC)
    sub.connect(pub.endpoint)
    m = LoadMetrics(
        instance_id=5,
        dp_rank=0,
        ts=1.0,
        num_running=2,
        num_waiting=1,
        active_kv_blocks=10,
        total_kv_blocks=100,
        kv_usage=0.1,
    )
    with anyio.fail_after(10):
        while True:
            pub.publish(m)
            if await sub.poll(50):
                break
        topic, payload = await sub.recv_multipart()
    assert topic == LOAD_METRICS_TOPIC and decode_load_metrics(payload) == m
    sub.close()
    pub.close()


# --------------------------------------------------------------------------- reply batches


def chunk(rid, *ids):
    return TokenChunk(rid, list(ids))


def fin(rid):
    return Finish(rid, "length", Usage(1, 1))


async def test_generate_batches_unpacks_batches_in_order_and_accepts_single_kinds():
    server = RequestServer()
    r2_first_batch = anyio.Event()

    async def worker():
        identity, _ = await server.recv()
        identity2, _ = await server.recv()
        assert identity == identity2
        assert (
            server.send_replies(
                identity, [chunk("r1", 1), chunk("r2", 2), chunk("r1", 3), fin("r1"), chunk("r2", 4)]
            )
            == 1
        )
        await r2_first_batch.wait()
        server.send(identity, fin("r2"))  # a plain single-kind message still works

    batches: dict[str, list] = {}

    async def consume(client, rid):
        async for batch in client.generate_batches(GenerateRequest(rid, [1])):
            batches.setdefault(rid, []).append(batch)
            if rid == "r2":
                r2_first_batch.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            async with WorkerClient(server.endpoint) as client:
                async with anyio.create_task_group() as both:
                    both.start_soon(consume, client, "r1")
                    both.start_soon(consume, client, "r2")
                assert client.messages_received == 2 and client.in_flight == 0
    server.close()
    assert batches["r1"] == [[chunk("r1", 1), chunk("r1", 3), fin("r1")]]
    assert batches["r2"] == [[chunk("r2", 2), chunk("r2", 4)], [fin("r2")]]


async def test_an_error_in_a_batch_raises_after_the_chunks_before_it():
    server = RequestServer()

    async def worker():
        while True:
            identity, msg = await server.recv()
            if isinstance(msg, GenerateRequest):
                rid = msg.request_id
                server.send_replies(
                    identity, [chunk(rid, 1), chunk(rid, 2), ErrorReply(rid, "engine_error", "boom")]
                )

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            async with WorkerClient(server.endpoint) as client:
                got = []
                with pytest.raises(RemoteError, match="boom"):
                    async for batch in client.generate_batches(GenerateRequest("a", [1])):
                        got.append(batch)
                assert got == [[chunk("a", 1), chunk("a", 2)]]
                flat = []
                with pytest.raises(RemoteError, match="boom"):
                    async for item in client.generate(GenerateRequest("b", [1])):
                        flat.append(item)
                assert flat == [chunk("b", 1), chunk("b", 2)]
            tg.cancel_scope.cancel()
    server.close()


async def test_leaving_generate_batches_early_cancels_unless_finished():
    server = RequestServer()
    cancelled: list[str] = []

    async def worker():
        while True:
            identity, msg = await server.recv()
            if isinstance(msg, GenerateRequest):
                rid = msg.request_id
                if rid == "done":
                    server.send_replies(identity, [chunk(rid, 1), fin(rid)])
                else:
                    server.send_replies(identity, [chunk(rid, 1), chunk(rid, 2)])  # then nothing
            elif isinstance(msg, CancelRequest):
                cancelled.append(msg.request_id)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            async with WorkerClient(server.endpoint) as client:
                for rid in ("early", "done", "early-again"):
                    async with aclosing(client.generate_batches(GenerateRequest(rid, [1]))) as batches:
                        async for batch in batches:
                            assert batch[0] == chunk(rid, 1)
                            break
                    assert client.in_flight == 0
                while len(cancelled) < 2:
                    await anyio.sleep(0.01)
                # "done" had its Finish in the batch it stopped at: nothing to cancel; one
                # connection keeps order, so a cancel for it would have come before "early-again"
                assert cancelled == ["early", "early-again"]
            tg.cancel_scope.cancel()
    server.close()


async def test_the_worker_keeps_receiving_while_it_sends_batches():
    """Replies sent while a ``recv`` waits must not swallow its wakeup (zmq's FD is edge-triggered)."""
    server = RequestServer()
    received: list[str] = []
    arrived = anyio.Event()

    async def chatter(identity):
        i = 0
        while True:
            server.send_replies(identity, [chunk("bg", i), chunk("bg2", i)])
            i += 1
            await anyio.lowlevel.checkpoint()

    async def worker():
        while True:
            identity, msg = await server.recv()
            if not received:
                tg.start_soon(chatter, identity)  # replies go out all the time from now on
            received.append(msg.request_id)
            arrived.set()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            async with WorkerClient(server.endpoint) as client:
                for i in range(300):
                    arrived = anyio.Event()
                    client.send(CancelRequest(f"c{i}"))
                    with anyio.fail_after(2):
                        await arrived.wait()
                    if i % 3 == 0:
                        await anyio.sleep(0.001)  # let the chatter run while recv waits
            tg.cancel_scope.cancel()
    server.close()
    assert received == [f"c{i}" for i in range(300)]


async def test_messages_sent_in_one_turn_leave_together_in_order_and_a_refused_one_fails_its_stream():
    server = RequestServer()
    received: list[str] = []

    async def worker():
        while True:
            _, msg = await server.recv()
            received.append(msg.request_id)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker)
            async with WorkerClient(server.endpoint) as client:
                for i in range(50):  # one event-loop turn: nothing leaves until it ends
                    client.send(CancelRequest(f"c{i}"))
                assert len(client._outbox) == 50
                await anyio.lowlevel.checkpoint()
                assert client._outbox == []
                while len(received) < 50:
                    await anyio.sleep(0.01)
                assert received == [f"c{i}" for i in range(50)]

                def refuse(*args, **kwargs):
                    raise zmq.ZMQError(zmq.EAGAIN)

                client._socket.send_multipart = refuse  # the socket refuses what this turn queued
                with pytest.raises(WorkerUnavailable, match="cannot send to the worker"):
                    async for _ in client.generate_batches(GenerateRequest("refused", [1, 2])):
                        pass
                del client._socket.send_multipart
            tg.cancel_scope.cancel()
    server.close()


async def test_a_closed_worker_connection_fails_streams_at_once_and_new_ones_too():
    server = RequestServer()
    health: list[tuple[bool, str]] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(echo_worker, server, [])
            async with WorkerClient(
                server.endpoint, on_health=lambda _c, ok, why: health.append((ok, why))
            ) as client:
                out = [m async for m in client.generate(GenerateRequest("warm", [1, 2]))]
                assert isinstance(out[-1], Finish)
                failed: list[BaseException] = []

                async def hang() -> None:
                    try:
                        async for _ in client.generate(GenerateRequest("hang", [0])):
                            pass
                    except WorkerUnavailable as exc:
                        failed.append(exc)

                tg.start_soon(hang)
                while client.in_flight == 0:
                    await anyio.sleep(0.005)
                server.close()  # the worker's socket goes away, as when its process dies
                while not failed:
                    await anyio.sleep(0.005)
                assert "connection closed" in str(failed[0])
                assert health[-1][0] is False and not client.healthy
                # routed before the failure, sent after it: fails at once, never waits for discovery
                with pytest.raises(WorkerUnavailable, match="unhealthy"):
                    async for _ in client.generate(GenerateRequest("late", [1])):
                        pass
            tg.cancel_scope.cancel()


async def test_a_silent_worker_times_out_per_stream_and_recovers_when_it_answers():
    """A worker that ignores a request but answers its cancel (as ``WorkerHost`` does with a
    ``Finish(cancelled)``): out of routing on the timeout, back as soon as it sends anything."""
    server = RequestServer()
    health: list[bool] = []

    async def ignoring_worker() -> None:
        while True:
            identity, msg = await server.recv()
            if isinstance(msg, CancelRequest):
                server.send(identity, Finish(msg.request_id, "cancelled", Usage(1, 0)))
            elif msg.token_ids != [0]:
                server.send(identity, Finish(msg.request_id, "length", Usage(1, 0)))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ignoring_worker)
            async with WorkerClient(
                server.endpoint, first_token_timeout_s=0.2, on_health=lambda _c, ok, _why: health.append(ok)
            ) as client:
                started = anyio.current_time()
                with pytest.raises(WorkerSilent, match="before the first token"):
                    async for _ in client.generate(GenerateRequest("hang", [0])):
                        pass
                assert 0.2 <= anyio.current_time() - started < 1.0
                while health != [False, True]:  # its answer to the cancel brings it back
                    await anyio.sleep(0.01)
                out = [m async for m in client.generate(GenerateRequest("ok", [1, 2]))]
                assert isinstance(out[-1], Finish) and client.healthy
            tg.cancel_scope.cancel()
    server.close()
