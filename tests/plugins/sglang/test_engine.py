"""SglangEngine against the fake SGLang: start-up, info, generation, aborts, sessions, metrics."""

import json
import re
import sys
from contextlib import asynccontextmanager

import anyio
import pytest

from dyn.core.engine import FEATURE_STREAMING_SESSIONS, EngineError, EngineStartError
from dyn.core.messages import Finish, GenerateRequest, SamplingParams, StopConditions, TokenChunk
from dyn.plugins.sglang.config import SglangConfig
from dyn.plugins.sglang.engine import SglangEngine

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def started(config=SglangConfig(), **kwargs):
    engine = SglangEngine(config, model_path="/models/m", **kwargs)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(engine.run)
            yield engine
            tg.cancel_scope.cancel()


async def collect(engine, request):
    return [m async for m in engine.generate(request)]


# --------------------------------------------------------------------------- start-up and info


async def test_flags_reach_sglang_and_dyn_sets_its_own_settings(fake):
    config = SglangConfig(
        tp_size=2,
        mem_fraction_static=0.8,
        max_running_requests=64,
        max_prefill_tokens=8192,
        chunked_prefill_size=4096,
        page_size=16,
        context_length=2048,
        dtype="bfloat16",
        enable_priority_scheduling=True,
        schedule_low_priority_values_first=True,
        radix_eviction_policy="priority",
        enable_streaming_session=True,
        extra_args=["--quantization", "fp8"],
    )
    async with started(config):
        server_args = fake.engine.server_args
        assert (
            server_args.model_path,
            server_args.tp_size,
            server_args.mem_fraction_static,
            server_args.max_running_requests,
            server_args.max_prefill_tokens,
            server_args.chunked_prefill_size,
            server_args.page_size,
            server_args.context_length,
            server_args.dtype,
            server_args.quantization,
        ) == ("/models/m", 2, 0.8, 64, 8192, 4096, 16, 2048, "bfloat16", "fp8")
        assert server_args.enable_priority_scheduling and server_args.schedule_low_priority_values_first
        assert server_args.radix_eviction_policy == "priority" and server_args.enable_streaming_session
        assert not server_args.skip_tokenizer_init and server_args.incremental_streaming_output
        kv = json.loads(server_args.kv_events_config)
        assert kv["publisher"] == "zmq" and kv["bind"] is True and kv["topic"] == "kv-events"
        assert kv["endpoint"].startswith("tcp://127.0.0.1:")


async def test_info_registers_what_sglang_resolved(fake):
    fake.max_total_num_tokens = 10_000
    async with started(
        SglangConfig(
            page_size=16,
            max_prefill_tokens=8192,
            enable_streaming_session=True,
            schedule_low_priority_values_first=True,
        )
    ) as engine:
        info = engine.info
        assert (info.block_size, info.total_kv_blocks, info.max_num_batched_tokens, info.context_length) == (
            16,
            625,
            8192,
            4096,
        )
        assert info.priority_order == "lower_first" and info.features == [FEATURE_STREAMING_SESSIONS]
        kv = json.loads(fake.engine.server_args.kv_events_config)
        assert (info.kv_events_endpoint, info.kv_replay_endpoint, info.kv_events_topic) == (
            kv["endpoint"],
            kv["replay_endpoint"],
            "kv-events",
        )


async def test_without_max_prefill_tokens_the_whole_kv_pool_is_registered(fake, caplog):
    # seed 001: Dynamo registers max_total_num_tokens when --max-prefill-tokens is not given
    fake.max_total_num_tokens = 10_000
    async with started() as engine:
        info = engine.info
        assert (info.block_size, info.total_kv_blocks, info.max_num_batched_tokens) == (1, 10_000, 10_000)
        assert info.priority_order == "higher_first" and info.features == []
    assert "--max-prefill-tokens is not set" in caplog.text
    # passed through to SGLang it counts as given too
    async with started(SglangConfig(extra_args=["--max-prefill-tokens", "2048"])) as engine:
        assert engine.info.max_num_batched_tokens == 2048


async def test_an_older_sglang_without_kv_bind_publishes_on_the_wildcard(fake):
    fake.module.KVEventsConfig.model_fields = {"publisher": None, "endpoint": None}
    async with started(host="127.0.0.1") as engine:
        kv = json.loads(fake.engine.server_args.kv_events_config)
        assert kv["endpoint"].startswith("tcp://*:") and "bind" not in kv
        assert engine.info.kv_events_endpoint == kv["endpoint"].replace("*", "127.0.0.1")


