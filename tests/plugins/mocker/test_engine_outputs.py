"""MockerEngine's outputs beyond random tokens: constrained decoding and logprobs, end to end
through the Engine protocol."""

import json

import anyio
import pytest

from dyn.core.engine import EngineError
from dyn.core.frontend.tokenizer import Tokenizer
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
from dyn.plugins.mocker.engine import MockerEngine

pytestmark = pytest.mark.anyio
MODEL = load_model_info(None, None)
TOKENIZER = Tokenizer.from_model(MODEL)
PROMPT = TOKENIZER.encode("<|start_header_id|>user<|end_header_id|>\n\nGive me JSON.<|eot_id|>", False)
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
    },
    "required": ["city", "days", "tags"],
    "additionalProperties": False,
}


async def collect(engine, *requests):
    """Run ``requests`` concurrently; their (tokens, finish, chunks) in order."""
    results = {}

    async def one(req):
        out = [m async for m in engine.generate(req)]
        results[req.request_id] = ([t for m in out[:-1] for t in m.token_ids], out[-1], out[:-1])

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(engine.run)
            async with anyio.create_task_group() as inner:
                for req in requests:
                    inner.start_soon(one, req)
            tg.cancel_scope.cancel()
    return [results[r.request_id] for r in requests]


def engine(**overrides):
    return MockerEngine(
        MockerConfig(block_size=16, num_gpu_blocks=256, speedup_ratio=1000, **overrides), MODEL
    )


def request(rid, seed, constraint=None, max_tokens=2000, **kwargs):
    return GenerateRequest(
        rid,
        PROMPT,
        SamplingParams(seed=seed),
        StopConditions(max_tokens=max_tokens, **kwargs.pop("stop", {})),
        constraint=constraint,
        **kwargs,
    )


async def test_constrained_outputs_validate_in_a_batch_with_free_requests(check_schema):
    constraint = OutputConstraint("json", json.dumps(SCHEMA))
    reqs = [request(f"c{s}", s, constraint) for s in range(6)] + [
        request("free", 1, max_tokens=40, stop={"ignore_eos": True})
    ]
    results = await collect(engine(), *reqs)
    for tokens, finish, _ in results[:-1]:
        assert (
            isinstance(finish, Finish)
            and finish.reason == "stop"
            and finish.stop_token_id == MODEL.eos_token_ids[0]
        )
        assert finish.usage.completion_tokens == len(tokens) + 1  # the EOS counts, as in vLLM
        check_schema(json.loads(TOKENIZER.decode(tokens)), SCHEMA)
    assert results[-1][1].reason == "length" and len(results[-1][0]) == 40


async def test_same_seed_same_output_and_ignore_eos_still_ends_at_the_constraint():
    constraint = OutputConstraint("choice", choices=("north", "south", "east", "west"))
    a, b = await collect(
        engine(),
        request("a", 9, constraint, stop={"ignore_eos": True}),
        request("b", 9, constraint, stop={"ignore_eos": True}),
    )
    assert a[0] == b[0] and TOKENIZER.decode(a[0]) in ("north", "south", "east", "west")
    assert a[1].reason == "stop"


async def test_greedy_output_is_a_function_of_the_prompt_and_a_seed_reproduces_sampling():
    def ask(rid, seed, temperature, prompt=PROMPT):
        return GenerateRequest(
            rid,
            prompt,
            SamplingParams(temperature=temperature, seed=seed),
            StopConditions(max_tokens=24, ignore_eos=True),
        )

    other = TOKENIZER.encode("<|start_header_id|>user<|end_header_id|>\n\nSomething else.<|eot_id|>", False)
    results = await collect(
        engine(),
        ask("g1", 1, 0.0),
        ask("g2", 2, 0.0),
        ask("g3", None, 0.0),
        ask("g-other", 1, 0.0, other),
        ask("s1", 7, 0.8),
        ask("s2", 7, 0.8),
        ask("s3", 8, 0.8),
    )
    g1, g2, g3, g_other, s1, s2, s3 = (tokens for tokens, _, _ in results)
    assert g1 == g2 == g3 and g1 != g_other  # greedy: the prompt decides, not the seed or the id
    assert s1 == s2 and s1 != s3  # sampled: the seed decides


async def test_allowed_token_ids_and_logit_bias_shape_what_is_sampled():
    """The mocker's logits are all equal, so the bias alone decides: +100 greedy repeats its token,
    -100 bans one, and allowed_token_ids limit the draw; output obeys them over 64 tokens."""

    def ask(rid, temperature=None, bias=None, allowed=None):
        sampling = SamplingParams(temperature=temperature, seed=3, logit_bias=bias, allowed_token_ids=allowed)
        return GenerateRequest(rid, PROMPT, sampling, StopConditions(max_tokens=64, ignore_eos=True))

    allowed = (11, 12, 13)
    results = await collect(
        engine(),
        ask("forced", 0.0, bias={777: 100.0}),
        ask("allowed", 1.0, allowed=allowed),
        ask("allowed-banned", 1.0, bias={12: -100.0}, allowed=allowed),
        ask("allowed-favoured", 0.0, bias={13: 0.5}, allowed=allowed),
        ask("plain", 1.0),
    )
    forced, in_set, banned, favoured, plain = (tokens for tokens, _, _ in results)
    assert forced == [777] * 64
    assert set(in_set) == set(allowed)  # 64 draws of 3 tokens: each comes up
    assert set(banned) == {11, 13}
    assert favoured == [13] * 64
    assert not set(plain) <= set(allowed)


