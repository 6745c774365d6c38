"""The mocker's simulated LoRA adapters (``--lora-modules``, ``--max-loras``,
``--lora-load-time-ms``): what a vLLM user sees of adapters (vLLM's ``--lora-modules`` /
``--max-loras`` in ``vllm/engine/arg_utils.py``; a request for an adapter it does not serve is
refused), simulated without weights."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

import anyio
import pytest

from dyn.core.engine import EngineError
from dyn.core.kv.events import BlockStored
from dyn.core.kv.hashing import block_hashes
from dyn.core.messages import Finish, GenerateRequest, StopConditions
from dyn.core.model import load_model_info
from dyn.core.model.lora import LoraModule
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.engine import MockerEngine
from dyn.plugins.mocker.loras import SimulatedLoras

pytestmark = pytest.mark.anyio

SQL, CHAT = LoraModule("sql", "/adapters/sql"), LoraModule("chat", "/adapters/chat")


async def test_an_adapter_loads_once_then_is_resident():
    loras = SimulatedLoras([SQL, CHAT], max_loras=2, load_time_s=0.2)
    start = time.monotonic()
    async with anyio.create_task_group() as tg:  # two requests for a cold adapter share one load
        tg.start_soon(loras.ensure, "sql")
        tg.start_soon(loras.ensure, "sql")
    assert 0.2 <= time.monotonic() - start < 0.35 and loras.loads == 1
    start = time.monotonic()
    await loras.ensure("sql")
    await loras.ensure(None)  # the base model needs no adapter
    assert time.monotonic() - start < 0.1 and loras.loads == 1


async def test_beyond_max_loras_the_least_recently_used_is_evicted_and_loads_again():
    loras = SimulatedLoras([SQL, CHAT], max_loras=1, load_time_s=0.0)
    for name in ("sql", "sql", "chat", "sql"):
        await loras.ensure(name)
    assert loras.loads == 3


async def test_an_adapter_the_worker_does_not_serve_is_refused_naming_the_served_ones():
    with pytest.raises(EngineError, match="no LoRA adapter 'legal'.*sql, chat") as caught:
        await SimulatedLoras([SQL, CHAT], 1, 0.0).ensure("legal")
    assert caught.value.code == "bad_request"


def test_flags_are_checked():
    with pytest.raises(ValueError, match="--max-loras"):
        MockerConfig(max_loras=0).validate()
    with pytest.raises(ValueError, match="dyn-tiny.*served model's name"):
        MockerEngine(MockerConfig(lora_modules=("dyn-tiny=/x",)), load_model_info(None, None))


@asynccontextmanager
async def running(config: MockerConfig, events: list):
    engine = MockerEngine(
        config, load_model_info(None, None), event_sink=lambda batch, _rank: events.extend(batch)
    )
    async with anyio.create_task_group() as tg:
        await tg.start(engine.run)
        yield engine
        tg.cancel_scope.cancel()


async def _run(engine: MockerEngine, rid: str, tokens: list[int], lora: str | None) -> Finish:
    request = GenerateRequest(rid, tokens, stop=StopConditions(max_tokens=2, ignore_eos=True), lora_name=lora)
    async for out in engine.generate(request):
        if isinstance(out, Finish):
            return out
    raise AssertionError("no finish")


async def test_each_adapter_has_its_own_prefix_cache_and_block_hashes():
    events: list = []
    config = MockerConfig(lora_modules=("sql=/adapters/sql",), speedup_ratio=1000, block_size=16)
    tokens = list(range(100, 164))  # four blocks
    async with running(config, events) as engine:
        assert engine.info.loras == {"sql": "/adapters/sql"}
        assert (await _run(engine, "a", tokens, "sql")).usage.cached_tokens == 0
        assert (await _run(engine, "b", tokens, None)).usage.cached_tokens == 0  # the base model: not cached
        assert (await _run(engine, "c", tokens, "sql")).usage.cached_tokens == 48  # the adapter's own
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert {e.lora_name for e in stored} == {"sql", None}
    sql_hashes = [h for e in stored if e.lora_name == "sql" for h in e.block_hashes]
    assert block_hashes(tokens, 16, "sql")[0] != block_hashes(tokens, 16)[0]
    assert len(sql_hashes) == 4
