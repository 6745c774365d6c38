"""The plamo3 reasoning parser on PLaMo 3 outputs (format: vLLM's parser/plamo3.py; recorded strings
from vLLM's tests/parser/engine/test_plamo3.py)."""

from __future__ import annotations

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.plamo3 import Plamo3ReasoningParser

Plamo3 = REASONING_PARSERS.get("plamo3")
BEGIN = "<|plamo:begin_think:plamo|>"
END = "<|plamo:end_think:plamo|>"
EOT = "<|plamo:tag|>"
TOOLS = "<|plamo:begin_tool_requests:plamo|>"


def parser(prompt_text=None, **kwargs):
    return lambda: Plamo3(prompt_text, kwargs)


def test_names():
    assert Plamo3 is Plamo3ReasoningParser and Plamo3.needs_special_tokens


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BEGIN + "Reasoning." + END + "Answer.", ("Reasoning.", "Answer.")),
        ("Answer.", ("Answer.", "")),  # thinking on and no end marker: all reasoning
        (BEGIN + "Reasoning. " + END + "Before tools. " + EOT, ("Reasoning. ", "Before tools. ")),
        (END + "a < b" + EOT, ("", "a < b")),
        (END + "answer" + BEGIN + "new reasoning", ("new reasoning", "answer")),
    ],
)
def test_thinking_on(check_splits, text, expected):
    got = check_splits(parser(), text)
    assert (got.reasoning, got.content) == expected


def test_thinking_off_is_content_but_the_end_of_turn(check_splits):
    text = BEGIN + "Reasoning." + END + "Answer."
    got = check_splits(parser(enable_thinking=False), text + EOT)
    assert (got.reasoning, got.content) == ("", text)


def test_tool_section_ends_reasoning(check_splits):
    rest = TOOLS + "<|plamo:begin_tool_request:plamo|>"
    got = check_splits(parser(), "reasoning" + rest)
    assert (got.reasoning, got.content) == ("reasoning", rest)


@pytest.mark.parametrize("suffix", ["<|plamo:end_", "<|plamo:end_think"])
def test_marker_cut_off_at_the_end_is_dropped(check_splits, suffix):
    got = check_splits(parser(), "visible" + suffix)
    assert (got.reasoning, got.content) == ("visible", "")
    got = check_splits(parser(), END + "Answer" + suffix)
    assert (got.reasoning, got.content) == ("", "Answer")
