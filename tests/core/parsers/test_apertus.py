"""The apertus parser on outputs of Apertus models (format: swiss-ai/Apertus-8B-Instruct's chat template,
one-key ``{"NAME": {arguments}}`` objects in a JSON array between ``<|tools_prefix|>`` and
``<|tools_suffix|>``; recorded outputs from vLLM's tests/tool_parsers/test_apertus_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.events import ToolCallArgs, ToolCallStart
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

Apertus = TOOL_PARSERS.get("apertus")

# vLLM's test_multiple_tool_calls
APERTUS_TWO_CALLS = (
    '<|tools_prefix|>[{"get_weather": {"location": "London"}}, {"get_time": {"location": "London"}}]'
    "<|tools_suffix|>"
)
# vLLM's test_text_before_tool_call
APERTUS_TEXT_THEN_CALL = 'Let me check the weather for you. <|tools_prefix|>[{"get_weather": {"location": "Paris"}}]<|tools_suffix|>'


def test_one_call(check_splits):
    text = (
        '<|tools_prefix|>[{"get_weather": {"location": "San Francisco", "unit": "celsius"}}]<|tools_suffix|>'
    )
    got = check_splits(Apertus, text)
    assert got.content == "" and got.named_args == [
        ("get_weather", {"location": "San Francisco", "unit": "celsius"})
    ]
    assert (
        got.calls[0].arguments == '{"location": "San Francisco", "unit": "celsius"}' and got.calls[0].complete
    )


def test_two_calls(check_splits):
    got = check_splits(Apertus, APERTUS_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [("get_weather", {"location": "London"}), ("get_time", {"location": "London"})]


def test_content_before_and_after(check_splits):
    got = check_splits(Apertus, APERTUS_TEXT_THEN_CALL + " Done.")
    assert got.content == "Let me check the weather for you. Done."
    assert got.named_args == [("get_weather", {"location": "Paris"})]


def test_arguments_stream_verbatim(check_splits):
    # vLLM's test_nested_arguments, with quotes and the markers inside strings
    text = (
        '<|tools_prefix|>[{"complex_function": {"nested": {"inner": "say \\"<|tools_suffix|>\\""}, '
        '"list": ["a", "b"]}}]<|tools_suffix|>'
    )
    got = check_splits(Apertus, text)
    assert got.named_args == [
        ("complex_function", {"nested": {"inner": 'say "<|tools_suffix|>"'}, "list": ["a", "b"]})
    ]
    parser = Apertus()
    events = parser.feed('<|tools_prefix|>[{"get_weather": {"location": "Par')
    assert events == [ToolCallStart("get_weather"), ToolCallArgs('{"location": "Par')]


def test_cut_off_call_and_missing_suffix(parse):
    # vLLM's test_incomplete_tool_call and test_missing_tool_suffix
    got = parse(Apertus, ['<|tools_prefix|>[{"get_weather": {"location": "London"}'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"location": "London"}', True)
    ]
    got = parse(Apertus, ['<|tools_prefix|>[{"get_weather": {"location": "Lon'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"location": "Lon', False)
    ]
    got = parse(Apertus, ['<|tools_prefix|>[{"f": {"a": 1}}]'])
    assert got.named_args == [("f", {"a": 1})] and got.content == ""


def test_unreadable_lists_are_content(check_splits):
    for text in (
        "<|tools_prefix|>[]<|tools_suffix|>",
        '<|tools_prefix|>[{"get_weather": "London"}]<|tools_suffix|>',
        "<|tools_prefix|>not json<|tools_suffix|>",
    ):
        got = check_splits(Apertus, text)
        assert got.calls == [] and got.content == text, text


def test_plain_text_is_content(check_splits):
    text = 'Hello, how can I help you today? [{"get_weather": {}}] is an example.'
    got = check_splits(Apertus, text)
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"location": "Zürich"})), ToolCall("noop", "{}")]
    text = Apertus.render(calls)
    assert (
        text
        == '<|tools_prefix|>[{"get_weather": {"location": "Z\\u00fcrich"}}, {"noop": {}}]<|tools_suffix|>'
    )
    got = check_splits(Apertus, text)
    assert got.named_args == [("get_weather", {"location": "Zürich"}), ("noop", {})] and got.content == ""
