"""The granite4 parser on IBM Granite 4.0 outputs (format: the chat template of
ibm-granite/granite-4.0-h-small; outputs in the shape of vLLM's
tests/tool_parsers/test_granite4_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

Granite4 = TOOL_PARSERS.get("granite4")

TWO_CALLS = (
    "I'll get the weather for both cities.<tool_call>\n"
    '{"name": "get_current_weather", "arguments": {"city": "Boston", "state": "MA", "unit": "celsius"}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name": "get_current_weather", "arguments": {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}}\n'
    "</tool_call>"
)


def test_content_then_two_calls(check_splits):
    got = check_splits(Granite4, TWO_CALLS)
    assert got.content == "I'll get the weather for both cities."
    assert got.named_args == [
        ("get_current_weather", {"city": "Boston", "state": "MA", "unit": "celsius"}),
        ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}),
    ]
    # the model's JSON, verbatim
    assert got.calls[0].arguments == '{"city": "Boston", "state": "MA", "unit": "celsius"}'


def test_text_after_a_call_is_content_and_quotes_in_strings_are_kept(check_splits):
    text = '<tool_call>{"name": "echo", "arguments": {"text": "{x} \\"q\\""}}</tool_call>\nDone.'
    got = check_splits(Granite4, text)
    assert got.named_args == [("echo", {"text": '{x} "q"'})] and got.content == "Done."


def test_plain_text_and_unreadable_body(check_splits):
    text = "No tools needed: 2 + 2 = 4."
    assert check_splits(Granite4, text).content == text
    bad = "<tool_call>get_current_weather(city='Boston')</tool_call>"
    got = check_splits(Granite4, bad)
    assert got.calls == [] and got.content == bad


def test_cut_off_call(parse):
    got = parse(Granite4, ['<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Bos'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_current_weather", '{"city": "Bos', False)
    ]


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_current_weather", json.dumps({"city": "Boston"})), ToolCall("noop", "{}")]
    got = check_splits(Granite4, Granite4.render(calls))
    assert got.named_args == [("get_current_weather", {"city": "Boston"}), ("noop", {})]
    assert Granite4.needs_special_tokens
