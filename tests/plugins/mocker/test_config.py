"""MockerConfig: flavour rules, value checks and the --reasoning JSON."""

import pytest

from dyn.plugins.mocker.config import MockerConfig, ReasoningConfig


def test_defaults_are_valid_vllm():
    cfg = MockerConfig().validate()
    assert cfg.engine_type == "vllm" and not cfg.is_sglang and cfg.reasoning is None


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            {"enable_priority_scheduling": True},
            "--enable-priority-scheduling is an SGLang flag: add --engine-type sglang",
        ),
        (
            {"schedule_low_priority_values_first": True},
            "--schedule-low-priority-values-first is an SGLang flag: add --engine-type sglang",
        ),
        (
            {"radix_eviction_policy": "priority"},
            "--radix-eviction-policy is an SGLang flag: add --engine-type sglang",
        ),
        (
            {"enable_streaming_session": True},
            "--enable-streaming-session is an SGLang flag: add --engine-type sglang",
        ),
        ({"engine_type": "sglang", "scheduling_policy": "priority"}, "--scheduling-policy is a vLLM flag"),
        ({"engine_type": "trtllm"}, "--engine-type must be one of vllm, sglang"),
        ({"scheduling_policy": "lottery"}, "--scheduling-policy must be one of fcfs, priority"),
        ({"device": "gpu 0"}, "--device must name a device"),
        ({"device": ""}, "--device must name a device"),
        (
            {"engine_type": "sglang", "radix_eviction_policy": "lfu"},
            "--radix-eviction-policy must be one of lru, priority",
        ),
    ],
)
def test_flags_of_the_other_flavour_and_bad_values_are_refused(overrides, message):
    with pytest.raises(ValueError) as exc:
        MockerConfig(**overrides).validate()
    assert message in str(exc.value)


def test_sglang_flags_are_accepted_with_engine_type_sglang():
    MockerConfig(
        engine_type="sglang",
        enable_priority_scheduling=True,
        schedule_low_priority_values_first=True,
        radix_eviction_policy="priority",
        enable_streaming_session=True,
    ).validate()
    MockerConfig(engine_type="vllm", scheduling_policy="priority").validate()


def test_reasoning_json_is_parsed_and_checked():
    cfg = ReasoningConfig.parse(
        '{"start_thinking_token_id": 5, "end_thinking_token_id": 6, "thinking_ratio": 0.25}'
    )
    assert (cfg.start_thinking_token_id, cfg.end_thinking_token_id, cfg.thinking_ratio) == (5, 6, 0.25)
    for text, message in [
        ("{", "not valid JSON"),
        ('{"start_thinking_token_id": 5}', "--reasoning must be a JSON object"),
        (
            '{"start_thinking_token_id": 5, "end_thinking_token_id": 6, "thinking_ratio": 0.5, "x": 1}',
            "unknown field",
        ),
        (
            '{"start_thinking_token_id": 5, "end_thinking_token_id": 6, "thinking_ratio": 1.5}',
            "between 0 and 1",
        ),
        (
            '{"start_thinking_token_id": -1, "end_thinking_token_id": 6, "thinking_ratio": 0.5}',
            "non-negative",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            ReasoningConfig.parse(text)
    with pytest.raises(ValueError, match="between 0 and 1"):
        MockerConfig(
            reasoning=ReasoningConfig(start_thinking_token_id=1, end_thinking_token_id=2, thinking_ratio=-0.1)
        ).validate()


def test_the_device_is_what_the_worker_advertises():
    from dyn.core.model import load_model_info
    from dyn.plugins.mocker.engine import MockerEngine

    assert MockerEngine(MockerConfig(), load_model_info(None, None)).info.device == "cuda"
    assert MockerEngine(MockerConfig(device="cpu"), load_model_info(None, None)).info.device == "cpu"
