"""The functiongemma parser on FunctionGemma outputs (format: google/functiongemma-270m-it's chat
template; outputs like the model card's example and vLLM's functiongemma_tool_parser.py docstring)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

FunctionGemma = TOOL_PARSERS.get("functiongemma")
E = "<escape>"

WEATHER = Tool(
    "get_current_weather",
    {
        "type": "object",
        "properties": {
            "location": {"type": "string"},
            "days": {"type": "integer"},
            "zip": {"type": "string"},
        },
    },
)
THEME = Tool(
    "change_theme",
    {
        "type": "object",
        "properties": {
            "theme": {"type": "string"},
            "options": {"type": "object"},
            "tags": {"type": "array"},
            "dark": {"type": "boolean"},
        },
    },
)


def with_tools():
    return FunctionGemma([WEATHER, THEME])


# the model card's example answer to "What's the temperature in London?"
LONDON = f"<start_function_call>call:get_current_weather{{location:{E}London{E}}}<end_function_call>"


def test_one_call(check_splits):
    got = check_splits(with_tools, LONDON)
    assert got.content == ""
    assert got.named_args == [("get_current_weather", {"location": "London"})]
    assert got.calls[0].arguments == '{"location": "London"}' and got.calls[0].complete


def test_text_then_two_calls(check_splits):
    text = (
        "Let me check both.\n"
        f"<start_function_call>call:get_current_weather{{location:{E}Paris, FR{E},days:3}}<end_function_call>"
        f"<start_function_call>call:get_current_weather{{location:{E}Tokyo{E}}}<end_function_call>"
    )
    got = check_splits(with_tools, text)
    assert got.content == "Let me check both.\n"
    # vLLM reads only escaped values and would drop days:3
    assert got.named_args == [
        ("get_current_weather", {"location": "Paris, FR", "days": 3}),
        ("get_current_weather", {"location": "Tokyo"}),
    ]


def test_values_typed_by_the_schema(check_splits):
    text = (
        f"<start_function_call>call:get_current_weather{{zip:{E}02139{E},days:{E}4{E},"
        f"extra:{E}7{E},note:{E}a, b{E}}}<end_function_call>"
    )
    got = check_splits(with_tools, text)
    # the listed integer is typed (as vLLM types it); strings stay text
    assert got.named_args == [
        ("get_current_weather", {"zip": "02139", "days": 4, "extra": "7", "note": "a, b"})
    ]


def test_nested_values(check_splits):
    text = (
        f"<start_function_call>call:change_theme{{theme:{E}dark {{x}}{E},options:{{contrast:{E}high{E},level:2}},"
        f"tags:[{E}a{E},{E}b,c{E}],dark:true}}<end_function_call>"
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [
        (
            "change_theme",
            {
                "theme": "dark {x}",
                "options": {"contrast": "high", "level": 2},
                "tags": ["a", "b,c"],
                "dark": True,
            },
        )
    ]


def test_cut_off_call(parse):
    got = parse(with_tools, [f"<start_function_call>call:get_current_weather{{location:{E}Paris{E},days:1"])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_current_weather", '{"location": "Paris"', False)
    ]
    got = parse(with_tools, [f"<start_function_call>call:get_current_weather{{location:{E}Par"])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("get_current_weather", "", False)]


def test_unreadable_body_is_content(check_splits):
    for text in (
        "<start_function_call>this is not a call<end_function_call>",
        f"<start_function_call>call:bad name{{a:{E}1{E}}}<end_function_call>",
    ):
        got = check_splits(with_tools, text)
        assert got.calls == [] and got.content == text


def test_plain_text_is_content(check_splits):
    text = f"Write call:change_theme{{theme:{E}dark{E}}} between the markers."
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("change_theme", json.dumps({"theme": "light", "options": {"a": [1, "x"]}, "dark": False})),
        ToolCall("get_current_weather", json.dumps({"location": "Oslo", "days": 2})),
    ]
    text = FunctionGemma.render(calls)
    assert text.startswith(
        f"<start_function_call>call:change_theme{{theme:{E}light{E},options:{{a:[1,{E}x{E}]}}"
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [(c.name, c.args) for c in calls] and got.content == ""


def test_name_resolves():
    assert FunctionGemma.name == "functiongemma" and TOOL_PARSERS.get("FunctionGemma") is FunctionGemma
    assert FunctionGemma is not TOOL_PARSERS.get("gemma4") and FunctionGemma.needs_special_tokens
