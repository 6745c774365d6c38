"""``GenerateRequest`` -> the ``sampling_params`` dict of SGLang's ``Engine.async_generate``.

Keys are SGLang 0.5.23's ``SamplingParams`` (``python/sglang/srt/sampling/sampling_params.py``);
a field left ``None`` in dyn is left out so SGLang's default applies. Two keys are always sent:
``max_new_tokens`` (``None`` means "until EOS or the context length" in both; SGLang's default
would otherwise cap at 128) and ``stop_token_ids`` when there are any.

Differences from dyn's ``StopConditions`` contract, which SGLang does not let an adapter change:
with ``ignore_eos`` SGLang ignores ``stop_token_ids`` too (dyn's contract, vLLM's, stops on them);
``length_penalty`` has no SGLang counterpart (beam search only) and is dropped. ``top_k`` 0 (dyn's
and vLLM's "no limit", which SGLang refuses) is sent as SGLang's -1. ``logit_bias`` goes as SGLang
takes it (token ids as strings); ``allowed_token_ids`` has no SGLang counterpart, so a request
with it is refused (``EngineError``, ``bad_request``) rather than served unconstrained.
"""

from __future__ import annotations

from typing import Any

from dyn.core.engine import EngineError
from dyn.core.messages import GenerateRequest

_SAMPLING_KEYS = (
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("min_p", "min_p"),
    ("repetition_penalty", "repetition_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("seed", "sampling_seed"),
)
"""(dyn ``SamplingParams`` field, SGLang sampling key)."""


def sampling_params(request: GenerateRequest) -> dict[str, Any]:
    """SGLang's sampling parameters for ``request``."""
    params: dict[str, Any] = {"max_new_tokens": request.stop.max_tokens}
    sampling = request.sampling
    for ours, theirs in _SAMPLING_KEYS:
        value = getattr(sampling, ours)
        if value is not None:
            params[theirs] = value
    if sampling.allowed_token_ids is not None:
        raise EngineError(
            "allowed_token_ids is not supported by SGLang 0.5.23 (its sampling parameters have no "
            "such field); use logit_bias, or a vLLM or mocker worker",
            code="bad_request",
        )
    if sampling.logit_bias is not None:
        params["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias.items()}
    if sampling.top_k is not None:
        params["top_k"] = sampling.top_k if sampling.top_k > 0 else -1  # 0 and -1: whole vocabulary
    stop = request.stop
    if stop.min_tokens:
        params["min_new_tokens"] = stop.min_tokens
    if stop.ignore_eos:
        params["ignore_eos"] = True
    if stop.stop_token_ids:
        params["stop_token_ids"] = list(stop.stop_token_ids)
    return params
