"""The deepseek_v41 tool parser on DeepSeek-V4.1 outputs (format: vLLM's parser/deepseek_v41.py; the
recorded block is vLLM's tests/parser/engine/test_deepseek_v41.py ``CALLS``)."""

from __future__ import annotations

import json

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.deepseek_v41 import DeepSeekV41ToolParser

V41 = TOOL_PARSERS.get("deepseek_v41")
D = "\uff5cDSML\uff5c"

WEATHER = Tool(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}, "count": {"type": "integer"}}},
)
ADD = Tool("add", {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}})


def with_tools():
    return V41([WEATHER, ADD])


# vLLM's test_deepseek_v41.py: two invokes after a short answer
CALLS = (
    f'\n\n<{D} calls>\n<{D} invoke name="get_weather">\n'
    f'<{D} parameter name="city" string="true">杭州</{D} parameter>\n'
    f'<{D} parameter name="count" string="false">42</{D} parameter>\n'
    f'</{D} invoke>\n<{D} invoke name="add">\n'
    f'<{D} parameter name="x" string="false">1.5</{D} parameter>\n'
    f'<{D} parameter name="y" string="false">2.25</{D} parameter>\n'
    f"</{D} invoke>\n</{D} calls>"
)


def test_names():
    assert V41 is DeepSeekV41ToolParser and V41.name == "deepseek_v41"
    assert V41 is not TOOL_PARSERS.get("deepseek_v4") and V41.needs_special_tokens
    assert TOOL_PARSERS.get("DeepSeek-V41") is V41


def test_content_then_two_calls(check_splits):
    got = check_splits(with_tools, "Checking." + CALLS)
    assert got.content == "Checking.\n\n"
    assert got.named_args == [("get_weather", {"city": "杭州", "count": 42}), ("add", {"x": 1.5, "y": 2.25})]
    assert got.calls[0].arguments == '{"city": "杭州", "count": 42}'
    assert all(c.complete for c in got.calls)


def test_with_the_reasoning_parser(check_splits):
    # the whole output of a thinking turn: vLLM gives reasoning "Plan.", content "Checking.\n\n"
    reasoning = REASONING_PARSERS.get("deepseek_v41")
    got = check_splits(lambda: reasoning(None, {}), "Plan.</think>Checking." + CALLS)
    assert got.reasoning == "Plan." and got.content == "Checking." + CALLS
    got = check_splits(lambda: reasoning(None, {}), f'Plan<{D} calls>\n<{D} invoke name="add">')
    assert got.reasoning == "Plan" and got.content == f'<{D} calls>\n<{D} invoke name="add">'


def test_values_without_string_attribute_typed_by_schema(check_splits):
    text = (
        f'<{D} calls>\n<{D} invoke name="get_weather">\n<{D} parameter name="count">7</{D} parameter>\n'
        f'<{D} parameter name="city">12</{D} parameter>\n'
        f'<{D} parameter name="object" string="false">{{"a": [true, null]}}</{D} parameter>\n'
        f'<{D} parameter name="bad" string="false">[broken</{D} parameter>\n'
        f'<{D} parameter name="text" string="true">  a<b</{D} parameter>\n'
        f"</{D} invoke>\n</{D} calls>"
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [
        (
            "get_weather",
            {"count": 7, "city": "12", "object": {"a": [True, None]}, "bad": "[broken", "text": "  a<b"},
        )
    ]


def test_v4_elements_are_not_v41_calls(check_splits):
    text = f'x<{D}tool_calls>\n<{D}invoke name="get_weather">\n</{D}invoke>\n</{D}tool_calls>'
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == text


def test_unreadable_invoke_is_content(check_splits):
    text = f"<{D} calls>\n<{D} invoke>\n</{D} invoke>\n</{D} calls>"
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == f"<{D} invoke>\n</{D} invoke>"


def test_cut_off_call(parse):
    text = f'<{D} calls>\n<{D} invoke name="get_weather">\n<{D} parameter name="city" string="true">杭州</{D} parameter>\n<{D} param'
    got = parse(with_tools, [text])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"city": "杭州"', False)
    ]
    assert got.content == ""


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Oslo", "count": 2})), ToolCall("noop", "{}")]
    rendered = V41.render(calls)
    assert rendered.startswith(
        f'<{D} calls>\n<{D} invoke name="get_weather">\n<{D} parameter name="city" string="true">'
    )
    assert rendered.endswith(f"</{D} invoke>\n</{D} calls>")
    got = check_splits(with_tools, rendered)
    assert got.named_args == [(c.name, c.args) for c in calls] and got.content == ""
