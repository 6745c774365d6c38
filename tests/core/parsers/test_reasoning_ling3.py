"""The ling3 reasoning parser: Ling 3 thinks in GLM's ``<think>`` sections with thinking on by default
(vLLM's parser/ling3.py), so ``ling3`` is dyn's ``glm45``/``glm47``. Recorded strings from vLLM's
tests/parser/engine/test_ling3.py."""

from __future__ import annotations

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import Glm45ReasoningParser

Ling3 = REASONING_PARSERS.get("ling3")


def parser(prompt_text=None, **kwargs):
    return lambda: Ling3(prompt_text, kwargs)


def test_name_resolves_to_glm():
    assert Ling3 is Glm45ReasoningParser is REASONING_PARSERS.get("glm47")


def test_thinking_on_by_default(check_splits):
    got = check_splits(parser(), "<think>reason</think>answer")
    assert (got.reasoning, got.content) == ("reason", "answer")


def test_thinking_off_keeps_everything_as_content(check_splits):
    text = "<think>reason</think>answer"
    for kwargs in ({"enable_thinking": False}, {"thinking": False}):
        got = check_splits(parser(**kwargs), text)
        assert (got.reasoning, got.content) == ("", text)


@pytest.mark.parametrize("text", ["only reasoning", "<think>only reasoning"])
def test_cut_off_reasoning_stays_reasoning(check_splits, text):
    got = check_splits(parser(enable_thinking=True), text)
    assert (got.reasoning, got.content) == ("only reasoning", "")


def test_tool_call_ends_the_section(check_splits):
    text = "I need the weather.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>"
    got = check_splits(parser(), text)
    assert got.reasoning == "I need the weather."
    assert got.content == text[len("I need the weather.") :]