async def test_not_installed_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)
    engine = SglangEngine(SglangConfig(), model_path="/models/m")
    with pytest.raises(EngineStartError) as missing:
        await engine.run()
    assert "SGLang is not installed" in str(missing.value)
    assert "pip install 'dyn[sglang]'" in str(missing.value)


async def test_start_failures_are_engine_start_errors_with_a_sentence(fake, monkeypatch):
    fake.fail_start = "CUDA error: no CUDA-capable device is detected"
    with pytest.raises(EngineStartError) as failed:
        await SglangEngine(SglangConfig(), model_path="/models/m").run()
    assert "SGLang could not start: RuntimeError: CUDA error: no CUDA-capable device" in str(failed.value)
    assert "nvidia-smi" in str(failed.value)
    fake.fail_start = None
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")  # --device cpu sets it; monkeypatch undoes it
    for extra, message in (
        (["--dp-size", "2"], "--dp-size above 1 is not supported"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (
            ["--device", "cpu", "--enable-hierarchical-cache"],
            "--enable-hierarchical-cache needs a CUDA or ROCm GPU",
        ),
    ):
        with pytest.raises(EngineStartError) as refused:
            await SglangEngine(SglangConfig(extra_args=extra), model_path="/m").run()
        assert message in str(refused.value)
    assert fake.engines == []


async def test_the_engine_is_shut_down_when_the_worker_stops(fake):
    async with started():
        assert fake.engine.shutdowns == 0
    assert fake.engine.shutdowns == 1


async def test_a_start_cancelled_while_sglang_loads_still_shuts_it_down(fake):
    fake.start_s = 0.3
    with anyio.move_on_after(0.05):
        await SglangEngine(SglangConfig(), model_path="/models/m").run()
    assert fake.engine.shutdowns == 1


# --------------------------------------------------------------------------- generation


async def test_a_request_streams_its_tokens_and_finishes_on_the_stop_token(fake):
    fake.script = lambda context: [11, 12, 13, 2, 14]
    fake.cached_tokens = 2
    request = GenerateRequest(
        "req-1", [5, 6, 7], SamplingParams(temperature=0.3, seed=9), StopConditions(max_tokens=10), priority=7
    )
    async with started() as engine:
        out = await collect(engine, request)
    assert out[:-1] == [TokenChunk("req-1", [11]), TokenChunk("req-1", [12]), TokenChunk("req-1", [13])]
    finish = out[-1]
    assert (finish.reason, finish.stop_token_id) == ("stop", 2)
    assert (finish.usage.prompt_tokens, finish.usage.completion_tokens, finish.usage.cached_tokens) == (
        3,
        4,
        2,
    )
    (call,) = fake.engine.generate_calls
    assert call["input_ids"] == [5, 6, 7] and call["stream"] is True
    assert call["priority"] is None  # SGLang's defaults make no use of it (see the priority tests)
    assert call["sampling_params"] == {"max_new_tokens": 10, "temperature": 0.3, "sampling_seed": 9}
    assert re.fullmatch(r"[0-9a-f]{32}", call["rid"])  # SGLang aborts by rid prefix: never ours
    assert call["session_params"] is None and call["session_id"] is None


async def test_length_stop_token_ids_and_coalesced_chunks(fake):
    fake.script = lambda context: [20, 21, 22, 23, 24, 25, 26]
    fake.tokens_per_chunk = 3
    async with started() as engine:
        out = await collect(engine, GenerateRequest("a", [1], stop=StopConditions(max_tokens=5)))
        assert [m.token_ids for m in out[:-1]] == [[20, 21, 22], [23, 24]]
        assert (out[-1].reason, out[-1].stop_token_id, out[-1].usage.completion_tokens) == ("length", None, 5)
        out = await collect(engine, GenerateRequest("b", [1], stop=StopConditions(stop_token_ids=[23])))
        assert [m.token_ids for m in out[:-1]] == [[20, 21, 22]]
        assert (out[-1].reason, out[-1].stop_token_id) == ("stop", 23)


async def test_cumulative_output_is_handled_too(fake):
    # an SGLang that streams cumulative output_ids (incremental_streaming_output off)
    fake.resolved_overrides = {"incremental_streaming_output": False}
    fake.script = lambda context: [30, 31, 32, 2]
    fake.tokens_per_chunk = 2
    async with started() as engine:
        out = await collect(engine, GenerateRequest("c", [1]))
    assert [m.token_ids for m in out[:-1]] == [[30, 31], [32]]
    assert (out[-1].reason, out[-1].stop_token_id) == ("stop", 2)


async def test_sglang_refusals_are_engine_errors(fake):
    async with started() as engine:
        with pytest.raises(EngineError) as empty:
            await collect(engine, GenerateRequest("e", []))
        assert empty.value.code == "bad_request" and "input_ids cannot be empty" in str(empty.value)
        fake.script = lambda context: [40] * 50
        slow = engine.generate(GenerateRequest("dup", [1]))
        await slow.__anext__()
        with pytest.raises(EngineError) as dup:
            await collect(engine, GenerateRequest("dup", [1]))
        assert dup.value.code == "duplicate_request"
        await slow.aclose()


# --------------------------------------------------------------------------- aborts


async def test_abort_ends_the_stream_cancelled_and_aborts_in_sglang(fake):
    fake.hold = anyio.Event()
    async with started() as engine:
        assert not await engine.abort("nobody")
        async with anyio.create_task_group() as tg:
            results = []

            async def run():
                results.extend(await collect(engine, GenerateRequest("x", [1, 2])))

            tg.start_soon(run)
            while not fake.engine.generate_calls:
                await anyio.sleep(0.01)
            assert await engine.abort("x")
            assert not await engine.abort("x")  # already being aborted
        (call,) = fake.engine.generate_calls
        assert call["rid"] in fake.engine.tokenizer_manager.aborts
        (finish,) = results
        assert isinstance(finish, Finish) and finish.reason == "cancelled"
        assert (finish.usage.prompt_tokens, finish.usage.completion_tokens) == (2, 0)
        fake.hold = None
        await collect(engine, GenerateRequest("done", [1]))
        assert not await engine.abort("done")


async def test_an_abort_sglang_never_answers_ends_after_the_grace(fake):
    fake.hold, fake.ignore_aborts = anyio.Event(), True
    async with started(abort_grace_s=0.2) as engine:
        async with anyio.create_task_group() as tg:
            results = []

            async def run():
                results.extend(await collect(engine, GenerateRequest("x", [1])))

            tg.start_soon(run)
            while not fake.engine.generate_calls:
                await anyio.sleep(0.01)
            assert await engine.abort("x")
        assert [m.reason for m in results] == ["cancelled"]
        assert fake.engine.generate_calls[0]["rid"] in fake.engine.tokenizer_manager.released


async def test_closing_the_stream_early_aborts_the_request(fake):
    fake.script = lambda context: [40] * 50
    async with started() as engine:
        stream = engine.generate(GenerateRequest("early", [1]))
        assert await stream.__anext__() == TokenChunk("early", [40])
        await stream.aclose()
        (call,) = fake.engine.generate_calls
        assert call["rid"] in fake.engine.tokenizer_manager.aborts
        assert engine.load_metrics()[0].num_running == 0


# --------------------------------------------------------------------------- streaming sessions


async def test_sessions_are_offered_only_with_enable_streaming_session(fake):
    async with started() as engine:
        with pytest.raises(EngineError) as off:
            await engine.open_session("s", 30.0)
        assert off.value.code == "unsupported" and "--enable-streaming-session" in str(off.value)
        # a request naming a session is then an ordinary one
        await collect(engine, GenerateRequest("r", [1], session_id="s"))
        assert fake.engine.generate_calls[0]["session_params"] is None


async def test_session_open_and_close_use_sglangs_session_api(fake):
    async with started(SglangConfig(enable_streaming_session=True)) as engine:
        assert await engine.open_session("s", 30.0)
        assert not await engine.open_session("s", 60.0)
        assert await engine.open_session("d", 0)
        with pytest.raises(EngineError) as empty:
            await engine.open_session("", 5.0)
        assert empty.value.code == "bad_request"
        assert await engine.close_session("s")
        assert not await engine.close_session("s")
        calls = fake.engine.tokenizer_manager.session_calls
        assert [(kind, vars(obj)) for kind, obj in calls] == [
            ("open", {"capacity_of_str_len": 65536, "session_id": "s", "streaming": True, "timeout": 30.0}),
            ("open", {"capacity_of_str_len": 65536, "session_id": "d", "streaming": True, "timeout": 300.0}),
            ("close", {"session_id": "s"}),
            ("close", {"session_id": "s"}),
        ]


async def test_sessions_stay_below_sglangs_running_slots(fake, caplog):
    """SGLang 0.5.23 keeps a running-request slot per open streaming session (seen live: with
    --max-running-requests 2 and two idle sessions, an ordinary request waited until a session
    timed out), so dyn opens at most max_running_requests - 1."""
    config = SglangConfig(enable_streaming_session=True, max_running_requests=2)
    async with started(config) as engine:
        assert await engine.open_session("a", 30.0)
        assert not await engine.open_session("b", 30.0)
        assert "not opening session b: 1 session(s) are open" in caplog.text
        assert await engine.close_session("a")
        assert await engine.open_session("b", 30.0)
    with caplog.at_level("WARNING"):
        async with started(SglangConfig(enable_streaming_session=True, max_running_requests=1)) as engine:
            assert "no session can be opened here" in caplog.text
            assert not await engine.open_session("a", 30.0)
    fake.max_running_requests = 3  # not given: SGLang's own figure, from its load snapshot
    async with started(SglangConfig(enable_streaming_session=True)) as engine:
        with anyio.fail_after(5):
            while engine._session_slots() is None:
                await anyio.sleep(0.01)
        assert await engine.open_session("a", 30.0) and await engine.open_session("b", 30.0)
        assert not await engine.open_session("c", 30.0)
        calls = engine._require_engine().tokenizer_manager.session_calls
        assert [obj.session_id for kind, obj in calls if kind == "open"] == ["a", "b"]  # c: not asked


async def test_session_turns_send_only_the_new_tokens_and_restart_on_a_mismatch(fake):
    fake.script = lambda context: [len(context), 2]
    async with started(SglangConfig(enable_streaming_session=True)) as engine:
        assert await engine.open_session("s", 30.0)
        first = await collect(engine, GenerateRequest("t1", [1, 2, 3], session_id="s"))
        assert first[0].token_ids == [3] and first[-1].stop_token_id == 2
        second = await collect(engine, GenerateRequest("t2", [1, 2, 3, 3, 2, 8, 9], session_id="s"))
        assert second[0].token_ids == [7]  # SGLang saw the whole context
        assert second[-1].usage.cached_tokens == 5
        tm = fake.engine.tokenizer_manager
        calls = fake.engine.generate_calls
        assert [(c["input_ids"], c["session_params"]) for c in calls] == [
            ([1, 2, 3], {"id": "s"}),
            ([8, 9], {"id": "s"}),
        ]
        # the client re-rendered the reply differently: close, reopen, send it all
        before = len(tm.session_calls)
        third = await collect(engine, GenerateRequest("t3", [1, 2, 3, 4, 8], session_id="s"))
        assert third[0].token_ids == [5]
        assert [kind for kind, _ in tm.session_calls[before:]] == ["close", "open"]
        assert calls[-1]["input_ids"] == [1, 2, 3, 4, 8] and calls[-1]["session_params"] == {"id": "s"}
        metrics = engine.load_metrics()[0]
        assert (metrics.num_streaming_sessions, metrics.streaming_session_held_tokens) == (1, 7)
        # a session that is not open here: an ordinary request
        await collect(engine, GenerateRequest("t4", [1, 2], session_id="other"))
        assert calls[-1]["session_params"] is None and calls[-1]["input_ids"] == [1, 2]


async def test_a_busy_session_serves_its_second_turn_as_an_ordinary_request(fake):
    fake.hold = anyio.Event()
    async with started(SglangConfig(enable_streaming_session=True)) as engine:
        await engine.open_session("s", 30.0)
        async with anyio.create_task_group() as tg:

            async def run(rid):
                await collect(engine, GenerateRequest(rid, [1, 2], session_id="s"))

            tg.start_soon(run, "a")
            while not fake.engine.generate_calls:
                await anyio.sleep(0.01)
            tg.start_soon(run, "b")
            while len(fake.engine.generate_calls) < 2:
                await anyio.sleep(0.01)
            fake.hold.set()
        assert [c["session_params"] for c in fake.engine.generate_calls] == [{"id": "s"}, None]


async def test_a_turn_on_a_session_sglang_no_longer_holds_is_resent_as_an_ordinary_request(fake):
    # SGLang aborts it with status 400 (Req.set_finish_with_abort's default), as it would a bad request
    fake.script = lambda context: [len(context), 2]
    async with started(SglangConfig(enable_streaming_session=True)) as engine:
        tm, calls = fake.engine.tokenizer_manager, fake.engine.generate_calls
        assert await engine.open_session("s", 30.0)
        tm.sessions.clear()  # SGLang closed it (a close dyn did not send)
        out = await collect(engine, GenerateRequest("r", [1, 2, 3], session_id="s"))
        assert out[0] == TokenChunk("r", [3]) and (out[-1].reason, out[-1].stop_token_id) == ("stop", 2)
        assert [(c["input_ids"], c["session_params"]) for c in calls] == [
            ([1, 2, 3], {"id": "s"}),
            ([1, 2, 3], None),
        ]
        assert calls[0]["rid"] != calls[1]["rid"]
        assert engine.load_metrics()[0].num_streaming_sessions == 0  # forgotten: later turns are ordinary
        await collect(engine, GenerateRequest("r2", [1, 2, 3, 3, 2, 4], session_id="s"))
        assert len(calls) == 3 and calls[-1]["session_params"] is None
        # a close SGLang deferred behind a turn it still runs: "close was requested"
        assert await engine.open_session("t", 30.0)
        tm.sessions["t"].close_on_finish = True
        out = await collect(engine, GenerateRequest("r3", [5, 6, 7], session_id="t"))
        assert out[0].token_ids == [3] and isinstance(out[-1], Finish)
        assert [c["session_params"] for c in calls[3:]] == [{"id": "t"}, None]
        assert engine.load_metrics()[0].num_streaming_sessions == 0


async def test_a_turn_sglang_finds_busy_is_resent_and_the_session_restarts_next(fake):
    fake.script = lambda context: [len(context), 2]
    async with started(SglangConfig(enable_streaming_session=True)) as engine:
        tm, calls = fake.engine.tokenizer_manager, fake.engine.generate_calls
        assert await engine.open_session("s", 30.0)
        await collect(engine, GenerateRequest("t1", [1, 2, 3], session_id="s"))
        tm.sessions["s"].inflight = True  # a turn dyn gave up on still runs in SGLang
        out = await collect(engine, GenerateRequest("t2", [1, 2, 3, 3, 2, 9], session_id="s"))
        assert out[0].token_ids == [6] and isinstance(out[-1], Finish)
        assert [(c["input_ids"], c["session_params"]) for c in calls[1:]] == [
            ([9], {"id": "s"}),
            ([1, 2, 3, 3, 2, 9], None),
        ]
        tm.sessions["s"].inflight = False
        metrics = engine.load_metrics()[0]  # kept, with an unknown history
        assert (metrics.num_streaming_sessions, metrics.streaming_session_held_tokens) == (1, 0)
        before = len(tm.session_calls)
        await collect(engine, GenerateRequest("t3", [1, 2, 3, 3, 2, 9, 6, 2, 4], session_id="s"))
        assert [kind for kind, _ in tm.session_calls[before:]] == ["close", "open"]
        assert (calls[-1]["input_ids"], calls[-1]["session_params"]) == (
            [1, 2, 3, 3, 2, 9, 6, 2, 4],
            {"id": "s"},
        )


async def test_a_session_abort_after_tokens_is_an_engine_error_and_other_aborts_keep_their_code(fake):
    fake.script = lambda context: [40] * 20
    async with started(SglangConfig(enable_streaming_session=True)) as engine:
        assert await engine.open_session("s", 30.0)
        fake.abort_after = (
            2,
            {
                "type": "abort",
                "message": "Invalid request: session id s does not exist",
                "status_code": 400,
                "err_type": "BadRequestError",
            },
        )
        chunks = []
        with pytest.raises(EngineError) as late:
            async for message in engine.generate(GenerateRequest("r", [1], session_id="s")):
                chunks.append(message)
        assert late.value.code == "engine_error" and "after it had streamed 2 tokens" in str(late.value)
        assert chunks == [TokenChunk("r", [40]), TokenChunk("r", [40])]
        assert len(fake.engine.generate_calls) == 1
        # a 400 abort for another reason on a session turn stays the client's error, not resent
        fake.abort_after = (
            0,
            {
                "type": "abort",
                "status_code": 400,
                "message": "The input (3 tokens) is longer than the model's context length",
            },
        )
        with pytest.raises(EngineError) as bad:
            await collect(engine, GenerateRequest("r2", [1, 2, 3], session_id="s"))
        assert bad.value.code == "bad_request" and len(fake.engine.generate_calls) == 2


async def test_an_open_sglang_refuses_is_not_recorded(fake):
    fake.hold = anyio.Event()
    async with started(SglangConfig(enable_streaming_session=True)) as engine:
        tm = fake.engine.tokenizer_manager
        assert await engine.open_session("s", 30.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect, engine, GenerateRequest("a", [1, 2], session_id="s"))
            while not ("s" in tm.sessions and tm.sessions["s"].inflight):
                await anyio.sleep(0.01)
            assert await engine.close_session("s")  # SGLang defers the close behind the running turn
            assert not await engine.open_session("s", 30.0)  # and still holds the id: refused
            assert engine.load_metrics()[0].num_streaming_sessions == 0
            fake.hold.set()
        assert "s" not in tm.sessions
        await collect(engine, GenerateRequest("b", [1, 2], session_id="s"))
        calls = fake.engine.generate_calls
        assert len(calls) == 2 and calls[-1]["session_params"] is None  # sent ordinary at once


# --------------------------------------------------------------------------- priority


@pytest.mark.parametrize(
    ("config", "overrides", "sent"),
    [
        (SglangConfig(), {}, None),
        (SglangConfig(enable_priority_scheduling=True), {}, 7),
        (SglangConfig(radix_eviction_policy="priority"), {}, 7),
        (SglangConfig(), {"radix_eviction_policy": "priority"}, 7),  # resolved (a model override)
        (SglangConfig(extra_args=["--abort-on-priority-when-disabled"]), {}, None),
        (
            SglangConfig(radix_eviction_policy="priority", extra_args=["--abort-on-priority-when-disabled"]),
            {},
            None,
        ),
        (
            SglangConfig(enable_priority_scheduling=True, extra_args=["--abort-on-priority-when-disabled"]),
            {},
            7,
        ),
    ],
)
async def test_priority_is_sent_only_where_sglang_uses_it_and_never_aborts_a_request(
    fake, config, overrides, sent
):
    fake.resolved_overrides = overrides
    async with started(config) as engine:
        out = await collect(engine, GenerateRequest("p", [1], priority=7))
    assert isinstance(out[-1], Finish) and out[-1].reason == "length"
    assert fake.engine.generate_calls[0]["priority"] == sent


async def test_priority_eviction_with_low_values_first_warns_that_important_prefixes_go_first(fake, caplog):
    async with started(SglangConfig(enable_priority_scheduling=True, radix_eviction_policy="priority")):
        pass
    assert "evicts cached prefixes with the smallest priority values first" not in caplog.text
    async with started(
        SglangConfig(
            enable_priority_scheduling=True,
            radix_eviction_policy="priority",
            schedule_low_priority_values_first=True,
        )
    ) as engine:
        assert engine.info.priority_order == "lower_first"
    assert "evicts cached prefixes with the smallest priority values first" in caplog.text
    assert "most important requests" in caplog.text


# --------------------------------------------------------------------------- load metrics


async def test_load_metrics_come_from_sglangs_load_snapshot(fake):
    fake.hold = anyio.Event()
    async with started(SglangConfig(page_size=4)) as engine:
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect, engine, GenerateRequest("x", [1]))
            with anyio.fail_after(5):
                while engine.load_metrics()[0].num_running != 1:
                    await anyio.sleep(0.05)
            metrics = engine.load_metrics()[0]
            assert (metrics.active_kv_blocks, metrics.total_kv_blocks) == (3, 1024)
            assert metrics.kv_usage == pytest.approx(10 / 4096)
            fake.hold.set()


async def test_without_get_loads_the_metrics_count_live_streams(fake):
    fake.has_get_loads = False
    fake.hold = anyio.Event()
    async with started() as engine:
        assert engine.load_metrics()[0].num_running == 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect, engine, GenerateRequest("x", [1]))
            while not fake.engine.generate_calls:
                await anyio.sleep(0.01)
            metrics = engine.load_metrics()[0]
            assert (metrics.num_running, metrics.total_kv_blocks, metrics.kv_usage) == (1, 4096, 0.0)
            fake.hold.set()
