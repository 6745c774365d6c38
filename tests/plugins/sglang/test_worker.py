"""The whole adapter through the request plane: a real WorkerHost (file discovery, loopback ZMQ)
around SglangEngine and the fake SGLang, driven by a real WorkerClient."""

import functools
import os
import signal

import anyio
import pytest

from dyn.core.config import DiscoveryConfig
from dyn.core.errors import ConfigError
from dyn.core.messages import (
    CancelRequest,
    ControlReply,
    GenerateRequest,
    PinPrefixRequest,
    SessionControlRequest,
    StopConditions,
    TokenChunk,
)
from dyn.core.model import TINY_MODEL_DIR, TINY_MODEL_NAME
from dyn.core.transport.request_plane import RemoteError, WorkerClient
from dyn.core.worker.runner import run_hosts
from dyn.core.worker.settings import WorkerSettings
from dyn.plugins.sglang import ENGINE, build_host
from dyn.plugins.sglang.config import SglangConfig
from tests.memory_discovery import memory_hub

pytestmark = pytest.mark.anyio


async def test_a_worker_serves_sglang_through_the_request_plane(fake, tmp_path):
    fake.script = lambda context: [50, 51, 52, 2]
    hub = memory_hub(tmp_path)  # held: a hub lives while it is referenced
    settings = WorkerSettings(
        discovery=DiscoveryConfig(namespace="t", backend="memory", dir=hub.name), drain_timeout_s=2.0
    )
    host = build_host(
        SglangConfig(page_size=16, max_prefill_tokens=4096, enable_streaming_session=True),
        settings,
        model_path=str(TINY_MODEL_DIR),
        extra_args=["--quantization", "fp8"],
    )
    stop = anyio.Event()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(host.run, stop)
            (record,) = await host.store.list()
            assert (
                record.engine,
                record.model_name,
                record.block_size,
                record.total_kv_blocks,
                record.max_num_batched_tokens,
            ) == ("sglang", TINY_MODEL_NAME, 16, 256, 4096)
            assert record.priority_order == "higher_first" and record.features == ["streaming_sessions"]
            assert record.endpoints.kv_events.startswith("tcp://127.0.0.1:")
            assert record.endpoints.kv_replay.startswith("tcp://127.0.0.1:")
            assert fake.engine.server_args.quantization == "fp8"
            async with WorkerClient(record.endpoints.request) as client:
                out = [m async for m in client.generate(GenerateRequest("g1", [3, 4, 5]))]
                assert [m.token_ids for m in out[:-1]] == [[50], [51], [52]]
                assert (out[-1].reason, out[-1].stop_token_id, out[-1].usage.completion_tokens) == (
                    "stop",
                    2,
                    4,
                )

                opened = await client.call(SessionControlRequest("o1", "open", "s1", 60.0))
                assert opened == ControlReply("o1", 1)
                turn = [m async for m in client.generate(GenerateRequest("g2", [3, 4], session_id="s1"))]
                assert turn[-1].reason == "stop"
                assert fake.engine.generate_calls[-1]["session_params"] == {"id": "s1"}
                assert (await client.call(SessionControlRequest("c1", "close", "s1"))).value == 1
                with pytest.raises(RemoteError) as unsupported:
                    await client.call(PinPrefixRequest("p1", [1, 2, 3], 60.0))
                assert unsupported.value.code == "unsupported"

                fake.script = lambda context: [60] * 1000
                fake.hold, fake.hold_after = anyio.Event(), 2  # two tokens, then wait for the cancel
                got = []
                async for m in client.generate(
                    GenerateRequest("g3", [1], stop=StopConditions(max_tokens=1000))
                ):
                    got.append(m)
                    if len(got) == 2:
                        client.send(CancelRequest("g3"))
                assert got[:2] == [TokenChunk("g3", [60]), TokenChunk("g3", [60])]
                assert got[-1].reason == "cancelled" and got[-1].usage.completion_tokens == 2
                assert fake.engine.generate_calls[-1]["rid"] in fake.engine.tokenizer_manager.aborts
            stop.set()
    assert await host.store.list() == [] and fake.engine.shutdowns == 1


async def test_sigterm_deregisters_and_drains_through_dyn_not_sglangs_own_handler(fake, tmp_path, caplog):
    """SGLang takes SIGTERM on the loop its output loop starts on (0.5.23: it drains its own
    requests and kills its processes while the worker stays in discovery); the worker runner takes
    it back once the engine is up, so a SIGTERM stops the worker as it stops any engine's."""
    hub = memory_hub(tmp_path)  # held: a hub lives while it is referenced
    settings = WorkerSettings(
        discovery=DiscoveryConfig(namespace="t", backend="memory", dir=hub.name), drain_timeout_s=2.0
    )
    host = build_host(SglangConfig(page_size=16), settings, model_path=str(TINY_MODEL_DIR))
    caplog.set_level("INFO")
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(run_hosts, [host]))
            assert fake.engine.tokenizer_manager.event_loop is not None  # SGLang's handler was set
            os.kill(os.getpid(), signal.SIGTERM)
    assert fake.engine.tokenizer_manager.sigterms == []
    messages = [r.getMessage() for r in caplog.records]
    assert "SIGTERM received; stopping 1 worker(s)" in messages
    assert any(m.startswith(f"worker {host.instance_id} left discovery; draining") for m in messages)


def test_build_host_refuses_what_it_can_check_before_sglang_starts(fake, tmp_path):
    settings = WorkerSettings(discovery=DiscoveryConfig(namespace="t", dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="needs --model-path"):
        build_host(SglangConfig(), settings, model_path=None)
    with pytest.raises(ConfigError, match="--page-size must be at least 1"):
        build_host(SglangConfig(page_size=0), settings, model_path=str(TINY_MODEL_DIR))
    with pytest.raises(ConfigError, match="no such directory"):
        build_host(SglangConfig(), settings, model_path=str(tmp_path / "missing"))
    assert fake.engines == []  # nothing started
    assert ENGINE.name == "sglang" and callable(ENGINE.serve)
