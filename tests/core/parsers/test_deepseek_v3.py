"""The deepseek_v3 parser on DeepSeek-V3 / R1-0528 outputs (format: DeepSeek-V3's
tokenizer_config.json chat template; recorded strings from vLLM's
tests/tool_parsers/test_deepseekv3_tool_parser.py and Dynamo's
lib/parsers/src/tool_calling/json/deepseek_v3_parser.rs tests)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

DeepSeekV3 = TOOL_PARSERS.get("deepseek_v3")

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

# DeepSeek-V3 calling two tools in parallel (vLLM test_deepseekv3_tool_parser.py, parallel_tool_calls_output)
PARALLEL = (
    f'{B}{CB}function{SEP}get_weather\n```json\n{{"city": "Tokyo", "unit": "celsius"}}\n```{CE}'
    f'{CB}function{SEP}search_hotels\n```json\n{{"location": "Tokyo", "check_in": "2025-01-15"}}\n```{CE}{E}'
)
# DeepSeek-V3.1-Terminus in a coding agent: prose, then a call with multi-line JSON
# (Dynamo deepseek_v3_parser.rs, test_parse_tool_calls_deepseek_v3_with_multiline_json, shortened)
AGENT = (
    "I'll help you understand this codebase. Let me start by exploring the structure.\n"
    f'{B}{CB}function{SEP}TodoWrite\n```json\n{{"todos":\n  [{{"content": "Explore the root directory", '
    f'"status": "in_progress"}}]}}\n```{CE}{E}'
)


def test_parallel_calls(check_splits):
    got = check_splits(DeepSeekV3, PARALLEL)
    assert got.content == ""
    assert got.named_args == [
        ("get_weather", {"city": "Tokyo", "unit": "celsius"}),
        ("search_hotels", {"location": "Tokyo", "check_in": "2025-01-15"}),
    ]
    assert all(c.complete and c.id is None for c in got.calls)
    # the arguments are the model's own JSON text, verbatim
    assert got.calls[0].arguments == '{"city": "Tokyo", "unit": "celsius"}'


def test_content_before_call_and_multiline_json(check_splits):
    got = check_splits(DeepSeekV3, AGENT)
    assert got.content == "I'll help you understand this codebase. Let me start by exploring the structure.\n"
    assert got.named_args == [
        ("TodoWrite", {"todos": [{"content": "Explore the root directory", "status": "in_progress"}]})
    ]


def test_text_after_section_is_content(check_splits):
    got = check_splits(DeepSeekV3, f"{B}{CB}function{SEP}f\n```json\n{{}}\n```{CE}{E}\n\nDone.")
    assert got.named_args == [("f", {})] and got.content == "Done."


def test_plain_text_is_content(check_splits):
    text = "How can I help you today? <｜tool | a ``` json { } fence ``` and a full-width ｜ bar."
    assert check_splits(DeepSeekV3, text).content == text


def test_unreadable_bodies_are_content(check_splits):
    # no separator at all: the call markers come back as content
    bad = f"{B}{CB}function get_weather {{}}{CE}{E}"
    got = check_splits(DeepSeekV3, bad)
    assert got.calls == [] and got.content == f"{CB}function get_weather {{}}{CE}"
    # a section start not followed by a call stays content, markers included
    loose = f'{B}function{SEP}get_weather\n```json\n{{"city": "Tokyo"}}\n```{E}'
    got = check_splits(DeepSeekV3, loose)
    assert got.calls == [] and got.content == loose


def test_v31_shape_is_read_too(check_splits):
    got = check_splits(DeepSeekV3, f'{B}{CB}get_weather{SEP}{{"city": "Paris"}}{CE}{E}')
    assert got.named_args == [("get_weather", {"city": "Paris"})]


def test_cut_off_call(parse):
    # max_tokens inside the arguments: streamed as far as it got, never ended
    got = parse(DeepSeekV3, [f'Sure.{B}{CB}function{SEP}get_weather\n```json\n{{"city": "Tok'])
    assert got.content == "Sure."
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("get_weather", '{"city": "Tok', False)]
    # the JSON was complete, the closing fence and markers were not: a complete call
    got = parse(DeepSeekV3, [f'{B}{CB}function{SEP}f\n```json\n{{"a": 1}}\n``'])
    assert [(c.name, c.args, c.complete) for c in got.calls] == [("f", {"a": 1}, True)]
    # cut off before the name (and the arguments' brace) was read: the text is content
    got = parse(DeepSeekV3, [f"{B}{CB}function{SEP}get_wea"])
    assert got.calls == [] and got.content == f"{CB}function{SEP}get_wea"


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"city": "Paris"})), ToolCall("noop", "{}")]
    rendered = DeepSeekV3.render(calls)
    assert rendered.startswith(f"{B}{CB}function{SEP}get_weather\n```json\n")
    got = check_splits(DeepSeekV3, rendered)
    assert got.named_args == [("get_weather", {"city": "Paris"}), ("noop", {})] and got.content == ""
