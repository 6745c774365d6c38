"""dyn's request plane <-> vLLM's request and output objects, as pure functions.

Contract (followed from vLLM 0.32, ``vllm/sampling_params.py``, ``vllm/outputs.py``,
``vllm/logprobs.py``, ``vllm/v1/engine/logprobs.py``, ``vllm/v1/engine/output_processor.py``,
``vllm/v1/core/sched/utils.py::check_stop``):
- ``sampling_kwargs`` gives ``vllm.SamplingParams`` keyword arguments for one request: ``n=1``,
  token deltas (``output_kind`` is set by the caller), no detokenization (the frontend
  detokenizes). ``None`` fields are left out, so vLLM's defaults (and the model's
  generation_config) apply. ``nvext.greed_sampling`` reaches the engine as ``temperature=0``,
  which vLLM samples greedily. ``logprobs`` / ``prompt_logprobs`` pass as vLLM's top-k counts
  (vLLM refuses counts above its ``--max-logprobs``, default 20).
- ``structured_outputs_kwargs`` gives ``vllm.sampling_params.StructuredOutputsParams`` keyword
  arguments for the request's constraint: ``json`` (with ``whitespace_pattern``), ``json_object``,
  ``regex``, ``choice`` or ``grammar``. A grammar goes as written, EBNF or Lark: vLLM's ``auto``
  backend reads Lark itself (xgrammar's Lark front end, else guidance).
- ``OutputStream.step`` turns one ``RequestOutput`` delta into the tokens to send, their
  logprobs and, on the last one, a ``Finish``. vLLM keeps the token that stopped a request (EOS
  or a ``stop_token_ids`` entry) as the last output token; dyn reports it as
  ``Finish.stop_token_id`` instead of sending it (its logprob goes with it), and counts it in
  ``completion_tokens`` as vLLM's usage does.
- Logprobs: per position vLLM gives a dict ``token id -> Logprob(logprob, rank, decoded_token)``
  holding the sampled token (its true rank) and the top k (ranks 1..k; the sampled token once
  if among them). ``TokenLogprobs`` takes the sampled token's logprob and rank, and the k best
  by rank. ``DELTA`` outputs carry only the new positions' logprobs; the prompt's (first entry
  ``None``) come once, when prefill ends, and are collected into ``Finish.prompt_logprobs``.
  The values are vLLM's ``--logprobs-mode`` (``raw_logprobs`` by default: the model's own
  distribution, before temperature, penalties or a structured-output mask).
- Finish reasons: vLLM ``stop`` -> ``stop``, ``length`` -> ``length``, ``abort`` -> ``cancelled``;
  ``error`` raises ``EngineError``; anything newer reads as ``stop``.
"""

from __future__ import annotations

import time
from typing import Any

from dyn.core.engine import EngineError
from dyn.core.messages import (
    EngineTiming,
    Finish,
    FinishReason,
    GenerateRequest,
    OutputConstraint,
    TokenLogprobs,
    Usage,
)

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "cancelled"}


def sampling_kwargs(request: GenerateRequest, *, thinking_budget: bool = True) -> dict[str, Any]:
    """``vllm.SamplingParams(**kwargs)`` for ``request`` (without ``output_kind``);
    ``thinking_budget``: pass ``max_thinking_tokens`` on (the engine has a reasoning config)."""
    s, stop = request.sampling, request.stop
    kwargs: dict[str, Any] = {
        "n": 1,
        "detokenize": False,
        "min_tokens": stop.min_tokens,
        "ignore_eos": stop.ignore_eos,
    }
    optional = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "seed": s.seed,
        "repetition_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "max_tokens": stop.max_tokens,
        "thinking_token_budget": request.max_thinking_tokens if thinking_budget else None,
    }
    kwargs.update((k, v) for k, v in optional.items() if v is not None)
    if stop.stop_token_ids:
        kwargs["stop_token_ids"] = list(stop.stop_token_ids)
    if s.logit_bias is not None:
        kwargs["logit_bias"] = dict(s.logit_bias)
    if s.allowed_token_ids is not None:
        kwargs["allowed_token_ids"] = list(s.allowed_token_ids)
    if request.logprobs is not None:
        kwargs["logprobs"] = request.logprobs
    if request.prompt_logprobs is not None:
        kwargs["prompt_logprobs"] = request.prompt_logprobs
    return kwargs


