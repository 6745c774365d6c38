"""The plamo3 tool parser on PLaMo 3 outputs (format: vLLM's parser/plamo3.py; recorded strings from
vLLM's tests/parser/engine/test_plamo3.py and tests/tool_parsers/test_plamo3_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.plamo3 import (
    BEGIN_TOOL_ARGUMENTS,
    BEGIN_TOOL_NAME,
    BEGIN_TOOL_REQUEST,
    BEGIN_TOOL_REQUESTS,
    END_THINK,
    END_TOOL_ARGUMENTS,
    END_TOOL_NAME,
    END_TOOL_REQUEST,
    END_TOOL_REQUESTS,
    EOT,
    Plamo3ToolParser,
)

Plamo3 = TOOL_PARSERS.get("plamo3")
WEATHER = Tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})


def with_tools():
    return Plamo3([WEATHER])


def call(name: str, arguments: str) -> str:
    return (
        f"{BEGIN_TOOL_REQUEST}{BEGIN_TOOL_NAME}{name}{END_TOOL_NAME}"
        f"{BEGIN_TOOL_ARGUMENTS}{arguments}{END_TOOL_ARGUMENTS}{END_TOOL_REQUEST}"
    )


def test_names():
    assert Plamo3 is Plamo3ToolParser and Plamo3.needs_special_tokens
    assert TOOL_PARSERS.get("PLaMo3") is Plamo3


def test_content_then_call(check_splits):
    # test_plamo3_tool_parser.py: "Checking the weather." + one call, then the end of the turn
    text = (
        "Checking the weather."
        + BEGIN_TOOL_REQUESTS
        + call("get_weather", '{"city": "Tokyo"}')
        + END_TOOL_REQUESTS
    )
    got = check_splits(with_tools, text)
    assert got.content == "Checking the weather."
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"city": "Tokyo"}', True)
    ]


def test_two_calls_arguments_verbatim(check_splits):
    text = (
        BEGIN_TOOL_REQUESTS
        + call("echo", '{"text": "hi"}')
        + call("sum", '{"a": 1, "b": 2}')
        + END_TOOL_REQUESTS
    )
    got = check_splits(with_tools, text)
    assert [(c.name, c.arguments) for c in got.calls] == [
        ("echo", '{"text": "hi"}'),
        ("sum", '{"a": 1, "b": 2}'),
    ]
    assert got.content == ""


def test_closers_cut_off(check_splits):
    # test_plamo3.py, test_complete_arguments_survive_missing_closers: the object is complete
    head = f"Before tools. {BEGIN_TOOL_REQUESTS}{BEGIN_TOOL_REQUEST}{BEGIN_TOOL_NAME}weather{END_TOOL_NAME}"
    for closing in ("", END_TOOL_ARGUMENTS[:12], END_TOOL_ARGUMENTS + END_TOOL_REQUEST):
        got = check_splits(with_tools, head + BEGIN_TOOL_ARGUMENTS + '{"city":"東京"}' + closing)
        assert got.content == "Before tools. "
        assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
            ("weather", '{"city":"東京"}', True)
        ]


def test_cut_off_arguments_and_cut_off_marker(parse, check_splits):
    text = f'{BEGIN_TOOL_REQUESTS}{BEGIN_TOOL_REQUEST}{BEGIN_TOOL_NAME}sum{END_TOOL_NAME}{BEGIN_TOOL_ARGUMENTS}{{"a": 1'
    got = parse(with_tools, [text])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("sum", '{"a": 1', False)]
    # a section marker cut off at the end is dropped (test_plamo3_tool_parser.py, "Answer<|plamo:begin_")
    got = check_splits(with_tools, "Answer<|plamo:begin_")
    assert got.content == "Answer" and got.calls == []


def test_unreadable_request_is_content(check_splits):
    bad = f"{BEGIN_TOOL_REQUEST}{BEGIN_TOOL_NAME}f{END_TOOL_NAME}{BEGIN_TOOL_ARGUMENTS}[1]{END_TOOL_ARGUMENTS}{END_TOOL_REQUEST}"
    got = check_splits(with_tools, f"{BEGIN_TOOL_REQUESTS}{bad}{END_TOOL_REQUESTS}")
    assert got.calls == [] and got.content == bad


def test_with_the_reasoning_parser(check_splits):
    # test_plamo3.py's output through both parsers, as dyn's output stage runs them
    reasoning = REASONING_PARSERS.get("plamo3")
    text = (
        "<|plamo:begin_think:plamo|>Reasoning. " + END_THINK + "content" + BEGIN_TOOL_REQUESTS
        + call("weather", "{}") + END_TOOL_REQUESTS + EOT
    )  # fmt: skip
    first = check_splits(lambda: reasoning(None, {}), text)
    assert (
        first.reasoning == "Reasoning. "
        and first.content == "content" + BEGIN_TOOL_REQUESTS + call("weather", "{}") + END_TOOL_REQUESTS
    )
    got = check_splits(with_tools, first.content)
    assert got.content == "content" and [(c.name, c.arguments) for c in got.calls] == [("weather", "{}")]


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"})), ToolCall("noop", "{}")]
    text = Plamo3.render(calls)
    assert text.startswith(BEGIN_TOOL_REQUESTS + BEGIN_TOOL_REQUEST + BEGIN_TOOL_NAME + "get_weather")
    got = check_splits(with_tools, text)
    assert [(c.name, c.arguments) for c in got.calls] == [(c.name, c.arguments) for c in calls]
    assert got.content == ""
