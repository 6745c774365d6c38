"""MiniMax-M2 reasoning (core/parsers/reasoning/minimax.py): minimax_m2 (= minimax,
minimax_append_think) and vLLM's minimax_m2_append_think."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS

MiniMax = REASONING_PARSERS.get("minimax_m2")
AppendThink = REASONING_PARSERS.get("minimax_m2_append_think")

# MiniMax-M2: the template ends the prompt with "]~b]ai\n<think>\n"; the model writes its
# reasoning, "</think>", then text or "<minimax:tool_call>" blocks (MiniMaxAI/MiniMax-M2 chat
# template and its tool-calling guide)
PROMPT = "]~b]user\nWhat's the weather in Seattle?[e~[\n]~b]ai\n<think>\n"
REASONING = "The user asks about Seattle's weather. I have a get_weather tool; call it with city=Seattle.\n"
CALL = (
    '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Seattle</parameter>\n'
    "</invoke>\n</minimax:tool_call>"
)
OUTPUT = REASONING + "</think>\n\n" + CALL


def test_names():
    assert REASONING_PARSERS.get("minimax") is MiniMax
    assert REASONING_PARSERS.get("minimax_append_think") is MiniMax
    assert REASONING_PARSERS.get("minimax-append-think") is MiniMax
    assert AppendThink is not MiniMax


def test_reasoning_then_tool_call(check_splits):
    for prompt in (PROMPT, None):
        got = check_splits(lambda prompt=prompt: MiniMax(prompt), OUTPUT)
        assert (got.reasoning, got.content) == (REASONING, CALL)


def test_reasoning_then_answer_and_cut_off(check_splits):
    got = check_splits(lambda: MiniMax(PROMPT), REASONING + "</think>\n\nIt's 12°C and rainy in Seattle.")
    assert (got.reasoning, got.content) == (REASONING, "It's 12°C and rainy in Seattle.")
    got = check_splits(lambda: MiniMax(PROMPT), REASONING[:30])
    assert (got.reasoning, got.content) == (REASONING[:30], "")


def test_tool_call_before_end_tag_ends_reasoning(check_splits):
    got = check_splits(lambda: MiniMax(PROMPT), REASONING + CALL)
    assert (got.reasoning, got.content) == (REASONING, CALL)


def test_append_think_keeps_everything_as_content(check_splits, parse):
    # vLLM's minimax_m2_append_think: the "<think>" the template swallowed is put back
    got = check_splits(lambda: AppendThink(PROMPT), OUTPUT)
    assert (got.reasoning, got.content) == ("", "<think>" + OUTPUT)
    assert parse(lambda: AppendThink(prompt_text=PROMPT), []).content == ""
