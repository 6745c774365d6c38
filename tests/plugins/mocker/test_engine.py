"""MockerEngine: the scheduler driven in real time behind the Engine protocol."""

from contextlib import aclosing

import anyio
import pytest

from dyn.core.engine import Engine, EngineError
from dyn.core.kv.events import BlockStored
from dyn.core.messages import Finish, GenerateRequest, SamplingParams, StopConditions, TokenChunk
from dyn.core.model import load_model_info
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.engine import MockerEngine

pytestmark = pytest.mark.anyio
MODEL = load_model_info(None, None)


def engine(**overrides):
    events = []
    cfg = MockerConfig(block_size=16, num_gpu_blocks=64, speedup_ratio=1000, **overrides)
    return MockerEngine(cfg, MODEL, lambda evs, dp: events.append((dp, evs))), events


async def test_streams_tokens_then_finish_and_publishes_events():
    eng, events = engine()
    assert isinstance(eng, Engine)
    prompt = list(range(10, 10 + 40))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            out = [m async for m in eng.generate(GenerateRequest(
                "a", prompt, SamplingParams(seed=3), StopConditions(max_tokens=12, ignore_eos=True)))]
            again = [m async for m in eng.generate(GenerateRequest(
                "b", prompt, SamplingParams(seed=3), StopConditions(max_tokens=12, ignore_eos=True)))]
            tg.cancel_scope.cancel()
    tokens = [t for m in out[:-1] for t in m.token_ids]
    finish = out[-1]
    assert len(tokens) == 12 and all(isinstance(m, TokenChunk) for m in out[:-1])
    assert isinstance(finish, Finish) and finish.reason == "length" and finish.usage.cached_tokens == 0
    assert finish.timing.prefill_ms >= 0 and finish.timing.decode_ms >= 0
    assert [t for m in again[:-1] for t in m.token_ids] == tokens  # same seed, same tokens
    assert again[-1].usage.cached_tokens == 32  # two full 16-token blocks from the first request
    stored = [e for _, evs in events for e in evs if isinstance(e, BlockStored)]
    assert stored and all(dp == 0 for dp, _ in events)


async def test_abort_and_early_close_end_the_request():
    eng, _ = engine()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            got = []
            req = GenerateRequest("long", [1] * 20, stop=StopConditions(max_tokens=5000, ignore_eos=True))
            async with aclosing(eng.generate(req)) as stream:
                async for m in stream:
                    got.append(m)
                    if len(got) == 1:
                        assert await eng.abort("long")
            assert isinstance(got[-1], Finish) and got[-1].reason == "cancelled"
            assert got[-1].usage.prompt_tokens == 20
            assert not await eng.abort("long")

            async with aclosing(eng.generate(GenerateRequest("closed", [1] * 20,
                                stop=StopConditions(max_tokens=5000, ignore_eos=True)))) as stream:
                async for _ in stream:
                    break
            await anyio.sleep(0.05)
            assert eng.load_metrics()[0].num_running == 0
            tg.cancel_scope.cancel()


async def test_bad_requests_raise_engine_error():
    eng, _ = engine()
    with pytest.raises(EngineError) as exc:
        async for _ in eng.generate(GenerateRequest("x", [])):
            pass
    assert exc.value.code == "bad_request"
    with pytest.raises(EngineError, match="no room"):
        async for _ in eng.generate(GenerateRequest("y", [1] * MODEL.context_length)):
            pass
