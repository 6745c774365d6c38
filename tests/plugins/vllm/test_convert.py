"""dyn requests -> vLLM sampling parameters, and vLLM's output deltas -> dyn's chunks and finish.

The output objects below carry the attributes ``vllm.outputs.RequestOutput`` /
``CompletionOutput``, ``vllm.logprobs.Logprob`` and ``vllm.v1.metrics.stats.RequestStateStats``
have in vLLM 0.32; the logprob dicts are built as ``vllm/logprobs.py``
(``append_logprobs_for_next_position``) builds them: the sampled token first with its true rank,
then the top k with ranks 1..k.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from dyn.core.engine import EngineError
from dyn.core.messages import GenerateRequest, OutputConstraint, SamplingParams, StopConditions, TokenLogprobs
from dyn.plugins.vllm.convert import (
    OutputStream,
    position_logprobs,
    sampling_kwargs,
    structured_outputs_kwargs,
)


@dataclass
class Logprob:
    """Stands for vllm.logprobs.Logprob."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def position(sampled: int, sampled_logprob: float, sampled_rank: int, top: list[tuple[int, float]]) -> dict:
    """A position as vLLM's ``append_logprobs_for_next_position`` builds it."""
    entries = {sampled: Logprob(sampled_logprob, sampled_rank)}
    entries.update((tid, Logprob(lp, rank)) for rank, (tid, lp) in enumerate(top, start=1))
    return entries


def output(
    tokens,
    *,
    finished=False,
    reason=None,
    stop_reason=None,
    cached=0,
    metrics=None,
    logprobs=None,
    prompt_logprobs=None,
):
    completion = SimpleNamespace(
        token_ids=tokens, finish_reason=reason, stop_reason=stop_reason, logprobs=logprobs
    )
    return SimpleNamespace(
        outputs=[completion],
        finished=finished,
        num_cached_tokens=cached,
        metrics=metrics,
        prompt_logprobs=prompt_logprobs,
    )


def request(**stop) -> GenerateRequest:
    return GenerateRequest("r1", list(range(10)), stop=StopConditions(**stop))


def test_sampling_kwargs_leave_unset_fields_to_vllm():
    req = GenerateRequest(
        "r",
        [1],
        sampling=SamplingParams(temperature=0.0, top_k=5, seed=3),
        stop=StopConditions(max_tokens=7, min_tokens=2, ignore_eos=True, stop_token_ids=[9]),
        max_thinking_tokens=16,
    )
    assert sampling_kwargs(req) == {
        "n": 1,
        "detokenize": False,
        "min_tokens": 2,
        "ignore_eos": True,
        "temperature": 0.0,
        "top_k": 5,
        "seed": 3,
        "max_tokens": 7,
        "thinking_token_budget": 16,
        "stop_token_ids": [9],
    }
    plain = sampling_kwargs(GenerateRequest("r", [1]))
    assert "temperature" not in plain and "max_tokens" not in plain and "stop_token_ids" not in plain


def test_logit_bias_and_allowed_token_ids_reach_vllm():
    sampling = SamplingParams(logit_bias={5: -100.0, 9: 2.5}, allowed_token_ids=(5, 9, 11))
    kwargs = sampling_kwargs(GenerateRequest("r", [1], sampling=sampling))
    assert kwargs["logit_bias"] == {5: -100.0, 9: 2.5} and kwargs["allowed_token_ids"] == [5, 9, 11]
    assert "logit_bias" not in sampling_kwargs(GenerateRequest("r", [1]))


def test_deltas_stream_and_the_last_one_finishes_with_usage_and_cache():
    stream = OutputStream(request(), received=0.0)
    assert stream.step(output([5, 6], cached=4)) == ([5, 6], [], None)
    tokens, _, finish = stream.step(output([7], finished=True, reason="length", cached=4))
    assert tokens == [7] and finish.reason == "length" and finish.stop_token_id is None
    assert (finish.usage.prompt_tokens, finish.usage.completion_tokens, finish.usage.cached_tokens) == (
        10,
        3,
        4,
    )


@pytest.mark.parametrize(("stop_reason", "stop"), [(None, 2), (9, 9)], ids=["eos", "stop_token_id"])
def test_the_stopping_token_is_reported_not_sent_but_counted(stop_reason, stop):
    stream = OutputStream(request(stop_token_ids=[9]), received=0.0)
    tokens, _, finish = stream.step(output([5, stop], finished=True, reason="stop", stop_reason=stop_reason))
    assert tokens == [5] and finish.reason == "stop" and finish.stop_token_id == stop
    assert finish.usage.completion_tokens == 2


def test_a_stop_string_match_keeps_every_token():
    stream = OutputStream(request(), received=0.0)
    tokens, _, finish = stream.step(output([5, 6], finished=True, reason="stop", stop_reason="###"))
    assert tokens == [5, 6] and finish.stop_token_id is None


def test_abort_reads_as_cancelled_and_error_raises():
    tokens, _, finish = OutputStream(request(), 0.0).step(output([], finished=True, reason="abort"))
    assert tokens == [] and finish.reason == "cancelled"
    with pytest.raises(EngineError, match="finish_reason 'error'"):
        OutputStream(request(), 0.0).step(output([], finished=True, reason="error"))


