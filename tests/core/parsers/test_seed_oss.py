"""The seed_oss parser on ByteDance Seed-OSS outputs (format: the chat template of
ByteDance-Seed/Seed-OSS-36B-Instruct, which vLLM reads with its Qwen3 XML grammar; outputs in the
shape of vLLM's tests/tool_parsers/test_seed_oss_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

SeedOss = TOOL_PARSERS.get("seed_oss")

WEATHER = Tool(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "location": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
    },
)


def with_tools():
    return SeedOss([WEATHER])


# after the reasoning (</seed:think>, the reasoning parser's): a short answer, then the call
ANSWER_THEN_CALL = """I'll check the weather in Barcelona for you.
<seed:tool_call>
<function=get_weather>
<parameter=location>Barcelona, Spain</parameter>
<parameter=unit>celsius</parameter>
<parameter=days>3</parameter>
</function>
</seed:tool_call>"""
TWO_CALLS = """<seed:tool_call>
<function=get_weather>
<parameter=location>Paris</parameter>
</function>
</seed:tool_call>
<seed:tool_call>
<function=get_weather>
<parameter=location>
New York
</parameter>
</function>
</seed:tool_call>"""


def test_content_then_typed_call(check_splits):
    got = check_splits(with_tools, ANSWER_THEN_CALL)
    assert got.content == "I'll check the weather in Barcelona for you.\n"
    assert got.named_args == [("get_weather", {"location": "Barcelona, Spain", "unit": "celsius", "days": 3})]
    assert got.calls[0].complete


def test_two_calls_and_newline_wrapped_values(check_splits):
    got = check_splits(with_tools, TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [
        ("get_weather", {"location": "Paris"}),
        ("get_weather", {"location": "New York"}),
    ]


def test_markup_and_quotes_inside_a_value(check_splits):
    text = '<seed:tool_call>\n<function=write>\n<parameter=body>say "<hi>" & <tool_call></parameter>\n</function>\n</seed:tool_call>'
    got = check_splits(with_tools, text)
    assert got.named_args == [("write", {"body": 'say "<hi>" & <tool_call>'})]


def test_qwen_markers_are_not_seed_calls(check_splits):
    text = "Qwen writes <tool_call>\n<function=f>\n</function>\n</tool_call> instead."
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == text


def test_unreadable_body_is_content(check_splits):
    text = '<seed:tool_call>\n{"name": "get_weather", "arguments": {}}\n</seed:tool_call>'
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == text


def test_cut_off_call(parse):
    got = parse(
        with_tools,
        ["<seed:tool_call>\n<function=get_weather>\n<parameter=location>Paris</parameter>\n<param"],
    )
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"location": "Paris"', False)
    ]


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"location": "Oslo", "days": 2})), ToolCall("noop", "{}")]
    rendered = SeedOss.render(calls)
    assert rendered.startswith(
        "<seed:tool_call>\n<function=get_weather>\n<parameter=location>Oslo</parameter>"
    )
    got = check_splits(with_tools, rendered)
    assert got.named_args == [(c.name, c.args) for c in calls]
