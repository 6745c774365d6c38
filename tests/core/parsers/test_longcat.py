"""The longcat parser on outputs of LongCat-Flash-Chat (format: meituan-longcat/LongCat-Flash-Chat's
chat template, calls as ``{"name", "arguments"}`` JSON between ``<longcat_tool_call>`` tags; recorded
outputs from vLLM's tests/tool_parsers/test_longcat_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

LongCat = TOOL_PARSERS.get("longcat")

# vLLM's parallel_tool_calls_output
LONGCAT_TWO_CALLS = (
    '<longcat_tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo"}}</longcat_tool_call>\n'
    '<longcat_tool_call>{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}</longcat_tool_call>'
)
# vLLM's surrounding_text_output
LONGCAT_TEXT_AROUND = (
    "Let me check the weather for you.\n"
    '<longcat_tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo"}}</longcat_tool_call>\n'
    "Here is the result."
)


def test_one_call(check_splits):
    text = '<longcat_tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo"}}</longcat_tool_call>'
    got = check_splits(LongCat, text)
    assert got.content == "" and got.named_args == [("get_weather", {"city": "Tokyo"})]
    assert got.calls[0].arguments == '{"city": "Tokyo"}' and got.calls[0].complete


def test_two_calls(check_splits):
    got = check_splits(LongCat, LONGCAT_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})]
    assert all(c.complete for c in got.calls)


def test_content_around_the_call(check_splits):
    got = check_splits(LongCat, LONGCAT_TEXT_AROUND)
    assert got.content == "Let me check the weather for you.\nHere is the result."
    assert got.named_args == [("get_weather", {"city": "Tokyo"})]


def test_quotes_and_markers_inside_strings(check_splits):
    # vLLM's escaped_strings_output, plus the start marker inside a string
    text = (
        "<longcat_tool_call>{\n"
        '  "name": "test_function",\n'
        '  "arguments": {\n'
        '    "quoted": "He said \\"hello\\"",\n'
        '    "path": "C:\\\\Users\\\\file.txt",\n'
        '    "tag": "<longcat_tool_call> opens a call",\n'
        '    "unicode": "emoji: 🎉"\n'
        "  }\n"
        "}</longcat_tool_call>"
    )
    got = check_splits(LongCat, text)
    assert got.named_args == [
        (
            "test_function",
            {
                "quoted": 'He said "hello"',
                "path": "C:\\Users\\file.txt",
                "tag": "<longcat_tool_call> opens a call",
                "unicode": "emoji: 🎉",
            },
        )
    ]


def test_cut_off_call(parse):
    got = parse(LongCat, ['<longcat_tool_call>{"name": "func", "arguments": {"a": "b'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("func", '{"a": "b', False)]


def test_unreadable_body_is_content(check_splits):
    for text in (
        "Some text with <longcat_tool_call>invalid json</longcat_tool_call>",
        "Some text with <longcat_tool_call>invalid json",
    ):
        got = check_splits(LongCat, text)
        assert got.calls == [] and got.content == text


def test_plain_text_and_hermes_markers_are_content(check_splits):
    text = 'This is a regular response. <tool_call>{"name": "f", "arguments": {}}</tool_call>'
    got = check_splits(LongCat, text)
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Tokyo", "days": 3})), ToolCall("refresh", "{}")]
    text = LongCat.render(calls)
    assert text.startswith('<longcat_tool_call>\n{"name": "get_weather", "arguments": ')
    got = check_splits(LongCat, text)
    assert got.named_args == [("get_weather", {"city": "Tokyo", "days": 3}), ("refresh", {})]
    assert got.content == ""
