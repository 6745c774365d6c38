"""``VllmEngine.generate`` / ``abort`` against a stand-in for vLLM's ``AsyncLLM`` with vLLM 0.32's
call shapes: ``generate(prompt, sampling_params, request_id, *, priority)`` yielding
``RequestOutput`` deltas, ``abort(request_id)``, and ``VLLMClientError`` for a bad request
(``VLLMValidationError``, its subclass, is what ``StructuredOutputsParams.__post_init__`` and
``SamplingParams._validate_structured_outputs`` raise in ``vllm/sampling_params.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest

from dyn.core.engine import EngineError
from dyn.core.messages import (
    Finish,
    GenerateRequest,
    OutputConstraint,
    StopConditions,
    TokenChunk,
    TokenLogprobs,
)
from dyn.plugins.vllm.config import VllmConfig
from dyn.plugins.vllm.engine import VllmApi, VllmEngine

pytestmark = pytest.mark.anyio


class ClientError(Exception):
    """Stands for vllm.exceptions.VLLMClientError."""


def delta(tokens, reason=None, logprobs=None):
    return SimpleNamespace(
        outputs=[
            SimpleNamespace(token_ids=tokens, finish_reason=reason, stop_reason=None, logprobs=logprobs)
        ],
        finished=reason is not None,
        num_cached_tokens=0,
        metrics=None,
        prompt_logprobs=None,
    )


def structured_outputs(**kwargs):
    """Stands for StructuredOutputsParams: exactly one constraint, as its __post_init__ checks."""
    if len(kwargs.keys() - {"whitespace_pattern"}) != 1:
        raise ClientError("You can only use one kind of structured outputs constraint")
    return ("structured", kwargs)


class FakeLLM:
    def __init__(self, outputs=(), error: Exception | None = None) -> None:
        self.outputs = list(outputs)
        self.error = error
        self.calls: list[dict] = []
        self.aborts: list[str] = []
        self.release = anyio.Event()

    async def generate(self, prompt, params, request_id, *, lora_request=None, priority=0):
        self.calls.append(
            {
                "prompt": prompt,
                "params": params,
                "rid": request_id,
                "priority": priority,
                "lora": lora_request,
            }
        )
        if self.error is not None:
            raise self.error
        await self.release.wait()
        for out in self.outputs:
            yield out
            if self.aborts:
                yield delta([], "abort")
                return

    async def abort(self, request_id):
        self.aborts.append(request_id)


def engine(llm: FakeLLM, *, priority: bool = False, thinking: bool = False) -> VllmEngine:
    e = VllmEngine(VllmConfig(), "/m")
    e._llm = llm
    e._api = VllmApi(
        sampling_params=lambda **kw: kw,
        tokens_prompt=lambda **kw: kw,
        delta="DELTA",
        client_errors=(ClientError,),
        structured_outputs=structured_outputs,
    )
    e._priority, e._thinking_budget = priority, thinking
    return e


async def collect(e: VllmEngine, request: GenerateRequest) -> list:
    return [out async for out in e.generate(request)]


@pytest.mark.parametrize("scheduling_by_priority", [False, True])
async def test_tokens_stream_and_priority_reaches_vllm_only_under_priority_scheduling(scheduling_by_priority):
    llm = FakeLLM([delta([5, 6]), delta([7], "length")])
    llm.release.set()
    e = engine(llm, priority=scheduling_by_priority)
    outs = await collect(
        e,
        GenerateRequest(
            "r1", [1, 2, 3], priority=-4, max_thinking_tokens=8, stop=StopConditions(max_tokens=3)
        ),
    )
    assert [type(o) for o in outs] == [TokenChunk, TokenChunk, Finish]
    assert outs[-1].reason == "length" and outs[-1].usage.completion_tokens == 3
    call = llm.calls[0]
    assert call["priority"] == (-4 if scheduling_by_priority else 0)
    assert call["prompt"] == {"prompt_token_ids": [1, 2, 3]} and call["params"]["output_kind"] == "DELTA"
    assert "thinking_token_budget" not in call["params"]  # no reasoning config: vLLM would refuse it
    assert "structured_outputs" not in call["params"] and "logprobs" not in call["params"]
    assert all(o.logprobs == [] for o in outs[:-1]) and outs[-1].prompt_logprobs is None


async def test_a_request_vllm_refuses_is_a_bad_request():
    e = engine(FakeLLM(error=ClientError("prompt too long")))
    with pytest.raises(EngineError) as err:
        await collect(e, GenerateRequest("r1", [1]))
    assert err.value.code == "bad_request" and "prompt too long" in str(err.value)
    assert not e._live


async def test_a_lora_adapter_the_worker_does_not_serve_is_a_bad_request_before_vllm_sees_it():
    llm = FakeLLM([delta([5], "length")])
    llm.release.set()
    e = engine(llm)
    with pytest.raises(EngineError, match="no LoRA adapter 'sql'") as err:
        await collect(e, GenerateRequest("r1", [1], lora_name="sql"))
    assert err.value.code == "bad_request" and not llm.calls
    await collect(e, GenerateRequest("r2", [1]))
    assert llm.calls[-1]["lora"] is None  # the base model: no LoRARequest


async def test_abort_of_a_live_request_ends_it_cancelled_and_unknown_ones_are_refused():
    llm = FakeLLM([delta([5]), delta([6]), delta([7], "length")])
    e = engine(llm)
    outs: list = []

    async def run() -> None:
        outs.extend(await collect(e, GenerateRequest("r1", [1])))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await anyio.wait_all_tasks_blocked()
        assert await e.abort("nope") is False
        assert await e.abort("r1") is True  # before vLLM streamed anything
        llm.release.set()
    assert llm.aborts[0] == "r1" and outs[-1].reason == "cancelled"
    assert await e.abort("r1") is False


async def test_a_constraint_reaches_vllm_as_structured_outputs_and_logprobs_stream_with_the_tokens():
    lp = SimpleNamespace(logprob=-0.25, rank=1, decoded_token=None)
    llm = FakeLLM([delta([5], logprobs=[{5: lp}]), delta([6], "length", logprobs=[{6: lp}])])
    llm.release.set()
    choice = OutputConstraint("choice", choices=["a", "b"])
    outs = await collect(engine(llm), GenerateRequest("r1", [1], logprobs=0, constraint=choice))
    params = llm.calls[0]["params"]
    assert params["structured_outputs"] == ("structured", {"choice": ["a", "b"]}) and params["logprobs"] == 0
    assert [o.logprobs for o in outs[:-1]] == [[TokenLogprobs(-0.25, rank=1)]] * 2


async def test_a_constraint_vllm_refuses_is_a_bad_request_with_vllms_message():
    # refused when the request is added (SamplingParams._validate_structured_outputs)
    e = engine(FakeLLM(error=ClientError("Invalid grammar specification.")))
    with pytest.raises(EngineError) as err:
        await collect(e, GenerateRequest("r1", [1], constraint=OutputConstraint("grammar", "root ::= (")))
    assert err.value.code == "bad_request" and "Invalid grammar specification." in str(err.value)
    # refused while building the parameters (StructuredOutputsParams.__post_init__)
    e = engine(FakeLLM())
    e._api = VllmApi(
        sampling_params=lambda **kw: kw,
        tokens_prompt=lambda **kw: kw,
        delta="DELTA",
        client_errors=(ClientError,),
        structured_outputs=lambda **kw: structured_outputs(**kw, regex="x"),
    )
    with pytest.raises(EngineError) as err:
        await collect(e, GenerateRequest("r2", [1], constraint=OutputConstraint("json_object")))
    assert err.value.code == "bad_request" and "one kind of structured outputs" in str(err.value)