def structured_outputs_kwargs(constraint: OutputConstraint) -> dict[str, Any]:
    """``StructuredOutputsParams(**kwargs)`` for ``constraint`` (one of its kinds, as vLLM 0.32
    takes them); ``ValueError`` for a kind vLLM has no field for."""
    kind = constraint.kind
    if kind == "json":
        kwargs: dict[str, Any] = {"json": constraint.spec}
        if constraint.whitespace_pattern is not None:
            kwargs["whitespace_pattern"] = constraint.whitespace_pattern
        return kwargs
    if kind == "json_object":
        return {"json_object": True}
    if kind == "choice":
        return {"choice": list(constraint.choices)}
    if kind in ("regex", "grammar"):
        return {kind: constraint.spec}
    raise ValueError(f"unknown structured output kind {kind!r}")


def position_logprobs(entries: Any, token_id: int, top: int) -> TokenLogprobs:
    """One position of vLLM's logprobs (``{token id: Logprob}``): ``token_id``'s logprob and rank,
    and the ``top`` best entries by rank (all of them when ``top`` < 0)."""
    ranked = sorted(entries.items(), key=_rank)
    if top >= 0:
        ranked = ranked[:top]
    chosen = entries[token_id]
    return TokenLogprobs(
        float(chosen.logprob),
        [tid for tid, _ in ranked],
        [float(lp.logprob) for _, lp in ranked],
        rank=chosen.rank or 0,
    )


def _rank(item: tuple[int, Any]) -> float:
    rank = item[1].rank
    return float("inf") if rank is None else rank


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
        self.prompt_logprobs: list[TokenLogprobs | None] = []
        """The prompt's logprobs so far (vLLM sends them once, when prefill ends)."""

    def step(self, output: Any) -> tuple[list[int], list[TokenLogprobs], Finish | None]:
        """The tokens to send for this delta, their logprobs (empty unless the request asked for
        them), and the ``Finish`` when it is the last one."""
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = self._logprobs(tokens, completion)
        self.completion_tokens += len(tokens)
        if tokens and self.first_token_at is None:
            self.first_token_at = time.monotonic()
        if output.num_cached_tokens:
            self.cached_tokens = max(self.cached_tokens, output.num_cached_tokens)
        if self.request.prompt_logprobs is not None and output.prompt_logprobs:
            self._add_prompt_logprobs(output.prompt_logprobs)
        if not output.finished:
            return tokens, logprobs, None
        vllm_reason = completion.finish_reason
        if vllm_reason == "error":
            raise EngineError("vLLM failed the request (finish_reason 'error'); see the worker log")
        reason = _FINISH_REASONS.get(vllm_reason, "stop")
        stop_token = None
        stop_reason = completion.stop_reason
        if vllm_reason == "stop" and tokens and (stop_reason is None or isinstance(stop_reason, int)):
            stop_token = tokens.pop()  # EOS (stop_reason None) or a stop_token_ids entry
            if logprobs:
                logprobs.pop()
        prompt_logprobs = self.prompt_logprobs if self.request.prompt_logprobs is not None else None
        finish = Finish(
            self.request.request_id,
            reason,
            Usage(len(self.request.token_ids), self.completion_tokens, self.cached_tokens),
            timing=self.timing(getattr(output, "metrics", None)),
            stop_token_id=stop_token,
            prompt_logprobs=prompt_logprobs,
        )
        return tokens, logprobs, finish

    def _logprobs(self, tokens: list[int], completion: Any) -> list[TokenLogprobs]:
        top = self.request.logprobs
        if top is None or not tokens:
            return []
        positions = completion.logprobs
        if positions is None or len(positions) != len(tokens):
            raise EngineError(
                f"vLLM sent {0 if positions is None else len(positions)} logprob positions "
                f"for {len(tokens)} tokens"
            )
        return [position_logprobs(entries, token, top) for token, entries in zip(tokens, positions)]

    def _add_prompt_logprobs(self, positions: Any) -> None:
        """Append vLLM's prompt logprobs (``None`` for the first prompt token)."""
        top, prompt = self.request.prompt_logprobs, self.request.token_ids
        assert top is not None
        for entries in positions:
            token = prompt[len(self.prompt_logprobs)]
            self.prompt_logprobs.append(None if entries is None else position_logprobs(entries, token, top))

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
        return EngineTiming(
            queue_ms=(scheduled - self.received) * 1e3,
            prefill_ms=max(0.0, first - scheduled) * 1e3,
            decode_ms=max(0.0, last - first) * 1e3,
        )
