"""The gigachat3 parser on GigaChat 3 / 3.1 outputs (format: the chat templates
GigaChat3-10B-A1.8B.jinja and GigaChat3.1-10B-A1.8B.jinja; recorded outputs from SGLang's
test_gigachat3_detector.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

GigaChat3 = TOOL_PARSERS.get("gigachat3")

MEMORY = Tool(
    "manage_user_memory",
    {
        "type": "object",
        "properties": {
            "content": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "action": {"type": "string", "enum": ["create", "update", "delete"]},
            "id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
    },
)
WEATHER = Tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})


def with_tools():
    return GigaChat3([MEMORY, WEATHER])


# test_detect_and_parse_with_content_and_eos
WITH_CONTENT = (
    "I'll remember that.<|message_sep|>\n\nfunction call<|role_sep|>\n"
    '{"name": "manage_user_memory", "arguments": {"action": "create", "id": "test"}}</s>'
)
# test_detect_and_parse_complex_tool_call
NESTED = (
    "<|message_sep|>\n\nfunction call<|role_sep|>\n"
    '{"name": "manage_user_memory", "arguments": {"action": "create", "id": "preferences", "content": '
    '{"short_answers": true, "hate_emojis": true, "english_ui": false, "russian_math_explanations": true}}}'
)


def test_content_then_a_call(check_splits):
    got = check_splits(with_tools, WITH_CONTENT)
    assert got.content == "I'll remember that."
    assert got.named_args == [("manage_user_memory", {"action": "create", "id": "test"})]
    assert got.calls[0].arguments == '{"action": "create", "id": "test"}' and got.calls[0].complete


def test_nested_arguments_stream_verbatim(check_splits):
    got = check_splits(with_tools, NESTED)
    assert got.content == ""
    assert got.calls[0].arguments == (
        '{"action": "create", "id": "preferences", "content": '
        '{"short_answers": true, "hate_emojis": true, "english_ui": false, "russian_math_explanations": true}}'
    )


def test_gigachat31_call_inside_the_message(check_splits):
    # GigaChat 3.1's template: the call follows <|function_call|> in the assistant's message
    text = (
        'Сейчас узнаю погоду.<|function_call|>{"name": "get_weather", "arguments": {"city": "Москва"}}'
        "<|message_sep|>\n\n"
    )
    got = check_splits(with_tools, text)
    assert got.content == "Сейчас узнаю погоду."
    assert got.named_args == [("get_weather", {"city": "Москва"})]


def test_parameterless_call(check_splits):
    text = '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "manage_user_memory", "arguments": {}}'
    got = check_splits(with_tools, text)
    assert got.named_args == [("manage_user_memory", {})] and got.content == ""


def test_cut_off_call(parse):
    # test_streaming_incomplete_json
    cut = (
        '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "get_weather", "arguments": {"city": "London"'
    )
    got = parse(with_tools, [cut])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"city": "London"', False)
    ]


def test_objects_that_are_no_call_are_content(check_splits):
    # test_detect_and_parse_missing_name / _missing_arguments / _arguments_not_dict
    for body in (
        '{"arguments": {"action": "create"}}',
        '{"name": "manage_user_memory"}',
        '{"name": "manage_user_memory", "arguments": "string_args"}',
        "sorry, no call",
    ):
        got = check_splits(with_tools, "<|message_sep|>\n\nfunction call<|role_sep|>\n" + body)
        assert got.calls == [] and got.content == "function call<|role_sep|>\n" + body


def test_plain_answer(check_splits):
    got = check_splits(with_tools, "How can I help you today?<|message_sep|>\n\n")
    assert got.calls == [] and got.content == "How can I help you today?"
    text = "A function call is how I use tools."
    assert check_splits(with_tools, text).content == text


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"}))]
    text = GigaChat3.render(calls)
    assert (
        text
        == '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
    )
    got = check_splits(with_tools, "Checking." + text)
    assert got.named_args == [("get_weather", {"city": "Paris"})] and got.content == "Checking."
    two = GigaChat3.render([*calls, ToolCall("manage_user_memory", "{}")])
    assert [c.name for c in check_splits(with_tools, two).calls] == ["get_weather", "manage_user_memory"]


def test_name_resolves():
    assert GigaChat3.name == "gigachat3" and TOOL_PARSERS.get("GigaChat3") is GigaChat3
    assert GigaChat3.needs_special_tokens
