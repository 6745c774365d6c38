"""WorkerHost contracts, with a scripted engine behind a real request plane and file discovery."""

import logging
from contextlib import asynccontextmanager

import anyio
import pytest
import zmq
import zmq.asyncio

from dyn.core.config import DiscoveryConfig
from dyn.core.engine import FEATURE_PIN_PREFIX, FEATURE_STREAMING_SESSIONS, EngineError, EngineInfo
from dyn.core.messages import (
    ControlReply,
    Finish,
    GenerateRequest,
    LoadMetrics,
    PinPrefixRequest,
    ReplyBatch,
    SamplingParams,
    SessionControlRequest,
    StopConditions,
    TokenChunk,
    Usage,
)
from dyn.core.transport.codec import decode_reply, encode
from dyn.core.transport.request_plane import RemoteError, WorkerClient
from dyn.core.worker.host import WorkerHost
from dyn.core.worker.settings import WorkerSettings
from tests.memory_discovery import memory_store

pytestmark = pytest.mark.anyio


class ScriptedEngine:
    """Prompt [n] streams n tokens 50 ms apart; [-1] raises a bug; [-2] raises an EngineError;
    [-3] never finishes; [-4] yields something that is not a reply."""

    def __init__(self):
        self.info = EngineInfo(block_size=16, total_kv_blocks=100, max_num_batched_tokens=512)
        self.aborted = []

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED):
        task_status.started()
        await anyio.sleep_forever()

    async def generate(self, request):
        (n,) = request.token_ids
        if n == -1:
            raise ZeroDivisionError("engine bug")
        if n == -2:
            raise EngineError("prompt too long", code="bad_request")
        if n == -3:
            await anyio.sleep_forever()
        if n == -4:
            yield TokenChunk(request.request_id, [1])
            yield "not a reply"
        for i in range(n):
            await anyio.sleep(0.05)
            yield TokenChunk(request.request_id, [i])
        yield Finish(request.request_id, "length", Usage(1, n))

    async def abort(self, request_id):
        self.aborted.append(request_id)
        return True

    def load_metrics(self):
        return [LoadMetrics(0, 0, 0.0, 0, 0, 0, 100, 0.0)]


class ControlEngine(ScriptedEngine):
    """Serves sessions and pins, and says higher priority values go first."""

    def __init__(self):
        super().__init__()
        self.info = EngineInfo(
            block_size=16,
            total_kv_blocks=100,
            max_num_batched_tokens=512,
            priority_order="higher_first",
            features=[FEATURE_STREAMING_SESSIONS, FEATURE_PIN_PREFIX],
            device="cpu",
        )
        self.sessions = {}

    async def open_session(self, session_id, timeout_s):
        if session_id == "boom":
            raise EngineError("no room for another session")
        fresh = session_id not in self.sessions
        self.sessions[session_id] = timeout_s
        return fresh

    async def close_session(self, session_id):
        return self.sessions.pop(session_id, None) is not None

    async def pin_prefix(self, token_ids, ttl_s):
        return len(token_ids) // 16


@asynccontextmanager
async def running_host(tmp_path, drain_timeout_s=5.0, engine=None):
    """Yield ``(store, record, client, stop, task_group)`` for a host serving a ScriptedEngine."""
    store = memory_store(tmp_path, "t")
    host = WorkerHost(
        engine or ScriptedEngine(),
        engine_name="scripted",
        model_name="m",
        store=store,
        settings=WorkerSettings(discovery=DiscoveryConfig(namespace="t"), drain_timeout_s=drain_timeout_s),
    )
    stop = anyio.Event()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(host.run, stop)
            (record,) = await store.list()
            assert record.instance_id == host.instance_id
            async with WorkerClient(record.endpoints.request) as client:
                yield store, record, client, stop, tg
            stop.set()


