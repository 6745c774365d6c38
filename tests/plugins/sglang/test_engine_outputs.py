"""SglangEngine against the fake SGLang: structured outputs and logprobs (the calls SGLang 0.5.23
receives, its refusals, and the logprobs it streams back; see fake_sglang.py for the sources)."""

from contextlib import asynccontextmanager

import anyio
import pytest

from dyn.core.engine import EngineError
from dyn.core.messages import GenerateRequest, OutputConstraint, StopConditions, TokenLogprobs
from dyn.plugins.sglang.config import SglangConfig
from dyn.plugins.sglang.engine import SglangEngine

pytestmark = pytest.mark.anyio

LARK = 'start: "yes" | "no"\n'


@asynccontextmanager
async def started(config=SglangConfig()):
    engine = SglangEngine(config, model_path="/models/m")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(engine.run)
            yield engine
            tg.cancel_scope.cancel()


async def collect(engine, request):
    return [m async for m in engine.generate(request)]


# --------------------------------------------------------------------------- structured outputs


async def test_a_constraint_reaches_sglang_as_its_sampling_key(fake):
    fake.script = lambda context: [11, 2]
    async with started() as engine:
        schema = OutputConstraint("json", '{"type": "integer"}')
        out = await collect(
            engine, GenerateRequest("j", [1], constraint=schema, stop=StopConditions(max_tokens=8))
        )
        assert out[-1].reason == "stop"
        choice = OutputConstraint("choice", choices=["x", "y|z"])
        await collect(engine, GenerateRequest("c", [1], constraint=choice))
        await collect(engine, GenerateRequest("o", [1], constraint=OutputConstraint("json_object")))
    assert fake.sampling[0] == {"max_new_tokens": 8, "json_schema": '{"type": "integer"}'}
    assert fake.sampling[1]["regex"] == r"(x|y\|z)"
    assert fake.sampling[2]["json_schema"] == '{"type": "object"}'


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (OutputConstraint("json", "{not json"), "Failed to compile json grammar"),
        (OutputConstraint("regex", "(abc"), "Failed to compile regex grammar"),
        (OutputConstraint("grammar", 'value ::= "a"'), "Failed to compile ebnf grammar"),  # no root rule
    ],
    ids=["json", "regex", "ebnf"],
)
async def test_a_constraint_sglang_cannot_compile_is_a_bad_request_with_its_message(
    fake, constraint, message
):
    async with started() as engine:
        with pytest.raises(EngineError) as refused:
            await collect(engine, GenerateRequest("bad", [1], constraint=constraint))
    assert refused.value.code == "bad_request" and message in str(refused.value)


async def test_a_lark_grammar_the_worker_cannot_convert_never_reaches_sglang(fake, monkeypatch):
    import sys

    from dyn.plugins.sglang.constraints import lark_to_ebnf

    monkeypatch.setitem(sys.modules, "xgrammar", None)
    lark_to_ebnf.cache_clear()
    async with started() as engine:  # --grammar-backend xgrammar, SGLang's default
        with pytest.raises(EngineError) as refused:
            await collect(engine, GenerateRequest("lark", [1], constraint=OutputConstraint("grammar", LARK)))
        assert refused.value.code == "bad_request" and "Lark" in str(refused.value)
        assert fake.engine.generate_calls == []
        assert engine.load_metrics()[0].num_running == 0


async def test_llguidance_takes_lark_as_written_and_backend_none_refuses_every_grammar(fake):
    fake.script = lambda context: [11, 2]
    async with started(SglangConfig(extra_args=["--grammar-backend", "llguidance"])) as engine:
        lark = OutputConstraint("grammar", LARK)
        out = await collect(engine, GenerateRequest("lark", [1], constraint=lark))
        assert out[-1].reason == "stop" and fake.sampling[-1]["ebnf"] == LARK
    async with started(SglangConfig(extra_args=["--grammar-backend", "none"])) as engine:
        with pytest.raises(EngineError) as refused:
            await collect(engine, GenerateRequest("re", [1], constraint=OutputConstraint("regex", "a+")))
        assert refused.value.code == "bad_request" and "--grammar-backend none" in str(refused.value)


