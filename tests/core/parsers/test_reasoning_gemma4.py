"""Gemma 4 reasoning (core/parsers/reasoning/gemma4.py): the ``<|channel>thought`` channel."""

from __future__ import annotations

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS

Gemma4 = REASONING_PARSERS.get("gemma4")


def parser(prompt_text: str | None = None, **kwargs):
    return lambda: Gemma4(prompt_text, kwargs or None)


# Gemma 4 with thinking on: the system turn carries "<|think|>", the generation prompt is
# "<|turn>model\n", and the model opens its thought channel itself (Gemma 4's chat template;
# vLLM's gemma4 parser docstring)
PROMPT = (
    "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nWhat is the capital of Australia?<turn|>\n"
    "<|turn>model\n"
)
REASONING = (
    "The user asks for the capital of Australia. Many people guess Sydney, but the capital is "
    "Canberra, chosen as a compromise between Sydney and Melbourne."
)
ANSWER = "The capital of Australia is **Canberra**."
OUTPUT = "<|channel>thought\n" + REASONING + "\n<channel|>" + ANSWER
CALL = '<|tool_call>call:get_weather{location:<|"|>Canberra<|"|>}<tool_call|>'


def test_name_and_special_tokens():
    assert Gemma4.name == "gemma4" and Gemma4.needs_special_tokens


@pytest.mark.parametrize("prompt", [PROMPT, None])
def test_thought_channel_then_answer(check_splits, prompt):
    got = check_splits(parser(prompt), OUTPUT)
    assert (got.reasoning, got.content) == (REASONING, ANSWER)


def test_content_only_and_cut_off(check_splits):
    # without a thought channel the output is the answer (thinking off, the E-series templates)
    got = check_splits(parser(PROMPT), ANSWER)
    assert (got.reasoning, got.content) == ("", ANSWER)
    got = check_splits(parser(PROMPT), "thoughtful answers take time.")
    assert (got.reasoning, got.content) == ("", "thoughtful answers take time.")
    got = check_splits(parser(PROMPT), OUTPUT[:60])
    assert (got.reasoning, got.content) == (OUTPUT[len("<|channel>thought\n") : 60], "")


def test_tool_call_inside_the_channel_ends_it(check_splits):
    got = check_splits(parser(PROMPT), "<|channel>thought\nI need the weather.\n" + CALL)
    assert (got.reasoning, got.content) == ("I need the weather.", CALL)
    got = check_splits(parser(PROMPT), "<|channel>thought\nI need the weather.<channel|>" + CALL)
    assert (got.reasoning, got.content) == ("I need the weather.", CALL)


def test_prompt_that_leaves_the_channel_open(check_splits):
    # after a tool response the template reopens the channel: the output starts inside it
    prompt = (
        PROMPT + CALL + "<|tool_response>response:get_weather{temperature:18}<tool_response|>"
        "<|channel>thought\n"
    )
    got = check_splits(parser(prompt), "It is 18 degrees.<channel|>It's 18°C in Canberra.")
    assert (got.reasoning, got.content) == ("It is 18 degrees.", "It's 18°C in Canberra.")
    # the opener written again, and a cut-off, stay in the section
    got = check_splits(parser(prompt), "<|channel>thought\nIt is 18")
    assert (got.reasoning, got.content) == ("It is 18", "")
    # an earlier, closed channel in the history does not open one
    history = (
        PROMPT + "<|channel>thought\nOld.<channel|>Old answer.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    )
    got = check_splits(parser(history), "Hello!")
    assert (got.reasoning, got.content) == ("", "Hello!")


def test_prompt_with_a_closed_empty_channel_is_content(check_splits):
    # the larger models' template with thinking off ends with an empty channel
    closed = "<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    got = check_splits(parser(closed, enable_thinking=False), "Hello! <channel|> stays.")
    assert (got.reasoning, got.content) == ("", "Hello! <channel|> stays.")


def test_output_starting_with_the_channel_name_is_reasoning(check_splits):
    # the opener was not kept in the text: "thought\n" still names the channel (as vLLM reads it)
    got = check_splits(parser(PROMPT), "thought\n" + REASONING + "<channel|>" + ANSWER)
    assert (got.reasoning, got.content) == (REASONING, ANSWER)


def test_channel_without_a_name_later_channels_and_stray_end(check_splits):
    got = check_splits(parser(PROMPT), "<|channel>" + REASONING + "<channel|>" + ANSWER)
    assert (got.reasoning, got.content) == (REASONING, ANSWER)
    got = check_splits(parser(PROMPT), "Let me check.<|channel>thought\nHmm.<channel|>Done.<channel|> Bye.\n")
    assert (got.reasoning, got.content) == ("Hmm.", "Let me check.Done. Bye.\n")
