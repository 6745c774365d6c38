"""The ernie45 parser on ERNIE-4.5 thinking outputs (format: vLLM's ernie45_tool_parser.py for
baidu/ERNIE-4.5-21B-A3B-Thinking, whose docstring gives the shape
``abc\\n</think>\\n\\n\\n<tool_call>\\ndef\\n</tool_call>\\n``; here after the reasoning parser took
the text up to ``</think>``)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

Ernie45 = TOOL_PARSERS.get("ernie45")

CALL = (
    "\n\n\n<tool_call>\n"
    '{"name": "get_current_temperature", "arguments": {"location": "Beijing, China", "unit": "celsius"}}\n'
    "</tool_call>\n"
)
TWO_CALLS = (
    "I will check both.\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"location": "Beijing"}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"location": "Shanghai"}}\n'
    "</tool_call>\n"
)


def test_call_after_the_reasoning_drops_the_newlines(check_splits):
    got = check_splits(Ernie45, CALL)
    assert got.content == ""
    assert got.named_args == [("get_current_temperature", {"location": "Beijing, China", "unit": "celsius"})]


def test_content_then_two_calls(check_splits):
    got = check_splits(Ernie45, TWO_CALLS)
    assert got.content == "I will check both."
    assert got.named_args == [
        ("get_weather", {"location": "Beijing"}),
        ("get_weather", {"location": "Shanghai"}),
    ]


def test_response_wrapper_is_dropped(check_splits):
    got = check_splits(Ernie45, "\n\n<response>\nIt is 25°C in Beijing.\n</response>\n")
    assert got.content == "\n\nIt is 25°C in Beijing.\n" and got.calls == []


def test_quotes_and_markers_inside_strings(check_splits):
    text = '<tool_call>\n{"name": "echo", "arguments": {"text": "<response> \\"hi\\" {}"}}\n</tool_call>'
    got = check_splits(Ernie45, text)
    assert got.named_args == [("echo", {"text": '<response> "hi" {}'})]


def test_plain_text_and_unreadable_body(check_splits):
    text = "Plain answer.\nTwo lines."
    assert check_splits(Ernie45, text).content == text
    bad = "<tool_call>\nget_weather(Beijing)\n</tool_call>"
    got = check_splits(Ernie45, bad)
    assert got.calls == [] and got.content == bad


def test_cut_off_call(parse):
    got = parse(Ernie45, ['\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Bei'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"location": "Bei', False)
    ]
    assert got.content == ""


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"location": "Beijing"})), ToolCall("noop", "{}")]
    got = check_splits(Ernie45, Ernie45.render(calls))
    assert got.named_args == [("get_weather", {"location": "Beijing"}), ("noop", {})]
