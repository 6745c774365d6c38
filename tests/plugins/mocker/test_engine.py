"""MockerEngine: the scheduler driven in real time behind the Engine protocol."""

import math
from contextlib import aclosing

import anyio
import msgspec
import pytest

from dyn.core.engine import Engine, EngineError
from dyn.core.kv.events import BlockStored
from dyn.core.messages import (
    Finish,
    GenerateRequest,
    OutputConstraint,
    SamplingParams,
    StopConditions,
    TokenChunk,
)
from dyn.core.model import load_model_info
from dyn.plugins.mocker.config import MockerConfig, ReasoningConfig
from dyn.plugins.mocker.engine import CATCH_UP_S, MockerEngine, next_deadline

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
            out = [
                m
                async for m in eng.generate(
                    GenerateRequest(
                        "a", prompt, SamplingParams(seed=3), StopConditions(max_tokens=12, ignore_eos=True)
                    )
                )
            ]
            again = [
                m
                async for m in eng.generate(
                    GenerateRequest(
                        "b", prompt, SamplingParams(seed=3), StopConditions(max_tokens=12, ignore_eos=True)
                    )
                )
            ]
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

            async with aclosing(
                eng.generate(
                    GenerateRequest("closed", [1] * 20, stop=StopConditions(max_tokens=5000, ignore_eos=True))
                )
            ) as stream:
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


async def test_start_now_admits_at_once_what_needs_no_waiting_and_defers_the_rest():
    """``PushingEngine.start_now``: a plain request is queued at once (the worker host then needs
    no task for it) and its outputs reach the sink; one with a LoRA adapter or an output
    constraint is left to ``start`` (False, nothing queued); a refused one raises as ``start`` does."""
    eng, _ = engine(lora_modules=("ad=/nowhere",))
    got: list = []
    plain = GenerateRequest("a", list(range(10, 50)), stop=StopConditions(max_tokens=5, ignore_eos=True))
    assert eng.start_now(plain, got.append) is True
    assert eng.start_now(msgspec.structs.replace(plain, request_id="l", lora_name="ad"), got.append) is False
    constrained = msgspec.structs.replace(plain, request_id="c", constraint=OutputConstraint("json_object"))
    assert eng.start_now(constrained, got.append) is False
    with pytest.raises(EngineError) as exc:
        eng.start_now(plain, got.append)
    assert exc.value.code == "duplicate_request"
    with pytest.raises(EngineError) as exc:
        eng.start_now(GenerateRequest("e", []), got.append)
    assert exc.value.code == "bad_request"
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            while not got or not isinstance(got[-1], Finish):
                await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
    assert sum(len(m.token_ids) for m in got[:-1]) == 5 and got[-1].request_id == "a"


def sglang_engine(num_gpu_blocks=64):
    cfg = MockerConfig(
        engine_type="sglang",
        enable_streaming_session=True,
        block_size=16,
        num_gpu_blocks=num_gpu_blocks,
        speedup_ratio=1000,
    )
    return MockerEngine(cfg, MODEL)


@pytest.mark.parametrize(
    "overrides,order,features",
    [
        ({}, "lower_first", ["pin_prefix"]),
        ({"enable_prefix_caching": False}, "lower_first", []),
        ({"engine_type": "sglang"}, "higher_first", ["pin_prefix"]),
        (
            {
                "engine_type": "sglang",
                "schedule_low_priority_values_first": True,
                "enable_streaming_session": True,
            },
            "lower_first",
            ["pin_prefix", "streaming_sessions"],
        ),
    ],
)
def test_engine_info_advertises_priority_order_and_features(overrides, order, features):
    eng, _ = engine(**overrides)
    assert eng.info.priority_order == order and eng.info.features == features


async def test_session_calls_turns_and_load_metrics():
    eng = sglang_engine()
    prompt = list(range(10, 50))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            assert await eng.open_session("s", 30) and not await eng.open_session("s", 30)
            first = [
                m
                async for m in eng.generate(
                    GenerateRequest(
                        "t1", prompt, stop=StopConditions(max_tokens=8, ignore_eos=True), session_id="s"
                    )
                )
            ]
            out = [t for m in first[:-1] for t in m.token_ids]
            metrics = eng.load_metrics()[0]
            assert (metrics.num_streaming_sessions, metrics.streaming_session_held_tokens) == (1, 47)
            second = [
                m
                async for m in eng.generate(
                    GenerateRequest(
                        "t2",
                        prompt + out + [1, 2, 3],
                        stop=StopConditions(max_tokens=2, ignore_eos=True),
                        session_id="s",
                    )
                )
            ]
            assert second[-1].usage.cached_tokens == 47
            assert await eng.close_session("s") and not await eng.close_session("s")
            metrics = eng.load_metrics()[0]
            assert (
                metrics.num_streaming_sessions,
                metrics.streaming_session_held_tokens,
                metrics.active_kv_blocks,
            ) == (0, 0, 0)
            assert await eng.pin_prefix(prompt, 60) == 2
            with pytest.raises(EngineError) as exc:
                await eng.pin_prefix(prompt, 0)
            assert exc.value.code == "bad_request"
            tg.cancel_scope.cancel()


