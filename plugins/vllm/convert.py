"""dyn's request plane <-> vLLM's request and output objects, as pure functions.

Contract (followed from vLLM 0.32, ``vllm/sampling_params.py``, ``vllm/outputs.py``,
``vllm/v1/core/sched/utils.py::check_stop``):
- ``sampling_kwargs`` gives ``vllm.SamplingParams`` keyword arguments for one request: ``n=1``,
  token deltas (``output_kind`` is set by the caller), no detokenization (the frontend
  detokenizes). ``None`` fields are left out, so vLLM's defaults (and the model's
  generation_config) apply. ``nvext.greed_sampling`` reaches the engine as ``temperature=0``,
  which vLLM samples greedily.
- ``OutputStream.step`` turns one ``RequestOutput`` delta into the tokens to send and, on the last
  one, a ``Finish``. vLLM keeps the token that stopped a request (EOS or a ``stop_token_ids``
  entry) as the last output token; dyn reports it as ``Finish.stop_token_id`` instead of
  sending it, and counts it in ``completion_tokens`` as vLLM's usage does.
- Finish reasons: vLLM ``stop`` -> ``stop``, ``length`` -> ``length``, ``abort`` -> ``cancelled``;
  ``error`` raises ``EngineError``; anything newer reads as ``stop``.
"""

from __future__ import annotations

import time
from typing import Any

from dyn.core.engine import EngineError
from dyn.core.messages import EngineTiming, Finish, GenerateRequest, Usage

_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "cancelled"}


def sampling_kwargs(request: GenerateRequest, *, thinking_budget: bool = True) -> dict[str, Any]:
    """``vllm.SamplingParams(**kwargs)`` for ``request`` (without ``output_kind``);
    ``thinking_budget``: pass ``max_thinking_tokens`` on (the engine has a reasoning config)."""
    s, stop = request.sampling, request.stop
    kwargs: dict[str, Any] = {"n": 1, "detokenize": False, "min_tokens": stop.min_tokens,
                              "ignore_eos": stop.ignore_eos}
    optional = {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p,
                "seed": s.seed, "repetition_penalty": s.repetition_penalty,
                "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
                "max_tokens": stop.max_tokens,
                "thinking_token_budget": request.max_thinking_tokens if thinking_budget else None}
    kwargs.update((k, v) for k, v in optional.items() if v is not None)
    if stop.stop_token_ids:
        kwargs["stop_token_ids"] = list(stop.stop_token_ids)
    return kwargs


class OutputStream:
    """Follows one request's ``RequestOutput`` deltas (``RequestOutputKind.DELTA``).

    ``received`` is ``time.monotonic()`` when the worker got the request; vLLM's request stats
    use the same clock, so the timing splits add up across the two processes.
    """

    def __init__(self, request: GenerateRequest, received: float) -> None:
        self.request = request
        self.received = received
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.first_token_at: float | None = None

    def step(self, output: Any) -> tuple[list[int], Finish | None]:
        """The tokens to send for this delta, and the ``Finish`` when it is the last one."""
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        self.completion_tokens += len(tokens)
        if tokens and self.first_token_at is None:
            self.first_token_at = time.monotonic()
        if output.num_cached_tokens:
            self.cached_tokens = max(self.cached_tokens, output.num_cached_tokens)
        if not output.finished:
            return tokens, None
        vllm_reason = completion.finish_reason
        if vllm_reason == "error":
            raise EngineError("vLLM failed the request (finish_reason 'error'); see the worker log")
        reason = _FINISH_REASONS.get(vllm_reason, "stop")
        stop_token = None
        stop_reason = completion.stop_reason
        if vllm_reason == "stop" and tokens and (stop_reason is None or isinstance(stop_reason, int)):
            stop_token = tokens.pop()  # EOS (stop_reason None) or a stop_token_ids entry
        finish = Finish(self.request.request_id, reason,
                        Usage(len(self.request.token_ids), self.completion_tokens, self.cached_tokens),
                        timing=self.timing(getattr(output, "metrics", None)), stop_token_id=stop_token)
        return tokens, finish

    def timing(self, stats: Any) -> EngineTiming:
        """Queue, prefill and decode time from vLLM's request stats, else from this process."""
        now = time.monotonic()
        scheduled = getattr(stats, "scheduled_ts", 0.0) or None
        first = getattr(stats, "first_token_ts", 0.0) or self.first_token_at
        last = getattr(stats, "last_token_ts", 0.0) or now
        if scheduled is None or scheduled < self.received:
            scheduled = self.received
        if first is None:
            return EngineTiming(queue_ms=(scheduled - self.received) * 1e3)
        return EngineTiming(queue_ms=(scheduled - self.received) * 1e3,
                            prefill_ms=max(0.0, first - scheduled) * 1e3,
                            decode_ms=max(0.0, last - first) * 1e3)
