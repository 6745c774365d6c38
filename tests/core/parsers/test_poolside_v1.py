"""The poolside_v1 tool parser (core/parsers/tool/poolside_v1.py) on Poolside Laguna outputs.

Recorded strings: vLLM's tests/tool_parsers/test_poolside_v1_tool_parser.py
(test_string_arg_preserves_whitespace, test_non_string_arg_still_deserialized,
test_no_newline_after_name_non_streaming, test_function_name_with_internal_whitespace_still_parses,
test_whitespace_padded_tool_call_is_not_quadratic); checked against vLLM 0.32's parser.
"""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.poolside_v1 import PoolsideV1ToolParser

Poolside = TOOL_PARSERS.get("poolside_v1")

WRITE_FILE = Tool(
    "write_file",
    {"type": "object", "properties": {"content": {"type": "string"}, "mode": {"type": "integer"}}},
)
WEATHER = Tool(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
)
CODE = "    def f():\n        return 1\n"


def test_names():
    assert Poolside is PoolsideV1ToolParser and TOOL_PARSERS.get("Poolside-V1") is Poolside
    assert Poolside is not TOOL_PARSERS.get("glm47") and Poolside.needs_special_tokens


def test_string_values_verbatim_others_typed(check_splits):
    # vLLM test_string_arg_preserves_whitespace + test_non_string_arg_still_deserialized
    text = (
        "<tool_call>write_file\n<arg_key>content</arg_key>\n"
        f"<arg_value>{CODE}</arg_value>\n<arg_key>mode</arg_key>\n<arg_value> 420 </arg_value>\n</tool_call>"
    )
    got = check_splits(lambda: Poolside([WRITE_FILE]), text)
    assert got.calls[0].args == {"content": CODE, "mode": 420}
    assert got.content == "" and got.calls[0].complete
    # not typed string by a schema: trimmed, then JSON, a Python literal, else text
    got = check_splits(Poolside, text.replace("420", "{'a': True}"))
    assert got.calls[0].args == {"content": "def f():\n        return 1", "mode": {"a": True}}


def test_calls_back_to_back_after_text(check_splits):
    # the template's way (no newlines); vLLM test_no_newline_after_name_non_streaming
    text = (
        "Let me check both cities."
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
    )
    got = check_splits(lambda: Poolside([WEATHER]), text)
    assert got.content == "Let me check both cities."
    assert got.named_args == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome", "days": 3}),
    ]
    assert got.calls[1].arguments == '{"city": "Rome", "days": 3}'


def test_name_may_hold_spaces(check_splits):
    # vLLM test_function_name_with_internal_whitespace_still_parses
    text = "<tool_call>  get weather  <arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    assert check_splits(Poolside, text).named_args == [("get weather", {"city": "Paris"})]


def test_unreadable_bodies_are_content(check_splits):
    # vLLM test_whitespace_padded_tool_call_is_not_quadratic and the whitespace-only name
    for bad in (
        "<tool_call>" + " " * 64 + "<x</tool_call>",
        "<tool_call>   </tool_call>",
        "<tool_call>f<x></tool_call>",
    ):
        got = check_splits(Poolside, bad)
        assert got.calls == [] and got.content == bad


def test_text_without_calls(check_splits):
    text = "No tools needed: 2 < 3, and <tool_call is not a call."
    assert check_splits(Poolside, text).content == text


def test_cut_off(parse):
    got = parse(
        lambda: Poolside([WRITE_FILE]),
        [
            "<tool_call>write_file<arg_key>mode</arg_key><arg_value>420</arg_value><arg_key>content</arg_key><arg_value>imp"
        ],
    )
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("write_file", '{"mode": 420', False)]
    got = parse(Poolside, ["Sure.<tool_call>write_fi"])
    assert got.calls == [] and got.content == "Sure.<tool_call>write_fi"


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("write_file", json.dumps({"content": CODE, "mode": 420})),
        ToolCall("noop", "{}"),
    ]
    text = Poolside.render(calls)
    assert text == (
        "<tool_call>write_file<arg_key>content</arg_key><arg_value>"
        + CODE
        + "</arg_value><arg_key>mode</arg_key><arg_value>420</arg_value></tool_call><tool_call>noop</tool_call>"
    )
    got = check_splits(lambda: Poolside([WRITE_FILE]), text)
    assert (
        got.named_args == [("write_file", {"content": CODE, "mode": 420}), ("noop", {})] and got.content == ""
    )
