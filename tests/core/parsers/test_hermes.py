"""The hermes parser on outputs of Qwen2.5 / Qwen3 / Hermes models (format: the Hermes
function-calling template, also in Qwen2.5-7B-Instruct's tokenizer_config.json chat template)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

Hermes = TOOL_PARSERS.get("hermes")

# Qwen2.5-7B-Instruct answering "What's the weather in SF and NYC?" with get_current_weather
# (the Qwen function-calling docs' example output, qwen.readthedocs.io "Function Calling")
QWEN25_TWO_CALLS = (
    '<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "San Francisco, CA, USA", '
    '"unit": "fahrenheit"}}\n</tool_call>\n<tool_call>\n{"name": "get_current_weather", "arguments": '
    '{"location": "New York, NY, USA", "unit": "fahrenheit"}}\n</tool_call>'
)
# Qwen3 with thinking off: some text first, then one call
QWEN3_TEXT_THEN_CALL = (
    "I'll look that up for you.\n\n<tool_call>\n"
    '{"name": "search_web", "arguments": {"query": "dyn \\"router\\" <tool_call> docs", "top_k": 3}}\n'
    "</tool_call>"
)


def test_two_calls(check_splits):
    got = check_splits(Hermes, QWEN25_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [
        ("get_current_weather", {"location": "San Francisco, CA, USA", "unit": "fahrenheit"}),
        ("get_current_weather", {"location": "New York, NY, USA", "unit": "fahrenheit"}),
    ]
    assert all(c.complete for c in got.calls)


def test_content_before_call_and_markers_inside_strings(check_splits):
    got = check_splits(Hermes, QWEN3_TEXT_THEN_CALL)
    assert got.content == "I'll look that up for you.\n\n"
    assert got.named_args == [("search_web", {"query": 'dyn "router" <tool_call> docs', "top_k": 3})]
    # the arguments are the model's own JSON text, verbatim
    assert got.calls[0].arguments == '{"query": "dyn \\"router\\" <tool_call> docs", "top_k": 3}'


def test_plain_text_is_content(check_splits):
    assert (
        check_splits(Hermes, "The capital of France is Paris. 3 < 4 and <b>bold</b>.").content
        == "The capital of France is Paris. 3 < 4 and <b>bold</b>."
    )


def test_other_key_order_and_string_arguments(check_splits):
    text = '<tool_call>\n{"arguments": "{\\"a\\": 1}", "name": "f"}\n</tool_call>'
    got = check_splits(Hermes, text)
    assert got.named_args == [("f", {"a": 1})]


def test_unreadable_body_is_content(check_splits):
    text = "<tool_call>\nnot json at all\n</tool_call>"
    got = check_splits(Hermes, text)
    assert got.calls == [] and got.content == text


def test_cut_off_call(parse):
    # max_tokens inside the arguments: the call is streamed as far as it got, never ended
    got = parse(Hermes, ['<tool_call>\n{"name": "f", "arguments": {"city": "Par'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("f", '{"city": "Par', False)]
    # cut off before the name was read: the text is content
    got = parse(Hermes, ['<tool_call>\n{"name": "f'])
    assert got.calls == [] and got.content == '<tool_call>\n{"name": "f'
    # the model stopped after the JSON without the end marker: a complete call
    got = parse(Hermes, ['<tool_call>\n{"name": "f", "arguments": {}}'])
    assert [(c.name, c.args, c.complete) for c in got.calls] == [("f", {}, True)]


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"})), ToolCall("noop", "{}")]
    got = check_splits(Hermes, Hermes.render(calls))
    assert got.named_args == [("get_weather", {"city": "Paris"}), ("noop", {})]


def test_vllm_names():
    """vLLM 0.32 maps ``qwen3_json`` (and dyn ``qwen25``, ``qwen3``) to the Hermes reading."""
    assert all(TOOL_PARSERS.get(name) is Hermes for name in ("hermes", "qwen25", "qwen3", "qwen3_json"))
