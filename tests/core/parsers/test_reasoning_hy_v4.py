"""HYV4 reasoning (core/parsers/reasoning/hy.py): hy_v4, on outputs in the shapes of vLLM's
hy_v4_reasoning_parser.py and its tests (tags with the checkpoint's ``:opensource`` suffix; the
template opens ``<think:opensource>`` in the prompt; ``reasoning_effort`` defaults to ``high``)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.hy import HyV4ReasoningParser

HyV4 = REASONING_PARSERS.get("hy_v4")
S = ":opensource"
PROMPT = f"<｜hy_User｜>Hi<｜hy_Assistant｜><think{S}>"
NO_THINK_PROMPT = f"<｜hy_User｜>Hi<｜hy_Assistant｜><think{S}></think{S}>"


def parser(prompt_text: str | None = None, **kwargs):
    return lambda: HyV4(prompt_text, kwargs or None)


def test_name_resolves():
    assert HyV4 is HyV4ReasoningParser and REASONING_PARSERS.get("hy-v4") is HyV4ReasoningParser
    assert HyV4 is not REASONING_PARSERS.get("hy_v3")


def test_reasoning_then_content(check_splits):
    text = f"The user greets me; I will greet back.</think{S}>Hello! How can I help?"
    got = check_splits(parser(PROMPT), text)
    assert (got.reasoning, got.content) == (
        "The user greets me; I will greet back.",
        "Hello! How can I help?",
    )


def test_thinking_is_on_by_default_and_no_think_turns_it_off(check_splits):
    text = "Greeting.</think>Hello!"
    got = check_splits(parser(), text)  # no prompt: unsuffixed tags, high effort
    assert (got.reasoning, got.content) == ("Greeting.", "Hello!")
    got = check_splits(parser(reasoning_effort="no_think"), text)
    assert (got.reasoning, got.content) == ("", text)
    got = check_splits(parser(NO_THINK_PROMPT), "Hello!")
    assert (got.reasoning, got.content) == ("", "Hello!")


def test_reasoning_cut_off_stays_reasoning(check_splits):
    got = check_splits(parser(PROMPT), "The user greets me; I will")
    assert (got.reasoning, got.content) == ("The user greets me; I will", "")
