"""The internlm parser on outputs of InternLM2 / InternLM2.5 chat models (format: InternLM/InternLM
chat/chat_format.md, "Function Call"; vLLM's internlm2_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

InternLM = TOOL_PARSERS.get("internlm")

# InternLM2-Chat answering "I want to know today's weather in Shanghai" (chat_format.md)
INTERNLM2_TEXT_THEN_CALL = (
    "Sure, I will search for the weather of Shanghai.<|action_start|><|plugin|>\n"
    '{"name": "get_current_weather", "parameters": {"location": "Shanghai"}}<|action_end|>'
)


def test_content_then_call(check_splits):
    got = check_splits(InternLM, INTERNLM2_TEXT_THEN_CALL)
    assert got.content == "Sure, I will search for the weather of Shanghai."
    assert got.named_args == [("get_current_weather", {"location": "Shanghai"})]
    assert got.calls[0].complete and got.calls[0].arguments == '{"location": "Shanghai"}'


def test_parallel_calls(check_splits):
    text = (
        '<|action_start|><|plugin|>\n{"name": "get_weather", "parameters": {"city": "Tokyo"}}'
        '<|action_end|>\n<|action_start|><|plugin|>\n{"name": "get_time", "arguments": '
        '{"tz": "Asia/Tokyo"}}<|action_end|>'
    )
    got = check_splits(InternLM, text)
    assert got.content == ""
    assert got.named_args == [("get_weather", {"city": "Tokyo"}), ("get_time", {"tz": "Asia/Tokyo"})]


def test_plain_text_and_interpreter_are_content(check_splits):
    text = "This is a regular response without any tool calls. <|action_start|> alone is text."
    assert check_splits(InternLM, text).content == text
    text = (
        "I have processed the data.\n\n<|action_start|><|interpreter|>\n"
        "```python\nprint(1)\n```<|action_end|>"
    )
    got = check_splits(InternLM, text)
    assert got.calls == [] and got.content == text


def test_unreadable_body_is_content(check_splits):
    # a name that is no valid JSON string (an unknown escape, a raw newline) is no call either
    for text in (
        "<|action_start|><|plugin|>not json<|action_end|>",
        '<|action_start|><|plugin|>{"name": "get\\e", "parameters": {}}<|action_end|>',
        '<|action_start|><|plugin|>{"name": "get\nx", "parameters": {}}<|action_end|>',
    ):
        got = check_splits(InternLM, text)
        assert got.calls == [] and got.content == text


def test_cut_off_call(parse):
    got = parse(InternLM, ['<|action_start|><|plugin|>\n{"name": "get_weather", "parameters": {"city": "To'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("get_weather", '{"city": "To', False)]
    text = '<|action_start|><|plugin|>\n{"name": "get_wea'
    got = parse(InternLM, [text])
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"})), ToolCall("noop", "{}")]
    got = check_splits(InternLM, InternLM.render(calls))
    assert got.named_args == [("get_weather", {"city": "Paris"}), ("noop", {})] and got.content == ""