async def test_errors_are_replies_and_the_worker_keeps_serving(tmp_path):
    async with running_host(tmp_path) as (store, record, client, _stop, _tg):
        assert record.endpoints.request.startswith("tcp://127.0.0.1:")
        with pytest.raises(RemoteError) as bug:
            async for _ in client.generate(GenerateRequest("a", [-1])):
                pass
        assert bug.value.code == "engine_error" and "engine bug" in str(bug.value)
        with pytest.raises(RemoteError) as bad:
            async for _ in client.generate(GenerateRequest("b", [-2])):
                pass
        assert bad.value.code == "bad_request"
        got = []
        with pytest.raises(RemoteError) as odd:
            async for m in client.generate(GenerateRequest("odd", [-4])):
                got.append(m)
        assert got == [TokenChunk("odd", [1])]
        assert odd.value.code == "engine_error" and "yielded a str" in str(odd.value)
        # the same id twice while in flight: the second gets duplicate_request
        async with WorkerClient(record.endpoints.request) as other:

            async def first():
                return [m async for m in client.generate(GenerateRequest("same", [4]))]

            async with anyio.create_task_group() as pair:
                pair.start_soon(first)
                await anyio.sleep(0.05)
                with pytest.raises(RemoteError) as dup:
                    async for _ in other.generate(GenerateRequest("same", [1])):
                        pass
                assert dup.value.code == "duplicate_request"
        out = [m async for m in client.generate(GenerateRequest("c", [3]))]
        assert [m.token_ids for m in out[:-1]] == [[0], [1], [2]] and out[-1].reason == "length"
    assert await store.list() == []


async def test_control_calls_reach_the_engine_and_unsupported_ones_say_so(tmp_path):
    async with running_host(tmp_path, engine=ControlEngine()) as (_store, record, client, _s, _tg):
        assert record.priority_order == "higher_first" and record.device == "cpu"
        assert record.features == ["streaming_sessions", "pin_prefix"]
        opened = await client.call(SessionControlRequest("o1", "open", "s1", 90.0))
        assert opened == ControlReply("o1", 1)
        again = await client.call(SessionControlRequest("o2", "open", "s1", 90.0))
        assert again.value == 0
        with pytest.raises(RemoteError) as failed:
            await client.call(SessionControlRequest("o3", "open", "boom", 90.0))
        assert failed.value.code == "engine_error" and "no room" in str(failed.value)
        with pytest.raises(RemoteError) as odd:
            await client.call(SessionControlRequest("o4", "rename", "s1"))
        assert odd.value.code == "bad_request" and "open or close" in str(odd.value)
        assert (await client.call(SessionControlRequest("c1", "close", "s1"))).value == 1
        pinned = await client.call(PinPrefixRequest("p1", list(range(40)), 300.0))
        assert pinned.value == 2
        # generation still works beside control calls
        out = [m async for m in client.generate(GenerateRequest("g", [2]))]
        assert out[-1].reason == "length"
    async with running_host(tmp_path / "plain") as (_store, record, client, _s, _tg):
        assert record.features == [] and record.priority_order == "lower_first" and record.device is None
        for call in (SessionControlRequest("o", "open", "s", 5.0), PinPrefixRequest("p", [1], 300.0)):
            with pytest.raises(RemoteError) as unsupported:
                await client.call(call)
            assert unsupported.value.code == "unsupported"


async def test_shutdown_leaves_discovery_first_then_drains(tmp_path):
    async with running_host(tmp_path) as (store, _record, client, stop, _tg):
        got = []
        async for m in client.generate(GenerateRequest("long", [10])):
            got.append(m)
            if len(got) == 2:
                stop.set()
                await anyio.sleep(0.05)
                assert await store.list() == []  # gone from discovery, still streaming
        assert isinstance(got[-1], Finish) and len(got) == 11


async def test_requests_still_running_after_the_drain_timeout_get_an_error(tmp_path):
    async with running_host(tmp_path, drain_timeout_s=0.3) as (_store, _record, client, stop, tg):

        async def stopper():
            await anyio.sleep(0.2)
            stop.set()

        tg.start_soon(stopper)
        with pytest.raises(RemoteError) as cut:
            async for _ in client.generate(GenerateRequest("stuck", [-3])):
                pass
        assert cut.value.code == "worker_shutdown"


