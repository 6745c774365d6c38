"""dyn requests -> vLLM sampling parameters, and vLLM's output deltas -> dyn's chunks and finish.

The output objects below carry the attributes ``vllm.outputs.RequestOutput`` /
``CompletionOutput`` and ``vllm.v1.metrics.stats.RequestStateStats`` have in vLLM 0.32.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dyn.core.engine import EngineError
from dyn.core.messages import GenerateRequest, SamplingParams, StopConditions
from dyn.plugins.vllm.convert import OutputStream, sampling_kwargs


def output(tokens, *, finished=False, reason=None, stop_reason=None, cached=0, metrics=None):
    completion = SimpleNamespace(token_ids=tokens, finish_reason=reason, stop_reason=stop_reason)
    return SimpleNamespace(outputs=[completion], finished=finished, num_cached_tokens=cached,
                           metrics=metrics)


def request(**stop) -> GenerateRequest:
    return GenerateRequest("r1", list(range(10)), stop=StopConditions(**stop))


def test_sampling_kwargs_leave_unset_fields_to_vllm():
    req = GenerateRequest("r", [1], sampling=SamplingParams(temperature=0.0, top_k=5, seed=3),
                          stop=StopConditions(max_tokens=7, min_tokens=2, ignore_eos=True,
                                              stop_token_ids=[9]), max_thinking_tokens=16)
    assert sampling_kwargs(req) == {
        "n": 1, "detokenize": False, "min_tokens": 2, "ignore_eos": True, "temperature": 0.0,
        "top_k": 5, "seed": 3, "max_tokens": 7, "thinking_token_budget": 16, "stop_token_ids": [9]}
    plain = sampling_kwargs(GenerateRequest("r", [1]))
    assert "temperature" not in plain and "max_tokens" not in plain and "stop_token_ids" not in plain


def test_deltas_stream_and_the_last_one_finishes_with_usage_and_cache():
    stream = OutputStream(request(), received=0.0)
    assert stream.step(output([5, 6], cached=4)) == ([5, 6], None)
    tokens, finish = stream.step(output([7], finished=True, reason="length", cached=4))
    assert tokens == [7] and finish.reason == "length" and finish.stop_token_id is None
    assert (finish.usage.prompt_tokens, finish.usage.completion_tokens, finish.usage.cached_tokens) == (10, 3, 4)


@pytest.mark.parametrize(("stop_reason", "stop"), [(None, 2), (9, 9)], ids=["eos", "stop_token_id"])
def test_the_stopping_token_is_reported_not_sent_but_counted(stop_reason, stop):
    stream = OutputStream(request(stop_token_ids=[9]), received=0.0)
    tokens, finish = stream.step(output([5, stop], finished=True, reason="stop", stop_reason=stop_reason))
    assert tokens == [5] and finish.reason == "stop" and finish.stop_token_id == stop
    assert finish.usage.completion_tokens == 2


def test_a_stop_string_match_keeps_every_token():
    stream = OutputStream(request(), received=0.0)
    tokens, finish = stream.step(output([5, 6], finished=True, reason="stop", stop_reason="###"))
    assert tokens == [5, 6] and finish.stop_token_id is None


def test_abort_reads_as_cancelled_and_error_raises():
    tokens, finish = OutputStream(request(), 0.0).step(output([], finished=True, reason="abort"))
    assert tokens == [] and finish.reason == "cancelled"
    with pytest.raises(EngineError, match="finish_reason 'error'"):
        OutputStream(request(), 0.0).step(output([], finished=True, reason="error"))


def test_timing_comes_from_vllm_request_stats_on_the_shared_monotonic_clock():
    stats = SimpleNamespace(queued_ts=100.001, scheduled_ts=100.010, first_token_ts=100.030,
                            last_token_ts=100.130)
    stream = OutputStream(request(), received=100.0)
    _, finish = stream.step(output([1], finished=True, reason="length", metrics=stats))
    assert finish.timing.queue_ms == pytest.approx(10.0)
    assert finish.timing.prefill_ms == pytest.approx(20.0)
    assert finish.timing.decode_ms == pytest.approx(100.0)
