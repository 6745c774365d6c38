"""Kimi K3 reasoning (core/parsers/reasoning/kimi_k3.py): the XTML think channel."""

from __future__ import annotations

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS

K3 = REASONING_PARSERS.get("kimi_k3")


def parser(prompt_text: str | None = None, **kwargs):
    return lambda: K3(prompt_text, kwargs or None)


# Kimi K3: the template hands the model an open assistant message with the think channel opened;
# the model reasons, closes the channel, answers in the response channel, calls tools in the tools
# channel and closes the message (vLLM's kimi_k3 reasoning and tool parsers)
PROMPT = (
    '<|open|>message role="user"<|sep|>What is the weather in Beijing?<|close|>message<|sep|>'
    '<|end_of_msg|><|open|>message role="assistant"<|sep|><|open|>think<|sep|>'
)
REASONING = "The user wants Beijing's weather. I should call get_weather with city Beijing."
TOOLS = (
    '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
    '<|open|>argument key="city" type="string"<|sep|>Beijing<|close|>argument<|sep|>'
    "<|close|>call<|sep|><|close|>tools<|sep|>"
)
OUTPUT = (
    REASONING
    + "<|close|>think<|sep|><|open|>response<|sep|>Let me check.<|close|>response<|sep|>"
    + TOOLS
    + "<|close|>message<|sep|>"
)


def test_name_and_special_tokens():
    assert K3.name == "kimi_k3" and K3.needs_special_tokens
    assert K3 is not REASONING_PARSERS.get("kimi_k2")


@pytest.mark.parametrize("prompt", [PROMPT, None])
def test_reasoning_then_response_and_tools(check_splits, prompt):
    # the response channel's markers and the message's end are dropped; the tools channel stays
    got = check_splits(parser(prompt), OUTPUT)
    assert (got.reasoning, got.content) == (REASONING, "Let me check." + TOOLS)


def test_reasoning_then_answer_with_the_opener_written_anyway(check_splits):
    text = (
        "<|open|>think<|sep|>A greeting; answer briefly.<|close|>think<|sep|>"
        "<|open|>response<|sep|>Hello! How can I help?<|close|>response<|sep|><|close|>message<|sep|>"
    )
    got = check_splits(parser(PROMPT), text)
    assert (got.reasoning, got.content) == ("A greeting; answer briefly.", "Hello! How can I help?")


def test_cut_off_stays_reasoning(check_splits):
    got = check_splits(parser(PROMPT), REASONING[:40])
    assert (got.reasoning, got.content) == (REASONING[:40], "")


def test_a_channel_opened_before_the_think_channel_closes_ends_it(check_splits):
    got = check_splits(parser(PROMPT), REASONING + "<|open|>response<|sep|>Sunny.<|close|>response<|sep|>")
    assert (got.reasoning, got.content) == (REASONING, "Sunny.")
    got = check_splits(parser(PROMPT), REASONING + TOOLS)
    assert (got.reasoning, got.content) == (REASONING, TOOLS)


@pytest.mark.parametrize("kwargs", [{"thinking": False}, {"enable_thinking": False}])
def test_thinking_off_is_content_without_the_response_markers(check_splits, kwargs):
    text = "<|open|>response<|sep|>Hello! How can I help?<|close|>response<|sep|><|close|>message<|sep|>"
    got = check_splits(parser(None, **kwargs), text)
    assert (got.reasoning, got.content) == ("", "Hello! How can I help?")
    # ``thinking`` decides over ``enable_thinking``
    got = check_splits(parser(None, thinking=True, enable_thinking=False), "Hm.<|close|>think<|sep|>Hi.")
    assert (got.reasoning, got.content) == ("Hm.", "Hi.")


def test_prompt_with_a_closed_think_channel_is_content(check_splits):
    closed = PROMPT + "<|close|>think<|sep|>"
    got = check_splits(parser(closed), "<|open|>response<|sep|>Hi.<|close|>response<|sep|>")
    assert (got.reasoning, got.content) == ("", "Hi.")


def test_markers_with_spaces_around_their_names(check_splits):
    text = "Hmm.<|close|> think <|sep|><|open|> response <|sep|>Yes.<|close|> response <|sep|>"
    got = check_splits(parser(PROMPT), text)
    assert (got.reasoning, got.content) == ("Hmm.", "Yes.")