# --------------------------------------------------------------------------- reply batching


class _PassStream:
    __slots__ = ("done", "n", "next", "ready", "tokens")

    def __init__(self, n):
        self.n, self.next, self.tokens, self.done = n, 0, [], False
        self.ready = anyio.Event()


class PassEngine:
    """A batch engine the test steps by hand: ``step()`` is one forward pass giving every running
    request its next token (prompt [n]: n tokens 0..n-1, the last one with its Finish) and waking
    all their streams at once, as the mocker does at the end of a pass."""

    def __init__(self):
        self.info = EngineInfo(block_size=16, total_kv_blocks=100, max_num_batched_tokens=512)
        self.streams: dict[str, _PassStream] = {}

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED):
        task_status.started()
        await anyio.sleep_forever()

    async def generate(self, request):
        rid = request.request_id
        stream = self.streams[rid] = _PassStream(request.token_ids[0])
        try:
            while True:
                await stream.ready.wait()
                stream.ready = anyio.Event()
                if stream.tokens:
                    tokens, stream.tokens = stream.tokens, []
                    yield TokenChunk(rid, tokens)
                if stream.done:
                    yield Finish(rid, "length", Usage(1, stream.n))
                    return
        finally:
            del self.streams[rid]

    def step(self):
        for stream in self.streams.values():
            if not stream.done:
                stream.tokens.append(stream.next)
                stream.next += 1
                stream.done = stream.next == stream.n
                stream.ready.set()

    async def abort(self, request_id):
        return False

    def load_metrics(self):
        return [LoadMetrics(0, 0, 0.0, 0, 0, 0, 100, 0.0)]


@asynccontextmanager
async def pass_host(tmp_path, engine=None):
    """Yield ``(host, engine, endpoint, stop)`` for a host serving ``engine`` (a PassEngine)."""
    engine = engine or PassEngine()
    store = memory_store(tmp_path, "t")
    host = WorkerHost(
        engine,
        engine_name="pass",
        model_name="m",
        store=store,
        settings=WorkerSettings(discovery=DiscoveryConfig(namespace="t"), drain_timeout_s=5.0),
    )
    stop = anyio.Event()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(host.run, stop)
            yield host, engine, host.record.endpoints.request, stop
            stop.set()


def dealer(endpoint, identity=None):
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(endpoint)
    return sock


async def until(condition):
    while not condition():
        await anyio.sleep(0.005)


async def one_message(sock):
    """The next message on ``sock``, decoded, and check that no other one follows it."""
    with anyio.fail_after(5):
        msg = decode_reply(await sock.recv_multipart())
    assert await sock.poll(50) == 0, "the pass's replies came in more than one message"
    return msg


async def test_the_replies_of_one_pass_go_to_each_client_as_one_message(tmp_path):
    async with pass_host(tmp_path) as (host, engine, endpoint, _stop):
        a, b = dealer(endpoint), dealer(endpoint)
        for i in range(8):
            await a.send_multipart(encode(GenerateRequest(f"a{i}", [3])))
        for i in range(3):
            await b.send_multipart(encode(GenerateRequest(f"b{i}", [3])))
        await until(lambda: len(engine.streams) == 11)
        got: dict[str, list] = {}
        for step in range(3):
            engine.step()
            for sock, prefix, n in ((a, "a", 8), (b, "b", 3)):
                msg = await one_message(sock)
                assert isinstance(msg, ReplyBatch) and len(msg.chunks) == n
                assert {c.request_id for c in msg.chunks} == {f"{prefix}{i}" for i in range(n)}
                assert len(msg.finishes) == (n if step == 2 else 0) and msg.errors == []
                for reply in [*msg.chunks, *msg.finishes]:
                    got.setdefault(reply.request_id, []).append(reply)
        # per request: its tokens in order, then exactly one Finish
        for rid, replies in got.items():
            assert [r.token_ids for r in replies[:-1]] == [[0], [1], [2]], rid
            assert isinstance(replies[-1], Finish) and replies[-1].request_id == rid
        assert (host.messages_sent, host.replies_sent) == (6, 11 * 4)
        a.close()
        b.close()


