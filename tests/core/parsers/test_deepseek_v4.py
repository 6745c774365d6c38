"""The deepseek_v4 parser on DeepSeek-V4 outputs (format: vLLM's parser/deepseek_v4.py, whose
docstring gives the DSML block used here; the invokes are DeepSeek-V3.2's, encoding_dsv32.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

DeepSeekV4 = TOOL_PARSERS.get("deepseek_v4")
D = "\uff5cDSML\uff5c"

WEATHER = Tool(
    "get_weather",
    {"type": "object", "properties": {"location": {"type": "string"}, "count": {"type": "integer"}}},
)


def with_tools():
    return DeepSeekV4([WEATHER])


TWO_CALLS = (
    "我来查一下。\n\n"
    f"<{D}tool_calls>\n"
    f'<{D}invoke name="get_weather">\n'
    f'<{D}parameter name="location" string="true">杭州</{D}parameter>\n'
    f'<{D}parameter name="count" string="false">5</{D}parameter>\n'
    f"</{D}invoke>\n"
    f'<{D}invoke name="get_weather">\n'
    f'<{D}parameter name="location" string="true">北京 "center" <b></{D}parameter>\n'
    f"</{D}invoke>\n"
    f"</{D}tool_calls>"
)


def test_content_then_two_invokes(check_splits):
    got = check_splits(with_tools, TWO_CALLS)
    assert got.content == "我来查一下。\n\n"
    assert got.named_args == [
        ("get_weather", {"location": "杭州", "count": 5}),
        ("get_weather", {"location": '北京 "center" <b>'}),
    ]
    assert all(c.complete for c in got.calls)


def test_misspelled_block_openers_and_missing_string_attribute(check_splits):
    text = (
        f'<{D}toolcalls>\n<{D}invoke name="get_weather">\n'
        f'<{D}parameter name="count">7</{D}parameter>\n</{D}invoke>\n</{D}toolcalls>'
    )
    got = check_splits(with_tools, text)
    # no string attribute: typed by the schema
    assert got.named_args == [("get_weather", {"count": 7})] and got.content == ""


def test_v32_block_is_not_a_v4_block_but_its_invokes_are_read(check_splits):
    # an invoke outside any block is still a call (as DeepSeek-V3.2's parser reads it)
    text = f'<{D}function_calls>\n<{D}invoke name="get_weather">\n</{D}invoke>\n</{D}function_calls>'
    got = check_splits(with_tools, text)
    assert got.named_args == [("get_weather", {})]
    assert got.content == f"<{D}function_calls>\n</{D}function_calls>"


def test_plain_text_and_unreadable_invoke(check_splits):
    text = "DSML looks like <｜DSML｜something>, which is text here."
    assert check_splits(with_tools, text).content == text
    bad = f"<{D}tool_calls>\n<{D}invoke>\n</{D}invoke>\n</{D}tool_calls>"
    got = check_splits(with_tools, bad)
    assert got.calls == [] and got.content == f"<{D}invoke>\n</{D}invoke>"


def test_cut_off_call(parse):
    got = parse(
        with_tools,
        [f'<{D}tool_calls>\n<{D}invoke name="get_weather">\n<{D}parameter name="location" string="true">杭'],
    )
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("get_weather", "", False)]


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"location": "Oslo", "count": 2})), ToolCall("noop", "{}")]
    rendered = DeepSeekV4.render(calls)
    assert rendered.startswith(f"<{D}tool_calls>\n<{D}invoke") and rendered.endswith(f"</{D}tool_calls>")
    got = check_splits(with_tools, rendered)
    assert got.named_args == [(c.name, c.args) for c in calls]
