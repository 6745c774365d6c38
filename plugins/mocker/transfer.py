"""The mocker's KV transfer model for disaggregated serving (reference 7.4, Dynamo's mocker).

A decode worker receives the prompt's KV it does not hold from the prefill worker. The transfer
takes ``tokens * kv_bytes_per_token / (bandwidth_gbps * 1e9)`` seconds of simulated time, at most
``MAX_TRANSFER_S``, then divided by ``--speedup-ratio`` as every simulated compute time is (a ratio
<= 0: no scaling); a bandwidth of 0 makes it instant.

``kv_bytes_per_token`` is ``--kv-bytes-per-token``, else the model's: ``num_hidden_layers * 2
(K and V) * num_key_value_heads * head_dim * dtype bytes`` from its ``config.json`` (``head_dim``
when stated, else ``hidden_size / num_attention_heads``; KV heads default to the attention heads;
the dtype is ``--kv-cache-dtype``, ``auto`` reading ``torch_dtype``). dyn-tiny: 2 layers, 2 KV
heads of 64, bfloat16: 1024 bytes.
"""

from __future__ import annotations

import logging
from typing import Any

from dyn.core.model import ModelInfo
from dyn.core.model.info import read_model_json
from dyn.plugins.mocker.config import MAX_TRANSFER_S, MockerConfig

log = logging.getLogger(__name__)

DTYPE_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
"""Bytes of one KV element by dtype name (``torch_dtype`` spellings and vLLM's ``--kv-cache-dtype``)."""
_WRAPPERS = ("text_config", "llm_config", "language_config")
"""Where a multimodal model's config.json nests its language model's sizes."""


def _positive_int(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    if _positive_int(config, "num_hidden_layers") is None:
        for key in _WRAPPERS:
            sub = config.get(key)
            if isinstance(sub, dict):
                return sub
    return config


def bytes_per_token_of(config: dict[str, Any], kv_cache_dtype: str = "auto") -> int:
    """KV bytes per token of a model whose ``config.json`` is ``config`` (see the module
    docstring); 0 when it lacks the layer, head or hidden sizes."""
    config = _text_config(config)
    layers = _positive_int(config, "num_hidden_layers")
    heads = _positive_int(config, "num_attention_heads")
    if layers is None or heads is None:
        return 0
    kv_heads = _positive_int(config, "num_key_value_heads") or heads
    head_dim = _positive_int(config, "head_dim")
    if head_dim is None:
        hidden = _positive_int(config, "hidden_size")
        if hidden is None:
            return 0
        head_dim = hidden // heads
    dtype = kv_cache_dtype
    if dtype == "auto":
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float16").removeprefix("torch.")
    return layers * 2 * kv_heads * head_dim * DTYPE_BYTES.get(dtype, 2)


def kv_bytes_per_token(config: MockerConfig, model: ModelInfo) -> int:
    """``--kv-bytes-per-token``, else the model's (0, with a warning, when its config.json does
    not say: transfers then take no time)."""
    if config.kv_bytes_per_token is not None:
        return config.kv_bytes_per_token
    found = read_model_json(str(model.path), model.path / "config.json", required=False) or {}
    value = bytes_per_token_of(found, config.kv_cache_dtype)
    if not value and config.kv_transfer_bandwidth > 0:
        log.warning(
            "%s: config.json states no layer/head sizes, so KV transfers take no time; "
            "pass --kv-bytes-per-token to simulate them",
            model.path,
        )
    return value


def transfer_seconds(tokens: int, bytes_per_token: int, bandwidth_gbps: float, speedup_ratio: float) -> float:
    """Seconds a decode worker waits to receive ``tokens`` tokens' KV (see the module docstring)."""
    if tokens <= 0 or bytes_per_token <= 0 or bandwidth_gbps <= 0:
        return 0.0
    simulated = min(tokens * bytes_per_token / (bandwidth_gbps * 1e9), MAX_TRANSFER_S)
    return simulated / (speedup_ratio if speedup_ratio > 0 else 1.0)
