"""The ling3 tool parser: inclusionAI's Ling 3 writes GLM-4.7's calls (vLLM's parser/ling3.py is its
GLM-4.7 parser renamed), so ``ling3`` is dyn's ``glm47``. Recorded strings from vLLM's
tests/parser/engine/test_ling3.py."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.glm4_moe import Glm47ToolParser

Ling3 = TOOL_PARSERS.get("ling3")

WEATHER = Tool(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
)


def with_tools():
    return Ling3([WEATHER])


def test_name_resolves_to_glm47():
    assert Ling3 is Glm47ToolParser is TOOL_PARSERS.get("GLM47") and Ling3.needs_special_tokens
    assert TOOL_PARSERS.get("Ling3") is Ling3


def test_call_without_newline(check_splits):
    # vLLM test_ling3.py, test_ling3_tool_call_without_newline
    text = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>"
    got = check_splits(with_tools, text)
    assert got.named_args == [("get_weather", {"city": "Beijing"})] and got.content == ""


def test_text_then_two_calls_one_without_arguments(check_splits):
    # vLLM test_ling3_tool_call_without_args: "<tool_call>ping</tool_call>" is a call of ping with {}
    text = (
        "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>ping</tool_call>"
    )
    got = check_splits(with_tools, text)
    assert got.content == "Let me check."
    assert [(c.name, c.arguments) for c in got.calls] == [
        ("get_weather", '{"city": "Beijing", "days": 3}'),
        ("ping", "{}"),
    ]


def test_malformed_and_cut_off(check_splits, parse):
    bad = "<tool_call>not a name!<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"
    got = check_splits(with_tools, "Hm. " + bad)
    assert got.calls == [] and got.content == "Hm. " + bad
    got = parse(with_tools, ["<tool_call>get_weather<arg_key>city</arg_key><arg_value>Bei"])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("get_weather", "", False)]


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris", "days": 2})), ToolCall("ping", "{}")]
    text = Ling3.render(calls)
    assert text.startswith("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>")
    got = check_splits(with_tools, text)
    assert got.named_args == [(c.name, c.args) for c in calls] and got.content == ""
