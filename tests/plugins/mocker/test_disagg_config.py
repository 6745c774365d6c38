"""The mocker's KV transfer flags and the model's KV bytes per token (Dynamo's mocker formula,
``layers * 2 * kv_heads * head_dim * dtype_bytes``: components/src/dynamo/mocker/utils/kv_cache.py
in Dynamo 1.6.1; vLLM's ``--kv-cache-dtype`` names)."""

import dataclasses
import json

import pytest

from dyn.core.model import load_model_info
from dyn.plugins.mocker import ENGINE
from dyn.plugins.mocker.config import MockerConfig
from dyn.plugins.mocker.transfer import bytes_per_token_of, kv_bytes_per_token

TINY = load_model_info(None, None)


def test_defaults_and_the_engine_serves_both_roles():
    cfg = MockerConfig()
    assert (cfg.kv_transfer_bandwidth, cfg.kv_bytes_per_token, cfg.kv_cache_dtype) == (64.0, None, "auto")
    assert ENGINE.disaggregation


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        ({}, 2 * 2 * 2 * 64 * 2),  # dyn-tiny: 2 layers, 2 KV heads of 64, bfloat16
        ({"kv_cache_dtype": "fp8"}, 2 * 2 * 2 * 64),
        ({"kv_cache_dtype": "float16"}, 1024),
        ({"kv_bytes_per_token": 4096}, 4096),
    ],
)
def test_kv_bytes_per_token_of_the_embedded_model(overrides, want):
    assert kv_bytes_per_token(MockerConfig(**overrides), TINY) == want


def test_kv_bytes_per_token_from_other_configs(tmp_path):
    # no head_dim: hidden / heads; no num_key_value_heads: the attention heads (MHA)
    assert bytes_per_token_of({"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512}) == (
        4 * 2 * 8 * 64 * 2
    )
    nested = {"text_config": {"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 32}}
    assert bytes_per_token_of({**nested, "torch_dtype": "float32"}) == 2 * 2 * 4 * 32 * 2
    assert bytes_per_token_of(
        {"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 32, "dtype": "float32"}
    ) == (2 * 2 * 4 * 32 * 4)
    assert bytes_per_token_of({"vocab_size": 10}) == 0
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10}))
    bare = dataclasses.replace(TINY, path=tmp_path)
    assert kv_bytes_per_token(MockerConfig(), bare) == 0  # no sizes: transfers take no time


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"kv_transfer_bandwidth": -1.0}, "--kv-transfer-bandwidth"),
        ({"kv_transfer_bandwidth": float("nan")}, "--kv-transfer-bandwidth"),
        ({"kv_transfer_bandwidth": float("inf")}, "--kv-transfer-bandwidth"),
        ({"kv_bytes_per_token": -5}, "--kv-bytes-per-token"),
        ({"kv_cache_dtype": "int4"}, "--kv-cache-dtype"),
    ],
)
def test_bad_transfer_flags_are_refused(overrides, words):
    with pytest.raises(ValueError, match=words):
        MockerConfig(**overrides).validate()
