"""The deepseek_v32 parser on DeepSeek-V3.2 DSML outputs (format: DeepSeek-V3.2's
encoding/encoding_dsv32.py; the recorded example in vLLM's
vllm/tool_parsers/deepseekv32_tool_parser.py docstring and Dynamo's
lib/parsers/src/tool_calling/test_cases/fixtures/deepseek_v3_2.rs)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

DeepSeekV32 = TOOL_PARSERS.get("deepseek_v32")

D = "｜DSML｜"
# DeepSeek-V3.2 asked for the weather in Hangzhou and Beijing (vLLM's parser docstring example)
TWO_CALLS = (
    f"<{D}function_calls>\n"
    f'<{D}invoke name="get_weather">\n<{D}parameter name="location" string="true">杭州</{D}parameter>\n'
    f'<{D}parameter name="date" string="true">2024-01-16</{D}parameter>\n</{D}invoke>\n'
    f'<{D}invoke name="get_weather">\n<{D}parameter name="location" string="true">北京</{D}parameter>\n'
    f'<{D}parameter name="date" string="true">2024-01-16</{D}parameter>\n</{D}invoke>\n'
    f"</{D}function_calls>"
)


def test_dynamo_spelling_is_registered():
    assert TOOL_PARSERS.get("deepseek_v3_2") is DeepSeekV32


def test_two_calls(check_splits):
    got = check_splits(DeepSeekV32, "我来查一下。\n\n" + TWO_CALLS)
    assert got.content == "我来查一下。\n\n"
    assert got.named_args == [
        ("get_weather", {"location": "杭州", "date": "2024-01-16"}),
        ("get_weather", {"location": "北京", "date": "2024-01-16"}),
    ]
    assert got.calls[0].arguments == json.dumps(
        {"location": "杭州", "date": "2024-01-16"}, ensure_ascii=False
    )


def test_string_attribute_and_schema_type_values(check_splits):
    text = (
        f'<{D}function_calls><{D}invoke name="search"><{D}parameter name="q" string="true">42</{D}parameter>'
        f'<{D}parameter name="n" string="false">3</{D}parameter>'
        f'<{D}parameter name="opts" string="false">{{"safe": true}}</{D}parameter>'
        f'<{D}parameter name="lang">en</{D}parameter><{D}parameter name="page">2</{D}parameter>'
        f"</{D}invoke></{D}function_calls>"
    )
    search = Tool("search", {"type": "object", "properties": {"page": {"type": "string"}}})
    got = check_splits(lambda: DeepSeekV32([search]), text)
    assert got.calls[0].args == {"q": "42", "n": 3, "opts": {"safe": True}, "lang": "en", "page": "2"}


def test_plain_text_is_content(check_splits):
    text = "Hangzhou: sunny. A <｜DSML｜ mention and <invoke> are text."
    assert check_splits(DeepSeekV32, text).content == text


def test_unreadable_body_is_content(check_splits):
    bad = f"<{D}function_calls><{D}invoke get_weather></{D}invoke></{D}function_calls>"
    got = check_splits(DeepSeekV32, bad)
    assert got.calls == [] and got.content == f"<{D}invoke get_weather></{D}invoke>"


def test_cut_off_call(parse):
    got = parse(DeepSeekV32, [TWO_CALLS[: TWO_CALLS.index("2024-01-16")]])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"location": "杭州"', False)
    ]
    got = parse(DeepSeekV32, [f'<{D}function_calls>\n<{D}invoke name="get_wea'])
    assert got.calls == [] and got.content == f'<{D}invoke name="get_wea'


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris", "days": 3})), ToolCall("noop", "{}")]
    got = check_splits(DeepSeekV32, DeepSeekV32.render(calls))
    assert (
        got.named_args == [("get_weather", {"city": "Paris", "days": 3}), ("noop", {})] and got.content == ""
    )