async def test_session_calls_are_unsupported_without_the_flag():
    eng, _ = engine()
    with pytest.raises(EngineError) as exc:
        await eng.open_session("s", 10)
    assert exc.value.code == "unsupported" and "--enable-streaming-session" in str(exc.value)


async def test_engine_reaps_idle_sessions_without_traffic():
    eng = sglang_engine()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            await eng.open_session("s", 0.05)
            [
                m
                async for m in eng.generate(
                    GenerateRequest(
                        "t1",
                        list(range(40)),
                        stop=StopConditions(max_tokens=2, ignore_eos=True),
                        session_id="s",
                    )
                )
            ]
            assert eng.load_metrics()[0].num_streaming_sessions == 1
            while eng.load_metrics()[0].num_streaming_sessions:  # the reaper runs every 0.5 s
                await anyio.sleep(0.05)
            assert eng.load_metrics()[0].active_kv_blocks == 0
            tg.cancel_scope.cancel()


async def test_a_request_blocked_by_session_kv_waits_without_spinning_and_runs_after_close():
    eng = sglang_engine(num_gpu_blocks=8)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            await eng.open_session("s", 600)
            [
                m
                async for m in eng.generate(
                    GenerateRequest(
                        "hold",
                        list(range(100)),
                        stop=StopConditions(max_tokens=1, ignore_eos=True),
                        session_id="s",
                    )
                )
            ]
            results = []

            async def blocked():
                results.extend(
                    [
                        m
                        async for m in eng.generate(
                            GenerateRequest(
                                "big",
                                list(range(500, 600)),
                                stop=StopConditions(max_tokens=1, ignore_eos=True),
                            )
                        )
                    ]
                )

            tg.start_soon(blocked)
            await anyio.sleep(0.3)
            passes = eng.passes
            await anyio.sleep(0.3)
            assert not results and eng.passes - passes < 20  # waits instead of spinning
            assert await eng.close_session("s")
            while not results:
                await anyio.sleep(0.01)
            assert isinstance(results[-1], Finish) and results[-1].reason == "length"
            tg.cancel_scope.cancel()


async def test_generate_request_max_thinking_tokens_reaches_the_scheduler():
    eng, _ = engine(
        reasoning=ReasoningConfig(start_thinking_token_id=7, end_thinking_token_id=8, thinking_ratio=0.5)
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            out = [
                m
                async for m in eng.generate(
                    GenerateRequest(
                        "r",
                        list(range(20)),
                        stop=StopConditions(max_tokens=20, ignore_eos=True),
                        max_thinking_tokens=1,
                    )
                )
            ]
            tokens = [t for m in out[:-1] for t in m.token_ids]
            assert tokens[0] == 7 and tokens[2] == 8 and len(tokens) == 20
            tg.cancel_scope.cancel()


def _paced(passes: int, pass_s: float, tick_s: float, deadline_of) -> float:
    """When ``passes`` back-to-back passes of ``pass_s`` end under a timer that wakes only on
    ``tick_s`` boundaries (epoll's millisecond), each sleep lasting until its deadline's tick."""
    now = deadline = 0.0
    for _ in range(passes):
        deadline = deadline_of(deadline, now, pass_s)
        if deadline > now:
            now = math.ceil(deadline / tick_s - 1e-9) * tick_s
    return now


def test_sub_millisecond_passes_keep_the_models_pace_under_a_millisecond_timer():
    # 100 decode passes of 0.57 ms (speedup 10) take 57 ms, not one timer tick each (100 ms)
    assert _paced(100, 0.00057, 0.001, next_deadline) == pytest.approx(0.057, abs=0.002)
    # the old rule, restarting every pass from its (late) start, paced one pass per tick
    assert _paced(100, 0.00057, 0.001, lambda d, start, s: max(d, start) + s) == pytest.approx(0.1)


def test_a_loop_far_behind_its_clock_does_not_burst_to_catch_up():
    assert next_deadline(1.0, 1.0005, 0.001) == pytest.approx(1.001)  # a late wake is made up
    assert next_deadline(1.0, 5.0, 0.001) == pytest.approx(5.0 - CATCH_UP_S + 0.001)
