"""The kimi_k2 parser on Kimi K2 outputs (format: MoonshotAI/Kimi-K2 docs/tool_call_guidance.md,
"Manually Parsing Tool Calls"; recorded strings in the shape of vLLM's
tests/tool_parsers/test_kimi_k2_tool_parser.py for moonshotai/Kimi-K2-Instruct)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

KimiK2 = TOOL_PARSERS.get("kimi_k2")

SB, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, CE, ARG = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"

# Kimi-K2-Instruct on "What's the weather like in Beijing today? Let's check using the tool."
# (the tool_call_guidance.md conversation) followed by a second call
TWO_CALLS = (
    f'I\'ll check the weather for you.{SB}{CB}functions.get_weather:0{ARG}{{"city": "Beijing"}}{CE}'
    f'{CB}functions.get_news:1 {ARG}{{\n  "topic": "weather in Beijing"\n}}{CE}{SE}'
)


def test_two_calls_with_model_ids(check_splits):
    got = check_splits(KimiK2, TWO_CALLS)
    assert got.content == "I'll check the weather for you."
    assert got.named_args == [
        ("get_weather", {"city": "Beijing"}),
        ("get_news", {"topic": "weather in Beijing"}),
    ]
    assert [c.id for c in got.calls] == ["functions.get_weather:0", "functions.get_news:1"]
    assert got.calls[1].arguments == '{\n  "topic": "weather in Beijing"\n}'
    assert all(c.complete for c in got.calls)


def test_id_without_prefix_and_singular_section_marker(check_splits):
    text = (
        f'<|tool_call_section_begin|>{CB}get_weather:0{ARG}{{"city": "Tokyo"}}{CE}<|tool_call_section_end|>'
    )
    got = check_splits(KimiK2, text)
    assert got.named_args == [("get_weather", {"city": "Tokyo"})] and got.calls[0].id == "get_weather:0"
    assert got.content == ""


def test_bare_counter_names_the_matching_tool(check_splits):
    text = f'Let me check. {SB}{CB}0{ARG}{{"city": "Tokyo", "unit": "celsius"}}{CE}{SE}'
    weather = Tool(
        "get_weather",
        {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
    )
    read_file = Tool("read_file", {"type": "object", "properties": {"path": {"type": "string"}}})
    got = check_splits(lambda: KimiK2([weather]), text)
    assert (
        got.named_args == [("get_weather", {"city": "Tokyo", "unit": "celsius"})] and got.calls[0].id == "0"
    )
    got = check_splits(lambda: KimiK2([read_file, weather]), text)
    assert got.named_args == [("get_weather", {"city": "Tokyo", "unit": "celsius"})]
    # no tool to name it: the call cannot be read and stays content
    got = check_splits(KimiK2, text)
    assert (
        got.calls == []
        and got.content == f'Let me check. {CB}0{ARG}{{"city": "Tokyo", "unit": "celsius"}}{CE}'
    )


def test_plain_text_is_content(check_splits):
    text = "Beijing is sunny today. <|tool_calls and |> are just text here."
    assert check_splits(KimiK2, text).content == text


def test_unreadable_body_is_content(check_splits):
    bad = f"{SB}{CB}functions.get_weather{ARG}Beijing{CE}{SE}"
    got = check_splits(KimiK2, bad)
    assert got.calls == [] and got.content == f"{CB}functions.get_weather{ARG}Beijing{CE}"


def test_cut_off_call(parse):
    got = parse(KimiK2, [f'{SB}{CB}functions.get_weather:0{ARG}{{"city": "Bei'])
    assert [(c.name, c.id, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", "functions.get_weather:0", '{"city": "Bei', False)
    ]
    # the section end never came, the call end did (Dynamo's missing-end fixture): a complete call
    got = parse(KimiK2, [f'{SB}{CB}functions.get_weather:0{ARG}{{"city": "Beijing"}}{CE}'])
    assert [(c.name, c.args, c.complete) for c in got.calls] == [("get_weather", {"city": "Beijing"}, True)]
    # cut off before the argument marker: the name was not read, the text is content
    got = parse(KimiK2, [f"{SB}{CB}functions.get_wea"])
    assert got.calls == [] and got.content == f"{CB}functions.get_wea"


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("get_weather", json.dumps({"city": "Paris"}), id="functions.get_weather:3"),
        ToolCall("noop", "{}", id="call_abc"),
    ]
    rendered = KimiK2.render(calls)
    assert rendered == (
        f'{SB}{CB}functions.get_weather:3{ARG}{{"city": "Paris"}}{CE}{CB}functions.noop:1{ARG}{{}}{CE}{SE}'
    )
    got = check_splits(KimiK2, rendered)
    assert got.named_args == [("get_weather", {"city": "Paris"}), ("noop", {})]
    assert [c.id for c in got.calls] == ["functions.get_weather:3", "functions.noop:1"]
