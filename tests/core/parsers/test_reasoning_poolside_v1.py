"""The poolside_v1 reasoning parser (core/parsers/reasoning/poolside_v1.py).

Prompts follow Laguna's chat template (the generation prompt ends ``<assistant><think>`` with
``enable_thinking``, ``<assistant></think>`` without); outputs checked against vLLM 0.32's
PoolsideV1ReasoningParser (extract_reasoning, and is_reasoning_end on the prompt's tags).
"""

from __future__ import annotations

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.poolside_v1 import PoolsideV1ReasoningParser
from dyn.core.parsers.reasoning.think import DeepSeekV3ReasoningParser

Poolside = REASONING_PARSERS.get("poolside_v1")

SYSTEM = "〈|EOS|〉<system>You are a helpful assistant.</system>\n"
THINKING = SYSTEM + "<user>Weather in Paris?</user>\n<assistant><think>"
NOT_THINKING = SYSTEM + "<user>Weather in Paris?</user>\n<assistant></think>"
# an earlier turn that closed its section, and a tool description mentioning the tag
HISTORY = (
    SYSTEM.replace("assistant.", "assistant. Never print </think> literally.")
    + "<user>Hi</user>\n<assistant><think>Greet back.</think>Hello!</assistant>\n<user>Weather in Paris?</user>\n"
)
REASONING = "The user wants the weather in Paris, so I will call get_weather."
CALL = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"


def parser(prompt_text: str | None, **kwargs):
    return lambda: Poolside(prompt_text, kwargs or None)


def test_names():
    assert Poolside is PoolsideV1ReasoningParser and REASONING_PARSERS.get("Poolside-V1") is Poolside
    assert issubclass(Poolside, DeepSeekV3ReasoningParser) and Poolside is not REASONING_PARSERS.get(
        "deepseek_v3"
    )


@pytest.mark.parametrize("prompt", [THINKING, HISTORY + "<assistant><think>"])
def test_reasoning_then_call(check_splits, prompt):
    got = check_splits(parser(prompt), REASONING + "</think>" + CALL)
    assert (got.reasoning, got.content) == (REASONING, CALL)


def test_thinking_off_is_content(check_splits):
    text = "It is 24 °C and sunny in Paris."
    assert check_splits(parser(NOT_THINKING), text).content == text
    # a </think> the model writes anyway stays content
    assert check_splits(parser(NOT_THINKING), "a</think>b").content == "a</think>b"


def test_tags_before_the_current_turn_do_not_count(check_splits):
    # the history closed a section; the current turn says nothing: enable_thinking decides
    prompt = HISTORY + "<assistant>"
    got = check_splits(parser(prompt, enable_thinking=True), REASONING + "</think>\n\nIt is sunny.")
    assert (got.reasoning, got.content) == (REASONING, "It is sunny.")
    got = check_splits(parser(prompt), REASONING + "</think>It is sunny.")
    assert (got.reasoning, got.content) == ("", REASONING + "</think>It is sunny.")
    # (vLLM's deepseek_v3 would find the history's </think> and start in content)
    assert Poolside(prompt).opened_by_prompt(prompt) is None
    # the turn's last tag decides even when text follows it (a prefilled start of the reasoning)
    got = check_splits(parser(THINKING + "Okay, "), "the city is Paris.</think>" + CALL)
    assert (got.reasoning, got.content) == ("the city is Paris.", CALL)
    assert Poolside(None).opened_by_prompt(THINKING) is True
    assert Poolside(None).opened_by_prompt(NOT_THINKING) is False


def test_reasoning_cut_off(check_splits):
    got = check_splits(parser(THINKING), "The user wants the weather in")
    assert (got.reasoning, got.content) == ("The user wants the weather in", "")
