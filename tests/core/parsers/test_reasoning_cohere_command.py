"""Cohere Command reasoning (core/parsers/reasoning/cohere_command.py): cohere_command3 and
cohere_command4 run alone, on Command A outputs (format: the chat templates cohere-ai/melody
gen/templates/jinja/cmd3-hf.jinja and cmd4-hf.jinja; expected values checked against melody's
cmd3 / cmd4 presets, which vLLM reads them with)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.cohere_command import (
    CohereCommand3ReasoningParser,
    CohereCommand4ReasoningParser,
)
from dyn.core.parsers.tool import TOOL_PARSERS

Command3 = REASONING_PARSERS.get("cohere_command3")
Command4 = REASONING_PARSERS.get("cohere_command4")

PLAN_THEN_CALL = (
    "<|START_THINKING|>I will look up the weather in Toronto and Paris. <|END_THINKING|>"
    "<|START_ACTION|>[\n"
    '    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"location": "Toronto"}}\n'
    "]<|END_ACTION|>"
)
GROUNDED_ANSWER = (
    "<|START_THINKING|>I have the results.<|END_THINKING|>"
    "<|START_RESPONSE|>It is <co>20°C and sunny</co: 0:[0]> in Toronto.\n<|END_RESPONSE|>"
)


def parser(cls, prompt_text: str | None = None):
    return lambda: cls(prompt_text)


def test_names_resolve():
    assert Command3 is CohereCommand3ReasoningParser and Command4 is CohereCommand4ReasoningParser
    assert REASONING_PARSERS.get("Cohere-Command3") is Command3
    assert Command3.needs_special_tokens and Command4.needs_special_tokens
    # the tool parsers of the same names read the reasoning themselves
    assert TOOL_PARSERS.get("cohere_command3").emits_reasoning


def test_grounded_answer(check_splits):
    got = check_splits(parser(Command3), GROUNDED_ANSWER)
    assert (got.reasoning, got.content) == ("I have the results.", "It is 20°C and sunny in Toronto.")


def test_calls_are_dropped_when_no_tool_parser_runs(check_splits):
    got = check_splits(parser(Command3), PLAN_THEN_CALL)
    assert (got.reasoning, got.content, got.calls) == (
        "I will look up the weather in Toronto and Paris.",
        "",
        [],
    )


def test_command4_starts_in_the_reasoning(check_splits):
    text = "The user greets me.<|END_THINKING|><|START_TEXT|>Hello! How can I help?<|END_TEXT|>"
    got = check_splits(parser(Command4), text)
    assert (got.reasoning, got.content) == ("The user greets me.", "Hello! How can I help?")
    # cut off by max_tokens: still reasoning
    got = check_splits(parser(Command4), "Hmm, let me think")
    assert (got.reasoning, got.content) == ("Hmm, let me think", "")
    # its template with reasoning off closes an empty section in the prompt
    prompt = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"
    got = check_splits(parser(Command4, prompt), "Hello!")
    assert (got.reasoning, got.content) == ("", "Hello!")


def test_command3_starts_in_the_answer(check_splits):
    got = check_splits(parser(Command3), "Hi there.")
    assert (got.reasoning, got.content) == ("", "Hi there.")
    got = check_splits(parser(Command3, "...<|START_THINKING|>"), "Hmm.<|END_THINKING|>Hi.")
    assert (got.reasoning, got.content) == ("Hmm.", "Hi.")


def test_unreadable_action_block_stays_content(check_splits):
    text = "<|START_RESPONSE|>Hi<|END_RESPONSE|><|START_ACTION|>not json<|END_ACTION|>"
    got = check_splits(parser(Command3), text)
    assert (got.reasoning, got.content) == ("", "Hi<|START_ACTION|>not json<|END_ACTION|>")
