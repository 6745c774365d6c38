"""DeepSeek V4 reasoning (core/parsers/reasoning/deepseek_v4.py): deepseek_v4 and deepseek_v41."""

from __future__ import annotations

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS

V4 = REASONING_PARSERS.get("deepseek_v4")
V41 = REASONING_PARSERS.get("deepseek_v41")


def parser(cls, prompt_text: str | None = None, **kwargs):
    return lambda: cls(prompt_text, kwargs or None)


# DeepSeek V4 in thinking mode: the template opens the section after "<｜Assistant｜>", the model
# reasons, closes it, then calls a tool in DSML (the format of vLLM's deepseek_v4 parser docstring)
PROMPT = "<｜begin▁of▁sentence｜><｜User｜>How is the weather in Hangzhou?<｜Assistant｜><think>"
REASONING = (
    "The user asks about the weather in Hangzhou. I have a get_weather tool that takes a location, "
    "so I'll call it with 杭州 and report back."
)
CALL = (
    "<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="location" string="true">杭州</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)
ANSWER = "It's 24°C and cloudy in Hangzhou today."


def test_names():
    assert V4.name == "deepseek_v4" and V41.name == "deepseek_v41"
    assert V4 is not REASONING_PARSERS.get("deepseek_v3") and V41 is not V4
    assert V4.needs_special_tokens


@pytest.mark.parametrize("prompt", [PROMPT, None])
def test_reasoning_then_tool_call(check_splits, prompt):
    got = check_splits(parser(V4, prompt), REASONING + "\n</think>\n\n" + CALL)
    assert (got.reasoning, got.content) == (REASONING, CALL)


def test_reasoning_then_answer_and_a_start_tag_written_anyway(check_splits):
    got = check_splits(parser(V4, PROMPT), REASONING + "</think>" + ANSWER)
    assert (got.reasoning, got.content) == (REASONING, ANSWER)
    # without the prompt the model may open the section itself; the tag is dropped
    got = check_splits(parser(V4), "<think>\n" + REASONING + "\n</think>\n" + ANSWER)
    assert (got.reasoning, got.content) == ("\n" + REASONING, ANSWER)


@pytest.mark.parametrize("opener", ["<｜DSML｜tool_calls>", "<｜DSML｜toolcalls>", "<｜DSML｜tool>"])
def test_a_tool_block_inside_the_section_ends_it(check_splits, opener):
    block = CALL.replace("<｜DSML｜tool_calls>", opener, 1)
    got = check_splits(parser(V4, PROMPT), REASONING + "\n\n" + block)
    assert (got.reasoning, got.content) == (REASONING, block)


def test_cut_off_stays_reasoning(check_splits):
    got = check_splits(parser(V4, PROMPT), REASONING[:70])
    assert (got.reasoning, got.content) == (REASONING[:70], "")


@pytest.mark.parametrize(
    "kwargs", [{"thinking": False}, {"enable_thinking": False}, {"reasoning_effort": "none"}]
)
def test_thinking_off_is_content(check_splits, kwargs):
    got = check_splits(parser(V4, None, **kwargs), ANSWER + " </think>")
    assert (got.reasoning, got.content) == ("", ANSWER + " </think>")


def test_thinking_on_by_either_key_and_a_closed_prompt(check_splits):
    got = check_splits(parser(V4, None, thinking=False, enable_thinking=True), "Hm.</think>" + ANSWER)
    assert (got.reasoning, got.content) == ("Hm.", ANSWER)
    got = check_splits(parser(V4, None, reasoning_effort="high"), "Hm.</think>" + ANSWER)
    assert (got.reasoning, got.content) == ("Hm.", ANSWER)
    # the non-thinking template closes an empty section: the output is content, verbatim
    closed = "<｜User｜>Hi<｜Assistant｜></think>"
    got = check_splits(parser(V4, closed), "Hello! <think> is a tag.")
    assert (got.reasoning, got.content) == ("", "Hello! <think> is a tag.")


def test_later_section_and_stray_end_tag(check_splits):
    got = check_splits(parser(V4, PROMPT), "First.</think>Checking.<think>Second.</think>Done.</think>")
    assert (got.reasoning, got.content) == ("First.Second.", "Checking.Done.")


def test_v41_spaced_block_opener_ends_the_section(check_splits):
    block = '<｜DSML｜ calls>\n<｜DSML｜ invoke name="get_weather">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>'
    got = check_splits(parser(V41, PROMPT), REASONING + "\n" + block)
    assert (got.reasoning, got.content) == (REASONING, block)
    # V4's opener is reasoning text to V4.1
    got = check_splits(parser(V41, PROMPT), "x " + CALL)
    assert (got.reasoning, got.content) == ("x " + CALL, "")