async def test_a_client_that_went_away_or_fails_does_not_stop_the_others(tmp_path, monkeypatch):
    async with pass_host(tmp_path) as (host, engine, endpoint, _stop):
        send_replies = host._server.send_replies

        def failing(identity, replies):
            if identity == b"broken":
                raise RuntimeError("socket trouble")
            return send_replies(identity, replies)

        monkeypatch.setattr(host._server, "send_replies", failing)
        gone, broken, ok = dealer(endpoint), dealer(endpoint, b"broken"), dealer(endpoint)
        await gone.send_multipart(encode(GenerateRequest("gone", [2])))
        await broken.send_multipart(encode(GenerateRequest("broken", [2])))
        await ok.send_multipart(encode(GenerateRequest("ok", [2])))
        await until(lambda: len(engine.streams) == 3)
        gone.close()
        engine.step()
        assert await one_message(ok) == TokenChunk("ok", [0])
        engine.step()
        last = await one_message(ok)
        assert isinstance(last, ReplyBatch)
        assert (last.chunks, [f.request_id for f in last.finishes]) == ([TokenChunk("ok", [1])], ["ok"])
        with anyio.fail_after(5):
            await until(lambda: not engine.streams)
        broken.close()
        ok.close()


async def test_draining_after_deregistration_delivers_every_batch(tmp_path):
    async with pass_host(tmp_path) as (host, engine, endpoint, stop), WorkerClient(endpoint) as client:
        results: dict[str, list] = {}

        async def consume(rid):
            results[rid] = [b async for b in client.generate_batches(GenerateRequest(rid, [4]))]

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(consume, f"r{i}")
            await until(lambda: len(engine.streams) == 5)
            stop.set()
            while await host.store.list():  # gone from discovery, then the passes go on
                await anyio.sleep(0.01)
            for sent in range(1, 5):
                engine.step()
                await until(lambda sent=sent: host.messages_sent == sent)
        assert len(results) == 5
        for batches in results.values():
            items = [item for batch in batches for item in batch]
            assert [i.token_ids for i in items[:-1]] == [[0], [1], [2], [3]]
            assert isinstance(items[-1], Finish)
        assert client.messages_received == host.messages_sent == 4


async def test_mocker_passes_reach_a_client_in_batches(tmp_path):
    from dyn.core.model import load_model_info
    from dyn.plugins.mocker.config import MockerConfig
    from dyn.plugins.mocker.engine import MockerEngine

    cfg = MockerConfig(block_size=16, num_gpu_blocks=512, speedup_ratio=1e6)
    engine = MockerEngine(cfg, load_model_info(None, None))
    async with pass_host(tmp_path, engine) as (host, _engine, endpoint, _stop):
        async with WorkerClient(endpoint) as client:
            counts: dict[str, int] = {}

            async def consume(i):
                req = GenerateRequest(
                    f"m{i}",
                    list(range(100 + i, 140 + i)),
                    SamplingParams(seed=i),
                    StopConditions(max_tokens=16, ignore_eos=True),
                )
                items = [item async for batch in client.generate_batches(req) for item in batch]
                assert isinstance(items[-1], Finish) and items[-1].usage.completion_tokens == 16
                assert all(isinstance(item, TokenChunk) for item in items[:-1])
                counts[req.request_id] = sum(len(item.token_ids) for item in items[:-1])

            async with anyio.create_task_group() as tg:
                for i in range(32):
                    tg.start_soon(consume, i)
        assert counts == {f"m{i}": 16 for i in range(32)}
        assert client.messages_received == host.messages_sent
        # 32 requests x (16 tokens + Finish): many replies per message
        assert host.replies_sent >= 32 * 2 and host.messages_sent * 4 <= host.replies_sent


