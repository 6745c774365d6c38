"""The granite_thinking_parser reasoning parser on Granite 4.2 outputs (format: vLLM's
parser/granite_thinking.py: Nemotron 3's reading, whose template closes the section with
``\\n</think>\\n``)."""

from __future__ import annotations

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.granite_thinking import GraniteThinkingReasoningParser
from dyn.core.parsers.reasoning.nemotron import NemotronV3ReasoningParser

Granite = REASONING_PARSERS.get("granite_thinking_parser")
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def parser(prompt_text=None, **kwargs):
    return lambda: Granite(prompt_text, kwargs)


def test_names():
    assert Granite is GraniteThinkingReasoningParser is REASONING_PARSERS.get("Granite-Thinking-Parser")
    assert issubclass(Granite, NemotronV3ReasoningParser) and Granite is not REASONING_PARSERS.get("granite")


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        (
            "The user asks for 2 + 2. That is 4.\n</think>\n\n2 + 2 = 4.",
            "The user asks for 2 + 2. That is 4.",
            "2 + 2 = 4.",
        ),
        ("Think.\n</think>\n\n" + CALL, "Think.", CALL),
        ("Think about it " + CALL, "Think about it", CALL),  # a call ends the section
        ("Still thinking when max_tokens hit", "Still thinking when max_tokens hit", ""),
    ],
)
def test_thinking_on(check_splits, text, reasoning, content):
    got = check_splits(parser(), text)
    assert (got.reasoning, got.content) == (reasoning, content)


def test_thinking_off_drops_leading_newlines(check_splits):
    got = check_splits(parser(enable_thinking=False), "\n\nAnswer here")
    assert (got.reasoning, got.content) == ("", "Answer here")


def test_force_nonempty_content(check_splits):
    # no text after the reasoning: the reasoning is the content too
    got = check_splits(parser(force_nonempty_content=True), "The user asks</think>")
    assert (got.reasoning, got.content) == ("The user asks", "The user asks")
    # only newlines after it: vLLM counts that as content (Nemotron's reading would not)
    got = check_splits(parser(force_nonempty_content=True), "The user asks\n</think>\n")
    assert (got.reasoning, got.content) == ("The user asks", "")
    got = check_splits(parser(force_nonempty_content=True), "The user asks</think>Answer")
    assert (got.reasoning, got.content) == ("The user asks", "Answer")
