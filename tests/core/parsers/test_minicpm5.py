"""The minicpm5 tool parser on MiniCPM5 outputs (format: vLLM's
tool_parsers/minicpm5xml_tool_parser.py; recorded strings from vLLM's
tests/tool_parsers/test_minicpm5xml_tool_parser.py)."""

from __future__ import annotations

import json

import pytest

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.minicpm5 import MiniCPM5ToolParser

MiniCPM5 = TOOL_PARSERS.get("minicpm5")
WEATHER = Tool(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "date": {"type": "string"}},
        "required": ["city"],
    },
)
SUM = Tool(
    "sum_values",
    {
        "type": "object",
        "properties": {"nums": {"type": "array"}, "exact": {"type": "boolean"}},
        "required": ["nums"],
    },
)
NOOP = Tool("noop", {"type": "object", "properties": {"note": {"type": "string"}}, "required": []})


def with_tools():
    return MiniCPM5([WEATHER, SUM, NOOP])


def test_names():
    assert MiniCPM5 is MiniCPM5ToolParser and MiniCPM5.needs_special_tokens
    assert TOOL_PARSERS.get("MiniCPM5") is MiniCPM5


def test_text_around_calls(check_splits):
    # test_multiple_calls_interleaved_text
    text = (
        "Head\n"
        '<function name="get_weather"><param name="city">北京</param></function>\n'
        "TXT\n"
        '<function name="sum_values"><param name="nums">[7,8,9]</param>'
        '<param name="exact">false</param></function>\n'
        "Tail\n"
    )
    got = check_splits(with_tools, text)
    assert got.content == "Head\nTXT\nTail\n"
    assert [(c.name, c.arguments) for c in got.calls] == [
        ("get_weather", '{"city": "北京"}'),
        ("sum_values", '{"nums": [7, 8, 9], "exact": false}'),
    ]


@pytest.mark.parametrize(
    ("body", "args"),
    [
        (
            '<param name="city"><![CDATA[北\n京]]></param><param name="date">2024-06-27</param>',
            {"city": "北\n京", "date": "2024-06-27"},
        ),
        ('<param name="city"> 上海 </param>', {"city": " 上海 "}),  # well-formed XML: the text as it is
        ('<param name="city"> a < b </param>', {"city": "a < b"}),  # not XML: trimmed
        ('<param name="city">a &amp; b</param>', {"city": "a & b"}),
        ('<param name="city">上海</param><param name="unknown">ignored</param>', {"city": "上海"}),
        (
            '<param name="arguments">{"city": "上海", "date": "2024-06-27"}</param>',
            {"city": "上海", "date": "2024-06-27"},
        ),
        ("<param name=\"properties\">{'city': 'x', 'other': 1}</param>", {"city": "x"}),
    ],
)
def test_weather_arguments(check_splits, body, args):
    got = check_splits(with_tools, f'<function name="get_weather">{body}</function>')
    assert got.named_args == [("get_weather", args)] and got.content == ""


def test_collapsed_and_byte_level_spellings(check_splits):
    text = '<functionname="get_weather"><paramname="city">上海</param></function>\u010aDone\u0120now'
    got = check_splits(with_tools, text)
    assert got.named_args == [("get_weather", {"city": "上海"})] and got.content == "Done now"


@pytest.mark.parametrize(
    "block",
    [
        '<function name="unknown"><param name="x">1</param></function>',  # not a tool of the request
        '<function name="get_weather"><param>北京</param><param name="date">2024-06-27</param></function>',
        '<function name="get_weather"><param name="city">北京</param><param name="city">上海</param></function>',
        '<function name="get_weather"><param name="City">北京</param></function>',  # required city missing
        '<function name="get_weather"><param name="properties">{"unknown": "x"}</param></function>',
    ],
)
def test_rejected_blocks_are_content(check_splits, block):
    got = check_splits(with_tools, "Sure. " + block)
    assert got.calls == [] and got.content == "Sure. " + block


def test_zero_argument_call_and_python_literals(check_splits):
    text = '<function name="noop"></function><function name="sum_values"><param name="nums">(1, 2)</param><param name="exact">True</param></function>'
    got = check_splits(with_tools, text)
    assert got.named_args == [("noop", {}), ("sum_values", {"nums": [1, 2], "exact": True})]


def test_cut_off_call_is_content(check_splits):
    text = 'Checking.<function name="get_weather"><param name="city">北京</param>'
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("get_weather", json.dumps({"city": "a < b & c", "date": "today"})),
        ToolCall("sum_values", json.dumps({"nums": [1, 2], "exact": False})),
        ToolCall("noop", "{}"),
    ]
    text = MiniCPM5.render(calls)
    assert text.startswith('<function name="get_weather"><param name="city"><![CDATA[a < b & c]]></param>')
    got = check_splits(with_tools, text)
    assert got.named_args == [(c.name, c.args) for c in calls] and got.content == ""
