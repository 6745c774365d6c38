"""Holo2 reasoning (core/parsers/reasoning/holo2.py): holo2, vLLM's DeepSeek V3 reading with thinking
on by default (vLLM's deepseek_v3_reasoning_parser.DeepSeekV3ReasoningWithThinkingParser; the
Holo2 template opens ``<think>`` in the prompt, as vLLM's former holo2 parser describes)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.holo2 import Holo2ReasoningParser

Holo2 = REASONING_PARSERS.get("holo2")
PROMPT = "<|im_start|>user\nOpen the settings page.<|im_end|>\n<|im_start|>assistant\n<think>\n"
REASONING = "The settings icon is the gear at the top right; I will click it."
ANSWER = '{"action": "click", "x": 1204, "y": 48}'


def parser(prompt_text: str | None = None, **kwargs):
    return lambda: Holo2(prompt_text, kwargs or None)


def test_name_resolves():
    assert Holo2 is Holo2ReasoningParser and Holo2 is not REASONING_PARSERS.get("deepseek_v3")


def test_thinking_by_default(check_splits):
    for make in (parser(PROMPT), parser(), parser(thinking=None)):
        got = check_splits(make, REASONING + "\n</think>\n\n" + ANSWER)
        assert (got.reasoning, got.content) == (REASONING + "\n", ANSWER)


def test_thinking_switched_off(check_splits):
    text = ANSWER
    for make in (
        parser(thinking=False),
        parser(enable_thinking=False),
        parser(thinking=False, enable_thinking=0),
    ):
        got = check_splits(make, text)
        assert (got.reasoning, got.content) == ("", ANSWER)
    got = check_splits(parser(thinking=False, enable_thinking=True), REASONING + "</think>" + ANSWER)
    assert (got.reasoning, got.content) == (REASONING, ANSWER)


def test_reasoning_cut_off_stays_reasoning(check_splits):
    got = check_splits(parser(PROMPT), REASONING[:30])
    assert (got.reasoning, got.content) == (REASONING[:30], "")
