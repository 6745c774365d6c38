"""Hy3 reasoning (core/parsers/reasoning/hy.py): hy_v3, on outputs of tencent/Hy3-preview, whose
template opens ``<think>`` at the end of the prompt for ``reasoning_effort`` ``low``/``high`` and closes
an empty section for ``no_think``, its default (vLLM's hy_v3_reasoning_parser.py)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.hy import HyV3ReasoningParser, prompt_suffix
from tests.core.parsers.test_hy_v3 import Vocabulary

HyV3 = REASONING_PARSERS.get("hy_v3")


def parser(prompt_text: str | None = None, **kwargs):
    return lambda: HyV3(prompt_text, kwargs or None)


ASSISTANT = "<｜hy_User｜>What is the weather in Beijing?<｜hy_Assistant｜>"
THINKING_PROMPT = ASSISTANT + "<think>"
NO_THINK_PROMPT = ASSISTANT + "<think></think>"
REASONING = "The user asks about the weather in Beijing. I should call get_weather with the city."
CALL = "<tool_calls>\n<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n</tool_call>\n</tool_calls>"


def test_name_resolves():
    assert HyV3 is HyV3ReasoningParser and REASONING_PARSERS.get("HY-V3") is HyV3ReasoningParser
    assert not HyV3.needs_special_tokens


def test_reasoning_then_a_tool_call(check_splits):
    got = check_splits(parser(THINKING_PROMPT, reasoning_effort="high"), REASONING + "</think>\n\n" + CALL)
    assert (got.reasoning, got.content) == (REASONING, CALL)


def test_reasoning_effort_decides_without_a_prompt(check_splits):
    text = REASONING + "</think>\nIt is sunny."
    got = check_splits(parser(reasoning_effort="low"), text)
    assert (got.reasoning, got.content) == (REASONING, "It is sunny.")
    # no_think, the default: all content, as vLLM's identity reading
    for make in (parser(), parser(reasoning_effort="no_think")):
        got = check_splits(make, text)
        assert (got.reasoning, got.content) == ("", text)


def test_the_prompt_decides_first(check_splits):
    got = check_splits(parser(NO_THINK_PROMPT, reasoning_effort="high"), "It is sunny.")
    assert (got.reasoning, got.content) == ("", "It is sunny.")
    got = check_splits(parser(THINKING_PROMPT), REASONING + "</think>It is sunny.")
    assert (got.reasoning, got.content) == (REASONING, "It is sunny.")


def test_reasoning_cut_off_stays_reasoning(check_splits):
    got = check_splits(parser(THINKING_PROMPT, reasoning_effort="high"), "<think>" + REASONING[:40])
    assert (got.reasoning, got.content) == (REASONING[:40], "")


def test_suffixed_tags_are_read_from_the_prompt(check_splits):
    assert prompt_suffix(ASSISTANT + "<think:opensource>") == ":opensource"
    assert prompt_suffix(ASSISTANT + "<think:opensource></think:opensource>") == ":opensource"
    assert prompt_suffix(ASSISTANT) == "" and prompt_suffix(THINKING_PROMPT) == ""
    prompt = ASSISTANT + "<think:opensource>"
    got = check_splits(parser(prompt, reasoning_effort="high"), REASONING + "</think:opensource>It is sunny.")
    assert (got.reasoning, got.content) == (REASONING, "It is sunny.")
    # there a bare end tag is text
    got = check_splits(parser(prompt, reasoning_effort="high"), "a</think>b")
    assert (got.reasoning, got.content) == ("a</think>b", "")
    assert isinstance(HyV3(prompt), HyV3ReasoningParser)


def test_suffixed_tags_are_read_from_the_vocabulary_first(check_splits):
    """With the served model's tokenizer, its vocabulary names the suffix, as in vLLM; a prompt
    whose think tags carry none does not override it."""

    def make():
        return HyV3(ASSISTANT, {"reasoning_effort": "high"}, tokenizer=Vocabulary(":opensource"))

    got = check_splits(make, REASONING + "</think:opensource>It is sunny.")
    assert (got.reasoning, got.content) == (REASONING, "It is sunny.")
    got = check_splits(make, "a</think>b")
    assert (got.reasoning, got.content) == ("a</think>b", "")
    assert HyV3ReasoningParser.takes_tokenizer