def test_timing_comes_from_vllm_request_stats_on_the_shared_monotonic_clock():
    stats = SimpleNamespace(
        queued_ts=100.001, scheduled_ts=100.010, first_token_ts=100.030, last_token_ts=100.130
    )
    stream = OutputStream(request(), received=100.0)
    _, _, finish = stream.step(output([1], finished=True, reason="length", metrics=stats))
    assert finish.timing.queue_ms == pytest.approx(10.0)
    assert finish.timing.prefill_ms == pytest.approx(20.0)
    assert finish.timing.decode_ms == pytest.approx(100.0)


def test_logprob_counts_pass_as_vllms_top_k_counts():
    kwargs = sampling_kwargs(GenerateRequest("r", [1], logprobs=0, prompt_logprobs=3))
    assert kwargs["logprobs"] == 0 and kwargs["prompt_logprobs"] == 3
    plain = sampling_kwargs(GenerateRequest("r", [1]))
    assert "logprobs" not in plain and "prompt_logprobs" not in plain


@pytest.mark.parametrize(
    ("constraint", "kwargs"),
    [
        (OutputConstraint("json", '{"type": "integer"}'), {"json": '{"type": "integer"}'}),
        (OutputConstraint("json", "{}", whitespace_pattern=" ?"), {"json": "{}", "whitespace_pattern": " ?"}),
        (OutputConstraint("json_object"), {"json_object": True}),
        (OutputConstraint("regex", r"\d+"), {"regex": r"\d+"}),
        (OutputConstraint("choice", choices=["a", "b c"]), {"choice": ["a", "b c"]}),
        (OutputConstraint("grammar", 'root ::= "x"'), {"grammar": 'root ::= "x"'}),
        (OutputConstraint("grammar", 'start: "x"'), {"grammar": 'start: "x"'}),  # vLLM reads Lark itself
    ],
    ids=["json", "json-whitespace", "json_object", "regex", "choice", "ebnf", "lark"],
)
def test_each_constraint_kind_becomes_one_structured_outputs_field(constraint, kwargs):
    assert structured_outputs_kwargs(constraint) == kwargs


def test_a_position_keeps_the_sampled_token_and_the_k_best_by_rank():
    # the sampled token (rank 7) is outside the top 2: vLLM sends k + 1 entries
    entries = position(50, -4.0, 7, [(11, -0.5), (12, -1.5)])
    assert position_logprobs(entries, 50, 2) == TokenLogprobs(-4.0, [11, 12], [-0.5, -1.5], rank=7)
    # the sampled token among the top 2: one entry, with its top-k rank
    entries = position(12, -1.5, 2, [(11, -0.5), (12, -1.5)])
    assert position_logprobs(entries, 12, 2) == TokenLogprobs(-1.5, [11, 12], [-0.5, -1.5], rank=2)
    # logprobs=0: the sampled token alone
    assert position_logprobs(position(9, -2.0, 3, []), 9, 0) == TokenLogprobs(-2.0, [], [], rank=3)


def test_output_logprobs_follow_the_tokens_and_leave_with_the_stop_token():
    stream = OutputStream(GenerateRequest("r1", [1, 2], logprobs=1), received=0.0)
    first = [position(5, -0.1, 1, [(5, -0.1)]), position(6, -2.0, 4, [(8, -0.3)])]
    tokens, logprobs, finish = stream.step(output([5, 6], logprobs=first))
    assert tokens == [5, 6] and finish is None
    assert logprobs == [TokenLogprobs(-0.1, [5], [-0.1], rank=1), TokenLogprobs(-2.0, [8], [-0.3], rank=4)]
    last = [position(7, -0.7, 1, [(7, -0.7)]), position(2, -0.2, 1, [(2, -0.2)])]  # 2: EOS
    tokens, logprobs, finish = stream.step(output([7, 2], finished=True, reason="stop", logprobs=last))
    assert tokens == [7] and logprobs == [TokenLogprobs(-0.7, [7], [-0.7], rank=1)]
    assert finish.stop_token_id == 2 and finish.prompt_logprobs is None


def test_a_delta_whose_logprobs_do_not_match_its_tokens_is_an_engine_error():
    stream = OutputStream(GenerateRequest("r1", [1], logprobs=0), received=0.0)
    with pytest.raises(EngineError, match="1 logprob positions for 2 tokens"):
        stream.step(output([5, 6], logprobs=[position(5, -0.1, 1, [])]))


def test_prompt_logprobs_arrive_once_and_finish_the_request():
    """In DELTA mode vLLM pops the prompt logprobs into the first output after prefill
    (``LogprobsProcessor.pop_prompt_logprobs``); later outputs carry an empty list."""
    stream = OutputStream(GenerateRequest("r1", [3, 4, 5], prompt_logprobs=1), received=0.0)
    prompt = [None, position(4, -3.0, 9, [(40, -0.2)]), position(5, -0.4, 1, [(5, -0.4)])]
    tokens, logprobs, _ = stream.step(output([6], prompt_logprobs=prompt))
    assert tokens == [6] and logprobs == []  # output logprobs were not asked for
    _, _, finish = stream.step(output([7], finished=True, reason="length", prompt_logprobs=[]))
    assert finish.prompt_logprobs == [
        None,
        TokenLogprobs(-3.0, [40], [-0.2], rank=9),
        TokenLogprobs(-0.4, [5], [-0.4], rank=1),
    ]