# --------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize(
    ("incremental", "per_chunk"),
    [(True, 1), (True, 3), (False, 2)],
    ids=["incremental", "coalesced", "cumulative"],
)
async def test_output_logprobs_come_one_per_token_and_leave_with_the_stop_token(fake, incremental, per_chunk):
    fake.resolved_overrides = {"incremental_streaming_output": incremental}
    fake.tokens_per_chunk = per_chunk
    fake.script = lambda context: [11, 12, 13, 14, 2]
    async with started() as engine:
        out = await collect(engine, GenerateRequest("lp", [1, 2, 3], logprobs=2))
    (call,) = fake.engine.generate_calls
    assert (call["return_logprob"], call["top_logprobs_num"], call["logprob_start_len"]) == (True, 2, None)
    chunks, finish = out[:-1], out[-1]
    assert finish.stop_token_id == 2 and finish.prompt_logprobs is None
    assert [t for c in chunks for t in c.token_ids] == [11, 12, 13, 14]
    assert all(len(c.logprobs) == len(c.token_ids) for c in chunks)
    positions = [p for c in chunks for p in c.logprobs]
    for token, p in zip([11, 12, 13, 14], positions):
        assert len(p.top_ids) == 2 and p.top_logprobs == sorted(p.top_logprobs, reverse=True)
        if token in p.top_ids:  # the fake's even positions: the chosen token in its row
            assert p.rank == p.top_ids.index(token) + 1 and p.logprob == p.top_logprobs[p.rank - 1]
        else:
            assert p.rank == 0 and p.logprob < p.top_logprobs[-1]
    assert sum(token in p.top_ids for token, p in zip([11, 12, 13, 14], positions)) == 2


async def test_prompt_logprobs_score_the_whole_prompt_with_their_own_top_count(fake):
    fake.script = lambda context: [11, 12]
    async with started() as engine:
        out = await collect(
            engine,
            GenerateRequest(
                "plp", [1, 2, 3, 4], stop=StopConditions(max_tokens=2), logprobs=0, prompt_logprobs=3
            ),
        )
    (call,) = fake.engine.generate_calls
    # SGLang takes one top count for both sides: the larger; each side is cut to its own
    assert (call["return_logprob"], call["top_logprobs_num"], call["logprob_start_len"]) == (True, 3, 0)
    assert all(p.top_ids == [] for c in out[:-1] for p in c.logprobs)
    prompt = out[-1].prompt_logprobs
    assert len(prompt) == 4 and prompt[0] is None
    assert all(len(p.top_ids) == 3 and p.logprob <= p.top_logprobs[0] for p in prompt[1:])
    # position 2 (even) holds the prompt token 3 in its row at index 2 % 3
    assert prompt[2] == TokenLogprobs(-0.75, prompt[2].top_ids, [-0.25, -0.5, -0.75], rank=3)
    assert prompt[2].top_ids[2] == 3


async def test_prompt_logprobs_alone_ask_sglang_for_no_top_rows_of_output(fake):
    async with started() as engine:
        out = await collect(
            engine, GenerateRequest("p0", [1, 2], stop=StopConditions(max_tokens=1), prompt_logprobs=0)
        )
    (call,) = fake.engine.generate_calls
    assert (call["top_logprobs_num"], call["logprob_start_len"]) == (0, 0)
    assert out[0].logprobs == []  # output logprobs were not asked for
    assert out[-1].prompt_logprobs[0] is None and out[-1].prompt_logprobs[1].top_ids == []


async def test_a_session_turn_asking_for_prompt_logprobs_goes_as_an_ordinary_request(fake):
    """SGLang ignores logprob_start_len on a streaming-session turn (``Req.init_next_round_input``)."""
    fake.script = lambda context: [len(context), 2]
    async with started(SglangConfig(enable_streaming_session=True)) as engine:
        assert await engine.open_session("s", 30.0)
        await collect(engine, GenerateRequest("t1", [1, 2, 3], session_id="s"))
        scored = await collect(
            engine, GenerateRequest("t2", [1, 2, 3, 3, 2, 8], session_id="s", prompt_logprobs=1)
        )
        assert len(scored[-1].prompt_logprobs) == 6
        # the session still holds turn one, so the next turn appends to it
        await collect(engine, GenerateRequest("t3", [1, 2, 3, 3, 2, 9], session_id="s"))
    calls = fake.engine.generate_calls
    assert [(c["input_ids"], c["session_params"]) for c in calls] == [
        ([1, 2, 3], {"id": "s"}),
        ([1, 2, 3, 3, 2, 8], None),
        ([9], {"id": "s"}),
    ]
