"""The hunyuan_a13b parser on Hunyuan-A13B outputs (format: the chat template of
tencent/Hunyuan-A13B-Instruct and vLLM's hunyuan_a13b_tool_parser.py; outputs in the shape of
vLLM's tests/tool_parsers/test_hunyuan_a13b_tool_parser.py, after the reasoning parser took the
``<think>`` and ``<answer>`` sections)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

Hunyuan = TOOL_PARSERS.get("hunyuan_a13b")

TWO_CALLS = (
    "I'll check both cities.\n"
    '<tool_calls>[{"name": "get_current_weather", "arguments": {"city": "San Francisco", "state": "CA", '
    '"unit": "fahrenheit"}}, {"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX"}}]'
    "</tool_calls>"
)


def test_content_then_array_of_calls(check_splits):
    got = check_splits(Hunyuan, TWO_CALLS)
    assert got.content == "I'll check both cities.\n"
    assert got.named_args == [
        ("get_current_weather", {"city": "San Francisco", "state": "CA", "unit": "fahrenheit"}),
        ("get_current_weather", {"city": "Dallas", "state": "TX"}),
    ]
    assert got.calls[1].arguments == '{"city": "Dallas", "state": "TX"}'


def test_markers_and_quotes_inside_strings(check_splits):
    text = '<tool_calls>[{"name": "note", "arguments": {"text": "]</tool_calls> \\"x\\""}}]</tool_calls>\nOK'
    got = check_splits(Hunyuan, text)
    assert got.named_args == [("note", {"text": ']</tool_calls> "x"'})] and got.content == "OK"


def test_plain_text_and_unreadable_list(check_splits):
    text = "Hello! How can I help?"
    assert check_splits(Hunyuan, text).content == text
    bad = '<tool_calls>{"name": "get_current_weather"}</tool_calls>'
    got = check_splits(Hunyuan, bad)
    assert got.calls == [] and got.content == bad


def test_cut_off_call(parse):
    got = parse(Hunyuan, ['<tool_calls>[{"name": "get_current_weather", "arguments": {"city": "Dal'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_current_weather", '{"city": "Dal', False)
    ]


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_current_weather", json.dumps({"city": "Dallas"})), ToolCall("noop", "{}")]
    rendered = Hunyuan.render(calls)
    assert rendered.startswith('<tool_calls>[{"name": "get_current_weather"')
    got = check_splits(Hunyuan, rendered)
    assert got.named_args == [("get_current_weather", {"city": "Dallas"}), ("noop", {})]
