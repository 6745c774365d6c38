"""The granite and granite-20b-fc parsers on outputs of IBM Granite models (formats: vLLM's
granite_tool_parser.py and granite_20b_fc_tool_parser.py with their chat templates
examples/tool_chat_template_granite.jinja and tool_chat_template_granite_20b_fc.jinja; recorded
outputs from vLLM's tests/tool_parsers/test_granite_tool_parser.py and
test_granite_20b_fc_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

Granite = TOOL_PARSERS.get("granite")
Granite20bFC = TOOL_PARSERS.get("granite-20b-fc")

# ibm-granite/granite-3.1-8b-instruct: arguments before name (vLLM's batched-deltas test, run
# with that model's tokenizer)
GRANITE31_TWO_CALLS = (
    '<|tool_call|> [{"arguments": {"city": "Tokyo"}, "name": "get_weather"}, '
    '{"arguments": {"timezone": "Asia/Tokyo"}, "name": "get_time"}]'
)
# Granite 3.1+ string marker, one call spread over lines (vLLM's various-data-types case)
GRANITE_TYPED = """<tool_call> [{
  "name": "test_function",
  "arguments": {
    "string_field": "hello",
    "int_field": 42,
    "bool_field": true,
    "null_field": null,
    "array_field": ["a", "b", "c"],
    "object_field": {"nested": "value"}
  }
}]"""
# granite-20b-functioncalling, two calls (vLLM's parallel case)
GRANITE20B_TWO_CALLS = (
    '<function_call> {"name": "get_weather", "arguments": {"city": "Tokyo"}}\n'
    '<function_call> {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}'
)


def test_granite31_parallel_calls_arguments_first(check_splits):
    got = check_splits(Granite, GRANITE31_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})]
    assert all(c.complete for c in got.calls)


def test_string_marker_and_streamed_arguments(check_splits):
    got = check_splits(Granite, GRANITE_TYPED)
    assert got.named_args == [
        (
            "test_function",
            {
                "string_field": "hello",
                "int_field": 42,
                "bool_field": True,
                "null_field": None,
                "array_field": ["a", "b", "c"],
                "object_field": {"nested": "value"},
            },
        )
    ]
    assert got.calls[0].arguments.startswith('{\n    "string_field"')


def test_array_without_marker_at_start(check_splits):
    # Granite 3.0's <|tool_call|> is a special token: skipped, the text starts with the array
    got = check_splits(Granite, ' [{"name": "refresh", "arguments": {}}]')
    assert got.named_args == [("refresh", {})] and got.content == ""


def test_content_before_and_after_call(check_splits):
    # vLLM's surrounding-text case (which vLLM itself returns as content: an xfail there)
    text = (
        'Let me check the weather for you.\n<|tool_call|> [{"name": "get_weather", "arguments": '
        '{"city": "Tokyo"}}]\nI\'ll get that information.'
    )
    got = check_splits(Granite, text)
    assert got.content == "Let me check the weather for you.\nI'll get that information."
    assert got.named_args == [("get_weather", {"city": "Tokyo"})]


def test_plain_text_is_content(check_splits):
    for text in (
        "This is a regular response without any tool calls.",
        "[1] Smith et al., 2020",
        'Some text [{"name": "func"}]',
    ):
        got = check_splits(Granite, text)
        assert got.calls == [] and got.content == text


def test_unreadable_body_is_content(check_splits):
    # vLLM's malformed inputs: not an array; arguments missing or no object
    for text in (
        '<|tool_call|> {"name": "func", "arguments": {}}',
        '[{"name": "func"}]',
        '[{"name": "func", "arguments": "not a dict"}]',
        '<tool_call>[{"function": "f"}]',
    ):
        got = check_splits(Granite, text)
        assert got.calls == [] and got.content == text


def test_cut_off_call(parse):
    got = parse(Granite, ['<|tool_call|> [{"name": "func", "arguments": {"a": ['])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("func", '{"a": [', False)]
    # arguments first: the name comes last, so a call cut off has no name and is content
    text = '<tool_call>[{"arguments": {"city": "Tokyo"}, "na'
    got = parse(Granite, [text])
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"})), ToolCall("noop", "{}")]
    for parser in (Granite, Granite20bFC):
        got = check_splits(parser, parser.render(calls))
        assert got.named_args == [("get_weather", {"city": "Paris"}), ("noop", {})] and got.content == ""


def test_granite20b_parallel_calls(check_splits):
    got = check_splits(Granite20bFC, GRANITE20B_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})]
    assert all(c.complete for c in got.calls)


def test_granite20b_content_before_call(check_splits):
    text = (
        "Let me check the weather for you.\n"
        '<function_call> {"name": "get_weather", "arguments": {"city": "Tokyo"}}'
    )
    got = check_splits(Granite20bFC, text)
    assert got.content == "Let me check the weather for you.\n"
    assert got.named_args == [("get_weather", {"city": "Tokyo"})]
    assert got.calls[0].arguments == '{"city": "Tokyo"}'


def test_granite20b_plain_and_unreadable(check_splits):
    text = "This is a regular response without any tool calls."
    assert check_splits(Granite20bFC, text).content == text
    # vLLM's malformed inputs: an array, a bare object without the marker, a name that is no string
    for text in (
        '<function_call> [{"name": "func", "arguments": {}}]',
        '{"name": "func", "arguments": {}}',
        '<function_call> {"name": 123}',
    ):
        got = check_splits(Granite20bFC, text)
        assert got.calls == [] and got.content == text


def test_granite20b_cut_off_call(parse):
    got = parse(Granite20bFC, ['<function_call> {"name": "func", "arguments": {'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("func", "{", False)]
    text = '<function_call> {"name": "fu'
    got = parse(Granite20bFC, [text])
    assert got.calls == [] and got.content == text
