"""K2 Horizon reasoning (core/parsers/reasoning/k2_horizon.py): the effort's tags, then the answer
or a tool-call group (outputs in the shape of vLLM's tests/reasoning/test_k2_horizon_reasoning_parser.py;
the prompt ends as the model's chat template ends it, with the effort's opening tag)."""

from __future__ import annotations

import pytest

from dyn.core.parsers.reasoning import REASONING_PARSERS

K2 = REASONING_PARSERS.get("k2_horizon")

PROMPT = "<|ifm|im_start|>user\nWeather in Tokyo?<|ifm|im_end|>\n<|ifm|im_start|>assistant\n"
OPENERS = {"high": "<ifm|think>", "medium": "<ifm|think_fast>", "low": "<ifm|think_faster>"}
CLOSERS = {"high": "</ifm|think>", "medium": "</ifm|think_fast>", "low": "</ifm|think_faster>"}
REASONING = "The user wants Tokyo's weather; I have a get_weather tool, so I'll call it."
ANSWER = "It's 18°C and sunny in Tokyo."
GROUP = (
    "<ifm|tool_calls>\n<ifm|tool_call>get_weather\n<ifm|arg_key>city</ifm|arg_key>\n"
    "<ifm|arg_value>Tokyo</ifm|arg_value>\n</ifm|tool_call>\n</ifm|tool_calls>"
)


def parser(prompt_text: str | None = None, **kwargs):
    return lambda: K2(prompt_text, kwargs or None)


@pytest.mark.parametrize("effort", ["high", "medium", "low"])
def test_reasoning_then_answer_at_each_effort(check_splits, effort):
    text = REASONING + CLOSERS[effort] + ANSWER
    for make in (parser(PROMPT + OPENERS[effort]), parser(reasoning_effort=effort)):
        got = check_splits(make, text)
        assert (got.reasoning, got.content) == (REASONING, ANSWER)


def test_another_efforts_end_tag_is_reasoning(check_splits):
    # as in vLLM, only the end tag of the effort asked for ends the section
    got = check_splits(parser(PROMPT + "<ifm|think>"), REASONING + "</ifm|think_fast>" + ANSWER)
    assert (got.reasoning, got.content) == (REASONING + "</ifm|think_fast>" + ANSWER, "")


def test_a_tool_group_ends_the_section(check_splits):
    got = check_splits(parser(PROMPT + "<ifm|think>"), REASONING + "\n" + GROUP)
    assert (got.reasoning, got.content) == (REASONING + "\n", GROUP)
    got = check_splits(parser(PROMPT + "<ifm|think>"), REASONING + "</ifm|think>\n\n" + GROUP)
    assert (got.reasoning, got.content) == (REASONING, GROUP)


def test_a_start_tag_written_anyway_is_dropped(check_splits):
    got = check_splits(
        parser(reasoning_effort="low"), "<ifm|think_faster>" + REASONING + "</ifm|think_faster>" + ANSWER
    )
    assert (got.reasoning, got.content) == (REASONING, ANSWER)


def test_reasoning_cut_off_stays_reasoning(check_splits):
    # vLLM's unary path would return it as content; its streaming path, like this one, as reasoning
    got = check_splits(parser(PROMPT + "<ifm|think>"), REASONING)
    assert (got.reasoning, got.content) == (REASONING, "")


def test_the_prompt_decides_over_the_effort(check_splits):
    text = REASONING + "</ifm|think_fast>" + ANSWER
    got = check_splits(parser(PROMPT + "<ifm|think_fast>", reasoning_effort="high"), text)
    assert (got.reasoning, got.content) == (REASONING, ANSWER)
    # an effort vLLM rejects: high's tags
    got = check_splits(parser(reasoning_effort="extreme"), REASONING + "</ifm|think>" + ANSWER)
    assert (got.reasoning, got.content) == (REASONING, ANSWER)


def test_a_section_closed_in_the_prompt_makes_the_output_content(check_splits):
    got = check_splits(parser(PROMPT + "<ifm|think_fast></ifm|think_fast>"), ANSWER)
    assert (got.reasoning, got.content) == ("", ANSWER)


def test_constrained_output_is_content(check_splits):
    got = check_splits(lambda: K2(None, None, constrained=True), '{"city": "Tokyo"}')
    assert (got.reasoning, got.content) == ("", '{"city": "Tokyo"}')


def test_name_and_classes():
    assert K2.name == "k2_horizon" and REASONING_PARSERS.get("K2-Horizon") is K2
    assert K2 is not REASONING_PARSERS.get("kimi_k2") and not K2.needs_special_tokens
    low = K2(PROMPT + "<ifm|think_faster>")
    assert isinstance(low, K2) and low.end_tags == ("</ifm|think_faster>",) and low.name == "k2_horizon"
    assert K2(None, {"reasoning_effort": "medium"}).end_tags == ("</ifm|think_fast>",)
