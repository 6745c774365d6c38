"""WorkerHost contracts, with a scripted engine behind a real request plane and file discovery."""

from contextlib import asynccontextmanager

import anyio
import pytest

from dyn.core.discovery.file_store import FileDiscoveryStore
from dyn.core.engine import EngineError, EngineInfo
from dyn.core.messages import Finish, GenerateRequest, LoadMetrics, TokenChunk, Usage
from dyn.core.transport.request_plane import RemoteError, WorkerClient
from dyn.core.worker.host import WorkerHost
from dyn.core.worker.settings import WorkerSettings

pytestmark = pytest.mark.anyio


class ScriptedEngine:
    """Prompt [n] streams n tokens 50 ms apart; [-1] raises a bug; [-2] raises an EngineError;
    [-3] never finishes."""

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
        for i in range(n):
            await anyio.sleep(0.05)
            yield TokenChunk(request.request_id, [i])
        yield Finish(request.request_id, "length", Usage(1, n))

    async def abort(self, request_id):
        self.aborted.append(request_id)
        return True

    def load_metrics(self):
        return [LoadMetrics(0, 0, 0.0, 0, 0, 0, 100, 0.0)]


@asynccontextmanager
async def running_host(tmp_path, drain_timeout_s=5.0):
    """Yield ``(store, record, client, stop, task_group)`` for a host serving a ScriptedEngine."""
    store = FileDiscoveryStore(tmp_path, "t")
    host = WorkerHost(ScriptedEngine(), engine_name="scripted", model_name="m", store=store,
                      settings=WorkerSettings(namespace="t", drain_timeout_s=drain_timeout_s))
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
