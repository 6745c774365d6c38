"""The inkling tool parser on Inkling outputs, reasoning included (format: vLLM's parser/inkling.py;
recorded strings from vLLM's tests/parser/engine/test_inkling.py)."""

from __future__ import annotations

import json

import pytest

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.inkling import (
    END_MESSAGE,
    END_SAMPLING,
    MESSAGE_MODEL,
    TEXT,
    THINKING,
    TOOL_ERROR,
    TOOL_JSON,
    TOOL_TEXT,
    InklingToolParser,
)

Inkling = TOOL_PARSERS.get("inkling")
WEATHER = Tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})


def parser(prompt_text=None):
    return lambda: Inkling([WEATHER], prompt_text=prompt_text)


def block(name: str, args: str) -> str:
    return f'{TOOL_JSON}{{"name":"{name}","args":{args}}}{END_MESSAGE}'


def test_names():
    assert Inkling is InklingToolParser and Inkling.emits_reasoning and Inkling.needs_special_tokens
    assert TOOL_PARSERS.get("Inkling") is Inkling


def test_reasoning_text_then_call(check_splits):
    # test_inkling.py, test_reasoning_text_tool; the header names the function before its block
    text = (
        f"{THINKING}I should check the weather.{END_MESSAGE}{MESSAGE_MODEL}{TEXT}Let me check.{END_MESSAGE}"
        f"{MESSAGE_MODEL}get_weather" + block("get_weather", '{"city":"SF"}')
    )
    got = check_splits(parser(), text)
    assert (got.reasoning, got.content) == ("I should check the weather.", "Let me check.")
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("get_weather", '{"city":"SF"}', True)]


def test_parallel_calls_then_text(check_splits):
    text = (
        block("a", "{}")
        + MESSAGE_MODEL
        + block("b", '{"x":[1,2]}')
        + f"{MESSAGE_MODEL}{TEXT}done{END_MESSAGE}"
    )
    got = check_splits(parser(), text)
    assert [(c.name, c.arguments) for c in got.calls] == [("a", "{}"), ("b", '{"x":[1,2]}')]
    assert got.content == "done" and got.reasoning == ""


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("hello world", "", "hello world"),  # a header never followed by a block
        ("hello world" + END_SAMPLING, "", "hello world"),
        (f"{TEXT}see {TEXT} token{END_MESSAGE}", "", "see  token"),
        (f"{THINKING}hm{END_MESSAGE}{MESSAGE_MODEL}{TEXT}hi{END_SAMPLING}", "hm", "hi"),
        (
            f"{THINKING}one  {END_MESSAGE}{MESSAGE_MODEL}{THINKING}two {END_MESSAGE}{MESSAGE_MODEL}{TEXT}x",
            "one  two",
            "x",
        ),
        (
            f"{THINKING}a{TEXT}b{END_MESSAGE}",
            f"a{TEXT}b",
            "",
        ),  # other markers are literal in a thinking block
        (f"{TOOL_TEXT}raw{END_MESSAGE}{TOOL_ERROR}err{END_MESSAGE}", "", "rawerr"),
        (f"abc{MESSAGE_MODEL}def", "", "def"),
    ],
)
def test_blocks(check_splits, text, reasoning, content):
    got = check_splits(parser(), text)
    assert (got.reasoning, got.content, got.calls) == (reasoning, content, [])


def test_whitespace_only_content_before_a_call_is_dropped(check_splits):
    got = check_splits(parser(), f"{TEXT}  {END_MESSAGE}{MESSAGE_MODEL}" + block("f", "{}"))
    assert got.content == "" and [c.name for c in got.calls] == ["f"]
    got = check_splits(parser(), f"{TEXT}hi\n{END_MESSAGE}{MESSAGE_MODEL}" + block("f", "{}"))
    assert got.content == "hi\n"


def test_other_call_shapes(check_splits):
    text = f'{TOOL_JSON}{{"args":{{"a":1}},"name":"f"}}{END_MESSAGE}{TOOL_JSON}{{"name":"x"}}{END_SAMPLING}'
    got = check_splits(parser(), text)
    assert [(c.name, c.args) for c in got.calls] == [("f", {"a": 1}), ("x", {})]


def test_malformed_call_is_content(check_splits):
    text = f"{TOOL_JSON}not json{END_MESSAGE}{MESSAGE_MODEL}{TEXT}y{END_MESSAGE}"
    got = check_splits(parser(), text)
    assert got.calls == [] and got.content == f"{TOOL_JSON}not json{END_MESSAGE}y"


def test_cut_off_call(parse):
    got = parse(parser(), [f'{TOOL_JSON}{{"name":"d","args":{{"k":"v"'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("d", '{"k":"v"', False)]


def test_prompt_decides_where_the_output_starts(check_splits):
    got = check_splits(
        parser(f"<|end_message|>{MESSAGE_MODEL}{THINKING}"), f"plan{END_MESSAGE}{MESSAGE_MODEL}{TEXT}ok"
    )
    assert (got.reasoning, got.content) == ("plan", "ok")
    got = check_splits(parser(f"{MESSAGE_MODEL}{TEXT}"), f"plain{END_MESSAGE}")
    assert (got.reasoning, got.content) == ("", "plain")


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"})), ToolCall("noop", "{}")]
    text = Inkling.render(calls)
    assert text == (
        f'{TOOL_JSON}{{"name": "get_weather", "args": {{"city": "Paris"}}}}{END_MESSAGE}'
        f'{MESSAGE_MODEL}{TOOL_JSON}{{"name": "noop", "args": {{}}}}{END_MESSAGE}'
    )
    got = check_splits(parser(), text)
    assert [(c.name, c.arguments) for c in got.calls] == [(c.name, c.arguments) for c in calls]
    assert got.content == ""