async def test_logit_bias_with_a_constraint_is_a_bad_request_on_the_mocker():
    bias = SamplingParams(logit_bias={5: 1.0})
    req = GenerateRequest(
        "x", PROMPT, bias, StopConditions(max_tokens=4), constraint=OutputConstraint("regex", "a+")
    )
    with pytest.raises(EngineError) as exc:
        async for _ in engine().generate(req):
            pass
    assert exc.value.code == "bad_request" and "logit_bias or allowed_token_ids" in str(exc.value)


async def test_a_refused_constraint_is_a_bad_request():
    with pytest.raises(EngineError) as exc:
        async for _ in engine().generate(request("x", 1, OutputConstraint("regex", "(unclosed"))):
            pass
    assert exc.value.code == "bad_request" and "unclosed group" in str(exc.value)


async def test_reasoning_thinks_first_then_answers_under_the_constraint(check_schema):
    eng = engine(
        reasoning=ReasoningConfig(start_thinking_token_id=10, end_thinking_token_id=11, thinking_ratio=0.01)
    )
    [(tokens, finish, _)] = await collect(eng, request("r", 4, OutputConstraint("json", json.dumps(SCHEMA))))
    end = tokens.index(11)
    assert tokens[0] == 10 and end == 19  # floor(2000 * 0.01) thinking tokens
    check_schema(json.loads(TOKENIZER.decode(tokens[end + 1 :])), SCHEMA)
    assert finish.reason == "stop"


async def test_logprobs_ride_along_without_changing_the_tokens():
    constraint = OutputConstraint("json", json.dumps(SCHEMA))
    plain, with_lp, free, free_lp = await collect(
        engine(),
        request("p", 3, constraint),
        request("l", 3, constraint, logprobs=2, prompt_logprobs=1),
        request("f", 5, max_tokens=30, stop={"ignore_eos": True}),
        request("fl", 5, max_tokens=30, stop={"ignore_eos": True}, logprobs=0),
    )
    assert plain[0] == with_lp[0] and free[0] == free_lp[0]
    for _tokens, _finish, chunks in (with_lp, free_lp):
        assert all(isinstance(c, TokenChunk) and len(c.logprobs) == len(c.token_ids) for c in chunks)
        entries = [lp for c in chunks for lp in c.logprobs]
        assert all(lp.logprob <= 0 for lp in entries)
    assert all(len(lp.top_ids) == 2 for c in with_lp[2] for lp in c.logprobs)
    assert all(lp.top_ids == [] for c in free_lp[2] for lp in c.logprobs)
    assert plain[2][0].logprobs == [] and plain[1].prompt_logprobs is None
    prompt = with_lp[1].prompt_logprobs
    assert len(prompt) == len(PROMPT) and prompt[0] is None and all(len(lp.top_ids) == 1 for lp in prompt[1:])
    # the same seed and positions give the same values, however the tokens were chunked
    again = await collect(engine(), request("l2", 3, constraint, logprobs=2, prompt_logprobs=1))
    assert [lp for c in again[0][2] for lp in c.logprobs] == [lp for c in with_lp[2] for lp in c.logprobs]


async def test_long_prompt_logprobs_are_computed_off_the_loop_with_the_same_values():
    from dyn.plugins.mocker.engine import PROMPT_LOGPROBS_INLINE
    from dyn.plugins.mocker.logprobs import prompt_logprobs

    prompt = [(i * 37) % 4000 + 5 for i in range(PROMPT_LOGPROBS_INLINE)]
    req = GenerateRequest(
        "long",
        prompt,
        SamplingParams(seed=2),
        StopConditions(max_tokens=3, ignore_eos=True),
        prompt_logprobs=2,
    )
    [(_, finish, _)] = await collect(engine(), req)
    assert finish.prompt_logprobs == prompt_logprobs(2, prompt, 2, MODEL.vocab_size)


async def test_a_source_failing_mid_stream_reaches_the_client_with_its_reason(monkeypatch):
    from dyn.plugins.mocker.sources import FAIL

    class Failing:
        thinks = True
        end_token_id = MODEL.eos_token_ids[0]
        error = "the grammar ran out of fuel"

        def next_token(self, req):
            return 100 if req.num_output < 3 else FAIL

    eng = engine()

    async def failing_source(request, seed):
        return Failing()

    monkeypatch.setattr(eng._answers, "wants", lambda request: True)
    monkeypatch.setattr(eng._answers, "source_for", failing_source)
    got, errors = [], []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(eng.run)
            try:
                async for message in eng.generate(request("f", 1)):
                    got.append(message)
            except EngineError as exc:
                errors.append(exc)
            tg.cancel_scope.cancel()
    assert [t for m in got for t in m.token_ids] == [100, 100, 100]
    (error,) = errors
    assert "the grammar ran out of fuel" in str(error) and error.code == "engine_error"
