"""The jamba parser on outputs of AI21 Jamba models (format: the Jamba 1.5 chat template's
``<tool_calls>`` JSON array; recorded outputs from vLLM's tests/tool_parsers/test_jamba_tool_parser.py,
run with ai21labs/Jamba-tiny-dev's tokenizer)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

Jamba = TOOL_PARSERS.get("jamba")

# Jamba with content before the call (vLLM's "single_tool_with_content" case)
JAMBA_TEXT_THEN_CALL = (
    ' Sure! let me call the tool for you.<tool_calls>[\n    {"name": "get_current_weather", "arguments": '
    '{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}}\n]</tool_calls>'
)
# Jamba calling two tools at once (vLLM's "parallel_tools" case)
JAMBA_TWO_CALLS = (
    ' <tool_calls>[\n    {"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX", '
    '"unit": "fahrenheit"}},\n    {"name": "get_current_weather", "arguments": {"city": "Orlando", '
    '"state": "FL", "unit": "fahrenheit"}}\n]</tool_calls>'
)


def test_content_then_call(check_splits):
    got = check_splits(Jamba, JAMBA_TEXT_THEN_CALL)
    assert got.content == " Sure! let me call the tool for you."
    assert got.named_args == [
        ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})
    ]
    assert got.calls[0].complete
    assert got.calls[0].arguments == '{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}'


def test_parallel_calls(check_splits):
    got = check_splits(Jamba, JAMBA_TWO_CALLS)
    assert got.content == " "
    assert got.named_args == [
        ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}),
        ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}),
    ]
    assert all(c.complete for c in got.calls)


def test_text_after_calls_is_content(check_splits):
    got = check_splits(Jamba, '<tool_calls>[{"name": "f", "arguments": {}}]</tool_calls>\n\nDone.')
    assert got.named_args == [("f", {})] and got.content == "Done."


def test_single_object_section(check_splits):
    # Dynamo's jamba config reads a bare object between the markers too
    got = check_splits(Jamba, '<tool_calls>{"name": "f", "arguments": {"x": [1, 2]}}</tool_calls>')
    assert got.named_args == [("f", {"x": [1, 2]})] and got.content == ""


def test_plain_text_is_content(check_splits):
    text = "This is a test. Arrays like [1, 2] and <tags> stay text."
    assert check_splits(Jamba, text).content == text


def test_unreadable_body_is_content(check_splits):
    text = "<tool_calls>not json</tool_calls>"
    got = check_splits(Jamba, text)
    assert got.calls == [] and got.content == text
    text = '<tool_calls>[{"tool": "f"}]</tool_calls>'
    got = check_splits(Jamba, text)
    assert got.calls == [] and got.content == text


def test_cut_off_call(parse):
    got = parse(Jamba, ['<tool_calls>[\n    {"name": "get_current_weather", "arguments": {"city": "Dal'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_current_weather", '{"city": "Dal', False)
    ]
    assert got.content == ""
    # cut off before the name was read: the text is content
    text = '<tool_calls>[\n    {"name": "get_curr'
    got = parse(Jamba, [text])
    assert got.calls == [] and got.content == text
    # the second call cut off before its name: the first stands, the rest is content
    got = parse(Jamba, ['<tool_calls>[{"name": "f", "arguments": {}}, {"na'])
    assert [(c.name, c.complete) for c in got.calls] == [("f", True)] and got.content == ', {"na'


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"})), ToolCall("noop", "{}")]
    got = check_splits(Jamba, Jamba.render(calls))
    assert got.named_args == [("get_weather", {"city": "Paris"}), ("noop", {})] and got.content == ""
