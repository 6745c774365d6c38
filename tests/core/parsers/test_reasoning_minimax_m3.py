"""MiniMax M3 reasoning (core/parsers/reasoning/minimax_m3.py): ``<mm:think>`` sections."""

from __future__ import annotations

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS

M3 = REASONING_PARSERS.get("minimax_m3")


def parser(prompt_text: str | None = None, **kwargs):
    return lambda: M3(prompt_text, kwargs or None)


# MiniMax M3: "<mm:think>reasoning</mm:think>answer"; with thinking_mode "enabled" the template
# writes the "<mm:think>" itself (vLLM's minimax_m3 parser docstring)
REASONING = "17 × 23: 17 × 20 = 340 and 17 × 3 = 51, so the product is 391."
ANSWER = "17 × 23 = **391**."
OUTPUT = "<mm:think>" + REASONING + "</mm:think>" + ANSWER


def test_name():
    assert M3.name == "minimax_m3" and M3 is not REASONING_PARSERS.get("minimax_m2")


@pytest.mark.parametrize("mode", [None, "adaptive", "disabled"])
def test_model_opened_section_then_answer(check_splits, mode):
    make = parser(None, thinking_mode=mode) if mode else parser()
    got = check_splits(make, OUTPUT)
    assert (got.reasoning, got.content) == (REASONING, ANSWER)


def test_content_only_and_cut_off(check_splits):
    got = check_splits(parser(None, thinking_mode="adaptive"), ANSWER)
    assert (got.reasoning, got.content) == ("", ANSWER)
    got = check_splits(parser(), OUTPUT[:40])
    assert (got.reasoning, got.content) == (OUTPUT[len("<mm:think>") : 40], "")


def test_enabled_thinking_starts_inside_the_section(check_splits):
    for make in (parser(None, thinking_mode="enabled"), parser("]~b]ai\n<mm:think>")):
        got = check_splits(make, REASONING + "</mm:think>" + ANSWER)
        assert (got.reasoning, got.content) == (REASONING, ANSWER)
        got = check_splits(make, "<mm:think>" + REASONING[:30])  # written anyway, then cut off
        assert (got.reasoning, got.content) == (REASONING[:30], "")


def test_stray_end_tag_dropped_and_one_section_only(check_splits):
    got = check_splits(parser(), "</mm:think>" + ANSWER)
    assert (got.reasoning, got.content) == ("", ANSWER)
    # after a prompt that closed the section, too: M3's output is read the same whatever the prompt
    got = check_splits(parser("]~b]ai\n<mm:think>\n\n</mm:think>\n\n"), "</mm:think>" + ANSWER)
    assert (got.reasoning, got.content) == ("", ANSWER)
    got = check_splits(parser(), "Sure. " + OUTPUT + " <mm:think>not a section</mm:think>")
    assert (got.reasoning, got.content) == (REASONING, "Sure. " + ANSWER + " <mm:think>not a section")
