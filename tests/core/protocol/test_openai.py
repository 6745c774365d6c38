"""Request decoding and value rules: every mistake is an ApiError naming its field."""

from __future__ import annotations

import msgspec
import pytest

from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    check_chat,
    check_completion,
    decode_request,
    token_rules,
)

MSG = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatCompletionRequest:
    return decode_request(msgspec.json.encode({"messages": MSG, **fields}), ChatCompletionRequest)


def error_of(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args)
    assert info.value.status == 400
    return info.value


def test_decode_keeps_vllm_extras_and_ignores_unknown_fields():
    req = chat(top_k=5, ignore_eos=True, nvext={"backend_instance_id": 7}, whatever=3)  # nvext: strict
    assert req.top_k == 5 and req.ignore_eos and req.nvext.backend_instance_id == 7
    check_chat(req)


@pytest.mark.parametrize(
    "body, param",
    [
        (b'{"messages": 3}', "messages"),
        (b'{"messages": [], "max_tokens": "x"}', "max_tokens"),
        (b'{"messages": [], "nvext": {"agent_hints": {"osl": "long"}}}', "nvext.agent_hints.osl"),
        (b'{"messages": [], "nvext": {"session_control": {}}}', "nvext.session_control.session_id"),
        (b"{}", "messages"),
    ],
)
def test_wrong_types_name_the_field(body, param):
    assert error_of(decode_request, body, ChatCompletionRequest).param == param


def test_malformed_json():
    err = error_of(decode_request, b"{", ChatCompletionRequest)
    assert "Invalid JSON" in err.message and err.param is None


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"use_beam_search": True, "n": 11}, "n"),
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": 1}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"continue_final_message": True}, "continue_final_message"),
    ],
)
def test_value_rules(fields, param):
    assert error_of(check_chat, chat(**fields)).param == param


def test_supported_choices_pass():
    check_chat(
        chat(
            tool_choice="auto",
            tools=[{"type": "function", "function": {"name": "f"}}],
            response_format={"type": "text"},
            best_of=2,
            n=2,
            stop=["a", "b"],
            logprobs=True,
            top_logprobs=20,
            prompt_logprobs=0,
            guided_regex="a+",
        )
    )


@pytest.mark.parametrize(
    "prompt, ok",
    [
        ("text", True),
        (["a", "b"], True),
        ([1, 2, 3], True),
        ([[1, 2], [3]], True),
        ([], False),
        ("", False),
        ([[1], []], False),
        ([1, "a"], False),
        ([True], False),
    ],
)
def test_completion_prompt_shapes(prompt, ok):
    req = decode_request(msgspec.json.encode({"prompt": prompt}), CompletionRequest)
    if ok:
        check_completion(req)
    else:
        assert error_of(check_completion, req).param == "prompt"


def test_suffix_is_refused():
    req = decode_request(b'{"prompt": "x", "suffix": "y"}', CompletionRequest)
    assert error_of(check_completion, req).code == "unsupported_parameter"


def test_logit_bias_and_allowed_token_ids_by_vllms_rules():
    """Keys are integer token ids, biases are clamped to +-100, allowed ids are deduplicated."""
    bias, allowed = token_rules(
        chat(logit_bias={"5": 1.5, "7": -250, "9": 400}, allowed_token_ids=[3, 3, 4]), 10
    )
    assert bias == {5: 1.5, 7: -100.0, 9: 100.0} and allowed == (3, 4)
    assert token_rules(chat(), 10) == (None, None)


@pytest.mark.parametrize(
    "fields, param, says",
    [
        ({"logit_bias": {"five": 1.0}}, "logit_bias", "not 'five'"),
        ({"logit_bias": {"10": 1.0}}, "logit_bias", "in [0, 10)"),
        ({"logit_bias": {str(i): 1.0 for i in range(-8, 0)}}, "logit_bias", "and 3 more"),
        ({"allowed_token_ids": []}, "allowed_token_ids", "must not be empty"),
        ({"allowed_token_ids": [1, 10, -1]}, "allowed_token_ids", "not 10, -1"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_a_400_naming_them(fields, param, says):
    error = error_of(token_rules, chat(**fields), 10)
    assert error.param == param and says in error.message


def test_more_entries_than_the_vocabulary_are_refused_before_any_is_read():
    """A 32 MB body holds millions of ids; more than the vocabulary has cannot all be valid."""
    huge = chat(allowed_token_ids=[1] * 4_000_000, logit_bias={str(i): 1.0 for i in range(11)})
    error = error_of(token_rules, huge, 10)
    assert error.param == "logit_bias" and "11 entries, more than the vocabulary's 10" in error.message
    error = error_of(token_rules, chat(allowed_token_ids=[1] * 4_000_000), 10)
    assert error.param == "allowed_token_ids" and "4000000 entries" in error.message
