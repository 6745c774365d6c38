"""GenerateRequest -> SGLang sampling_params."""

import pytest

from dyn.core.engine import EngineError
from dyn.core.messages import GenerateRequest, SamplingParams, StopConditions
from dyn.plugins.sglang.sampling import sampling_params


def test_every_dyn_field_maps_to_its_sglang_key():
    request = GenerateRequest(
        "r",
        [1, 2],
        SamplingParams(
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            seed=7,
            repetition_penalty=1.1,
            presence_penalty=0.2,
            frequency_penalty=0.3,
            length_penalty=2.0,
        ),
        StopConditions(max_tokens=64, min_tokens=4, ignore_eos=True, stop_token_ids=[5, 6]),
    )
    assert sampling_params(request) == {
        "max_new_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "sampling_seed": 7,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.2,
        "frequency_penalty": 0.3,
        "min_new_tokens": 4,
        "ignore_eos": True,
        "stop_token_ids": [5, 6],
    }


def test_defaults_are_left_to_sglang_but_max_new_tokens_is_always_sent():
    # SGLang's own default would cap the output at 128 tokens; None means "until EOS or the context"
    assert sampling_params(GenerateRequest("r", [1])) == {"max_new_tokens": None}


def test_top_k_zero_or_minus_one_means_the_whole_vocabulary():
    for top_k in (0, -1):
        params = sampling_params(GenerateRequest("r", [1], SamplingParams(top_k=top_k)))
        assert params["top_k"] == -1


def test_logit_bias_goes_with_string_keys_and_allowed_token_ids_is_refused():
    params = sampling_params(GenerateRequest("r", [1], SamplingParams(logit_bias={5: -100.0, 9: 2.5})))
    assert params["logit_bias"] == {"5": -100.0, "9": 2.5}
    with pytest.raises(EngineError) as exc:
        sampling_params(GenerateRequest("r", [1], SamplingParams(allowed_token_ids=(5,))))
    assert exc.value.code == "bad_request" and "allowed_token_ids" in str(exc.value)
