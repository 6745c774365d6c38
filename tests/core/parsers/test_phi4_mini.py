"""The phi4_mini_json parser on outputs of Phi-4-mini-instruct (format: ``functools`` and a JSON array of
calls, as vLLM's phi4mini_tool_parser.py reads them; recorded outputs from vLLM's
tests/tool_parsers/test_phi4mini_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

Phi4Mini = TOOL_PARSERS.get("phi4_mini_json")

# vLLM's parallel_tool_calls_output
PHI4_TWO_CALLS = """functools[
  {"name": "get_weather", "arguments": {"city": "Tokyo"}},
  {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}
]"""
# vLLM's surrounding_text_output
PHI4_TEXT_AROUND = """Let me check the weather for you.
functools[{"name": "get_weather", "arguments": {"city": "Tokyo"}}]
Would you like to know more?"""


def test_one_call(check_splits):
    got = check_splits(Phi4Mini, 'functools[{"name": "get_weather", "arguments": {"city": "Tokyo"}}]')
    assert got.content == "" and got.named_args == [("get_weather", {"city": "Tokyo"})]
    assert got.calls[0].arguments == '{"city": "Tokyo"}' and got.calls[0].complete


def test_two_calls(check_splits):
    got = check_splits(Phi4Mini, PHI4_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [("get_weather", {"city": "Tokyo"}), ("get_time", {"timezone": "Asia/Tokyo"})]


def test_content_around_the_calls(check_splits):
    got = check_splits(Phi4Mini, PHI4_TEXT_AROUND)
    assert got.content == "Let me check the weather for you.\nWould you like to know more?"
    assert got.named_args == [("get_weather", {"city": "Tokyo"})]


def test_nested_values_quotes_and_brackets_inside_strings(check_splits):
    # vLLM's various_data_types_output and escaped_strings_output (its regex stops at the first "]")
    text = (
        "functools[{\n"
        '  "name": "test_function",\n'
        '  "arguments": {\n'
        '    "quoted": "He said \\"hello\\" ]}",\n'
        '    "null_field": null,\n'
        '    "array_field": ["a", "b", "c"],\n'
        '    "object_field": {"nested": "value"},\n'
        '    "marker": "functools[ in a string"\n'
        "  }\n"
        "}]"
    )
    got = check_splits(Phi4Mini, text)
    assert got.named_args == [
        (
            "test_function",
            {
                "quoted": 'He said "hello" ]}',
                "null_field": None,
                "array_field": ["a", "b", "c"],
                "object_field": {"nested": "value"},
                "marker": "functools[ in a string",
            },
        )
    ]


def test_cut_off_call(parse):
    got = parse(Phi4Mini, ['functools[{"name": "func", "arguments": {"a": 1'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("func", '{"a": 1', False)]


def test_unreadable_lists_are_content(check_splits):
    # vLLM's malformed_input_outputs
    for text in (
        'functools[{"name": "func", "arguments": "not a dict"}]',
        'functools{"name": "func"}',
        'functools[{"name": "func"}]',
        "functools[] This is just text",
        "functools[ This is just text ]",
    ):
        got = check_splits(Phi4Mini, text)
        assert got.calls == [] and got.content == text, text


def test_plain_text_is_content(check_splits):
    text = "Use Python's functools.lru_cache, or functools [1, 2] in prose."
    got = check_splits(Phi4Mini, text)
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Tokyo"})), ToolCall("refresh", "{}")]
    text = Phi4Mini.render(calls)
    assert (
        text
        == 'functools[{"name": "get_weather", "arguments": {"city": "Tokyo"}}, {"name": "refresh", "arguments": {}}]'
    )
    got = check_splits(Phi4Mini, text)
    assert got.named_args == [("get_weather", {"city": "Tokyo"}), ("refresh", {})] and got.content == ""