# --------------------------------------------------------------------------- malformed floods


async def test_a_flood_of_malformed_frames_is_answered_counted_and_never_blocks_the_loop(tmp_path, caplog):
    """Issue 16: 200k malformed frames made the worker log one warning each and starve its
    discovery heartbeat. Each frame is still answered, but logged at most once per interval,
    and the receive loop yields between messages (already queued ones included)."""
    flood = 20_000
    store = memory_store(tmp_path, "t")
    host = WorkerHost(
        ScriptedEngine(),
        engine_name="scripted",
        model_name="m",
        store=store,
        settings=WorkerSettings(discovery=DiscoveryConfig(namespace="t")),
    )
    stop = anyio.Event()
    gaps: list[float] = []

    async def ticker(done: anyio.Event) -> None:
        last = anyio.current_time()
        while not done.is_set():
            await anyio.sleep(0.001)
            now = anyio.current_time()
            gaps.append(now - last)
            last = now

    with caplog.at_level(logging.WARNING, "dyn.core.worker.host"), anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await tg.start(host.run, stop)
            raw = zmq.Context.instance().socket(zmq.DEALER)
            raw.linger = 0
            raw.sndhwm = raw.rcvhwm = 0
            raw.connect(host.record.endpoints.request)
            for i in range(flood):  # all queued at the worker before it reads the first
                raw.send_multipart([b"G", b"\xc1"] if i % 2 else [b"junk"])
            done = anyio.Event()
            tg.start_soon(ticker, done)
            answered = 0
            while answered < flood:
                while not raw.poll(0):
                    await anyio.sleep(0.001)
                reply = decode_reply(raw.recv_multipart())
                answered += len(reply.errors) if isinstance(reply, ReplyBatch) else 1
            done.set()
            async with WorkerClient(host.record.endpoints.request) as client:
                out = [m async for m in client.generate(GenerateRequest("after", [2]))]
            assert isinstance(out[-1], Finish)
            raw.close()
            stop.set()
    assert host.frames_rejected == flood
    warnings = [r.getMessage() for r in caplog.records if r.name == "dyn.core.worker.host"]
    assert len(warnings) <= 2 and "rejected a malformed request frame" in warnings[0]
    assert max(gaps) < 0.5, max(gaps)


class MetricsEngine(ScriptedEngine):
    """Keeps metrics of its own, in the Prometheus text format."""

    def prometheus_text(self):
        return b"# TYPE engine_sessions gauge\nengine_sessions 2.0\n"


@pytest.mark.parametrize("engine", [ScriptedEngine, MetricsEngine])
async def test_the_system_port_serves_the_engines_metrics_and_probes(tmp_path, engine, caplog):
    import httpx

    caplog.set_level(logging.INFO, logger="dyn.core.worker.host")
    store = memory_store(tmp_path, "t")
    settings = WorkerSettings(discovery=DiscoveryConfig(namespace="t"), system_port=0)
    host = WorkerHost(engine(), engine_name="e", model_name="m", store=store, settings=settings)
    stop = anyio.Event()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(host.run, stop)
            (line,) = [r.getMessage() for r in caplog.records if "serving on" in r.getMessage()]
            url = line.rpartition("metrics at ")[2]
            async with httpx.AsyncClient(base_url=url, timeout=5) as http:
                metrics = await http.get("/metrics")
                assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
                assert ("engine_sessions 2.0" in metrics.text) == (engine is MetricsEngine)
                assert (await http.get("/live")).json() == {"status": "live"}
                health = (await http.get("/health")).json()
                assert health == {"status": "ready", "instance_id": host.instance_id}
                missing = await http.get("/nope")
                assert missing.status_code == 404 and "/metrics, /health and /live" in missing.json()["error"]
                assert (await http.post("/metrics")).status_code == 405
            stop.set()
    with pytest.raises(httpx.ConnectError):  # the port closed with the worker
        async with httpx.AsyncClient(timeout=2) as http:
            await http.get(url + "/live")
