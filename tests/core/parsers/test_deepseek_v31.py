"""The deepseek_v31 parser on DeepSeek-V3.1 outputs (format: the DeepSeek-V3.1 model card's
"ToolCall" section and its chat template; recorded strings from vLLM's
tests/tool_parsers/test_deepseekv31_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall

DeepSeekV31 = TOOL_PARSERS.get("deepseek_v31")

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

# DeepSeek-V3.1 (non-thinking mode) answering a weather question with two calls after a sentence
PARALLEL = (
    f'Let me check both cities.{B}{CB}get_weather{SEP}{{"location": "Hangzhou", "unit": "celsius"}}{CE}'
    f'{CB}get_weather{SEP}{{"location": "Beijing", "unit": "celsius"}}{CE}{E}'
)


def test_dynamo_spelling_is_registered():
    assert TOOL_PARSERS.get("deepseek_v3_1") is DeepSeekV31


def test_parallel_calls_after_content(check_splits):
    got = check_splits(DeepSeekV31, PARALLEL)
    assert got.content == "Let me check both cities."
    assert got.named_args == [
        ("get_weather", {"location": "Hangzhou", "unit": "celsius"}),
        ("get_weather", {"location": "Beijing", "unit": "celsius"}),
    ]
    assert all(c.complete for c in got.calls)
    assert got.calls[1].arguments == '{"location": "Beijing", "unit": "celsius"}'


def test_nested_arguments_verbatim(check_splits):
    args = '{"query": "a < b } and \\"quoted\\"", "filters": {"tags": ["a", "b"]}, "n": 3}'
    got = check_splits(DeepSeekV31, f"{B}{CB}search{SEP}{args}{CE}{E}")
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("search", args, True)]
    assert got.calls[0].args["filters"] == {"tags": ["a", "b"]}


def test_plain_text_is_content(check_splits):
    text = "Hangzhou is sunny today, 25°C. <｜tool and sep｜> are not markers."
    assert check_splits(DeepSeekV31, text).content == text


def test_unreadable_body_is_content(check_splits):
    bad = f"{B}{CB}get_weather{SEP}Hangzhou, celsius{CE}{E}"
    got = check_splits(DeepSeekV31, bad)
    assert got.calls == [] and got.content == f"{CB}get_weather{SEP}Hangzhou, celsius{CE}"


def test_cut_off_call(parse):
    got = parse(DeepSeekV31, [f'{B}{CB}get_weather{SEP}{{"location": "Hang'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"location": "Hang', False)
    ]
    got = parse(DeepSeekV31, [f"{B}{CB}get_wea"])
    assert got.calls == [] and got.content == f"{CB}get_wea"


def test_render_reads_back(check_splits):
    calls = [ToolCall("get_weather", json.dumps({"location": "Paris"})), ToolCall("noop", "{}")]
    rendered = DeepSeekV31.render(calls)
    assert rendered == (f'{B}{CB}get_weather{SEP}{{"location": "Paris"}}{CE}{CB}noop{SEP}{{}}{CE}{E}')
    got = check_splits(DeepSeekV31, rendered)
    assert got.named_args == [("get_weather", {"location": "Paris"}), ("noop", {})]
