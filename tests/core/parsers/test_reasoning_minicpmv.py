"""The minicpmv reasoning parser on MiniCPM-V 4.5 outputs (format: vLLM's parser/minicpmv.py and its
template_minicpmv45.jinja; the escaped-newline cases follow vLLM's
tests/parser/engine/test_minicpmv_reasoning.py)."""

from __future__ import annotations

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.minicpmv import MiniCPMVReasoningParser
from dyn.core.parsers.reasoning.think import Qwen3ReasoningParser

MiniCPMV = REASONING_PARSERS.get("minicpmv")
PROMPT = "<|im_start|>user\nWrite a haiku.<|im_end|>\n<|im_start|>assistant\n"


def parser(prompt_text=PROMPT, **kwargs):
    return lambda: MiniCPMV(prompt_text, kwargs)


def test_names():
    assert MiniCPMV is MiniCPMVReasoningParser and issubclass(MiniCPMV, Qwen3ReasoningParser)
    assert REASONING_PARSERS.get("MiniCPMV") is MiniCPMV


def test_reasoning_then_answer_with_escaped_newlines(check_splits):
    text = "The user wants a haiku.\\nFirst line: five syllables.</think>Autumn moonlight—\\na worm digs silently<|im_end|>"
    got = check_splits(parser(), text)
    assert got.reasoning == "The user wants a haiku.\nFirst line: five syllables."
    assert got.content == "Autumn moonlight—\na worm digs silently"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Use ```py\\nprint(1)\\n``` then\\nrun", "Use ```py\\nprint(1)\\n``` then\nrun"),
        ("inline `a\\nb` and $x\\ny$ and \\(p\\nq\\)", "inline `a\\nb` and $x\\ny$ and \\(p\\nq\\)"),
        ("a \\\\n stays, \\r\\n and \\r become newlines", "a \\\\n stays, \n and \n become newlines"),
        ("ends with a backslash \\", "ends with a backslash \\"),
        ("x<reserved_12>y<|reserved_15|>z", "xyz"),
    ],
)
def test_content_recovery(check_splits, answer, expected):
    got = check_splits(parser(), "Hm.</think>" + answer)
    assert (got.reasoning, got.content) == ("Hm.", expected)


def test_tool_calls_are_left_alone(check_splits):
    call = "<tool_call>\n<function=run>\n<parameter=code>\nprint('a\\nb')\n</parameter>\n</function>\n</tool_call>"
    got = check_splits(parser(), "Need to run it.</think>Running.\\n" + call)
    assert (got.reasoning, got.content) == ("Need to run it.", "Running.\n" + call)


def test_cut_off_reasoning(check_splits):
    got = check_splits(parser(PROMPT + "<think>\n"), "Still\\nthinking<|im_")
    assert (got.reasoning, got.content) == ("Still\nthinking<|im_", "")


def test_thinking_off_drops_a_written_section(check_splits):
    prompt = PROMPT + "<think>\n\n</think>\n\n"
    got = check_splits(
        parser(prompt, enable_thinking=False), "<think>hidden\\nstuff</think>\\n\\nVisible\\nanswer<|im_end|>"
    )
    assert (got.reasoning, got.content) == ("", "\n\nVisible\nanswer")
    got = check_splits(parser(prompt, enable_thinking=False), "Plain\\nanswer")
    assert (got.reasoning, got.content) == ("", "Plain\nanswer")
