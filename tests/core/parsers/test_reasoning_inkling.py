"""The inkling reasoning parser on Inkling outputs (format: vLLM's parser/inkling.py; recorded strings
from vLLM's tests/parser/engine/test_inkling.py)."""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.inkling import InklingReasoningParser
from dyn.core.parsers.tool.inkling import END_MESSAGE, END_SAMPLING, MESSAGE_MODEL, TEXT, THINKING, TOOL_JSON

Inkling = REASONING_PARSERS.get("inkling")


def parser(prompt_text=None):
    return lambda: Inkling(prompt_text, {})


def test_names():
    assert Inkling is InklingReasoningParser and Inkling.needs_special_tokens


def test_reasoning_then_text(check_splits):
    text = f"{THINKING}plan{END_MESSAGE}{MESSAGE_MODEL}{TEXT}Let me look.{END_MESSAGE}"
    got = check_splits(parser(MESSAGE_MODEL), text)
    assert (got.reasoning, got.content) == ("plan", "Let me look.")


def test_call_block_stays_content(check_splits):
    call = f'{TOOL_JSON}{{"name":"get_weather","args":{{"city":"SF"}}}}{END_MESSAGE}'
    text = f"{THINKING}I should check.  {END_MESSAGE}{MESSAGE_MODEL}{TEXT}Let me check.{END_MESSAGE}{MESSAGE_MODEL}get_weather{call}"
    got = check_splits(parser(), text)
    assert (got.reasoning, got.content) == ("I should check.", "Let me check." + call)


def test_several_thinking_blocks_and_end_sampling(check_splits):
    text = f"{THINKING}one{END_MESSAGE}{MESSAGE_MODEL}{TEXT}mid{END_MESSAGE}{MESSAGE_MODEL}{THINKING}two{END_SAMPLING}"
    got = check_splits(parser(), text)
    assert (got.reasoning, got.content) == ("onetwo", "mid")


def test_cut_off_reasoning_and_plain_text(check_splits):
    got = check_splits(parser(), f"{THINKING}still thinking  ")
    assert (got.reasoning, got.content) == ("still thinking", "")
    got = check_splits(parser(), "hello world")
    assert (got.reasoning, got.content) == ("", "hello world")
    got = check_splits(parser(f"{MESSAGE_MODEL}{THINKING}"), "deep thought")
    assert (got.reasoning, got.content) == ("deep thought", "")
