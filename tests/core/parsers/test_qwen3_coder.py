"""The qwen3_coder parser on outputs of Qwen3-Coder models (format: the chat template of
Qwen/Qwen3-Coder-480B-A35B-Instruct and its qwen3coder_tool_parser.py; recorded outputs from vLLM's
tests/tool_parsers/test_qwen3coder_tool_parser.py, run with Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8's
tokenizer)."""

from __future__ import annotations

import json

from dyn.core.parsers.events import ToolCallArgs
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.qwen3_coder import convert_value

Qwen3Coder = TOOL_PARSERS.get("qwen3_coder")

WEATHER = Tool(
    "get_current_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "state": {"type": "string"},
            "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]},
        },
    },
)
AREA = Tool(
    "calculate_area",
    {
        "type": "object",
        "properties": {
            "shape": {"type": "string"},
            "dimensions": {"type": "object"},
            "precision": {"type": "integer"},
        },
    },
)
TOOLS = [WEATHER, AREA]


def with_tools():
    return Qwen3Coder(TOOLS)


def streamed(got):
    """(name, arguments so far, ended) of each call."""
    return [(c.name, c.arguments, c.complete) for c in got.calls]


# vLLM's "tool_with_typed_params": content, then a call whose values convert by the schema
QWEN3_CODER_TEXT_THEN_CALL = """Let me calculate that area for you.<tool_call>
<function=calculate_area>
<parameter=shape>
circle
</parameter>
<parameter=dimensions>
{"radius": 15.5}
</parameter>
<parameter=precision>
3
</parameter>
</function>
</tool_call>"""
# vLLM's "parallel_tools"
QWEN3_CODER_TWO_CALLS = """<tool_call>
<function=get_current_weather>
<parameter=city>
Dallas
</parameter>
<parameter=state>
TX
</parameter>
<parameter=unit>
fahrenheit
</parameter>
</function>
</tool_call>
<tool_call>
<function=get_current_weather>
<parameter=city>
Orlando
</parameter>
<parameter=state>
FL
</parameter>
<parameter=unit>
celsius
</parameter>
</function>
</tool_call>"""


def test_content_then_typed_call(check_splits):
    got = check_splits(with_tools, QWEN3_CODER_TEXT_THEN_CALL)
    assert got.content == "Let me calculate that area for you."
    args = {"shape": "circle", "dimensions": {"radius": 15.5}, "precision": 3}
    assert got.named_args == [("calculate_area", args)]
    # the pieces joined are exactly the unary result
    assert got.calls[0].arguments == json.dumps(args)
    assert got.calls[0].complete


def test_arguments_stream_a_parameter_at_a_time():
    parser = with_tools()
    pieces = []
    for part in QWEN3_CODER_TEXT_THEN_CALL.split("</parameter>"):
        pieces.append([e.text for e in parser.feed(part + "</parameter>") if isinstance(e, ToolCallArgs)])
    assert pieces[:3] == [['{"shape": "circle"'], [', "dimensions": {"radius": 15.5}'], [', "precision": 3']]


def test_parallel_calls(check_splits):
    got = check_splits(with_tools, QWEN3_CODER_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [
        ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}),
        ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "celsius"}),
    ]
    assert all(c.complete for c in got.calls)


def test_values_without_schema_are_text(check_splits):
    # no tools given (or a parameter the schema does not list): every value is a string
    got = check_splits(Qwen3Coder, QWEN3_CODER_TEXT_THEN_CALL)
    assert got.named_args == [
        ("calculate_area", {"shape": "circle", "dimensions": '{"radius": 15.5}', "precision": "3"})
    ]


def test_multiline_value_and_missing_closing_tags(check_splits):
    # vLLM's "missing closing parameter tag" case: a value ends at the next <parameter=
    text = (
        "Let me check the weather for you:\n<tool_call>\n<function=get_current_weather>\n"
        "<parameter=city>\nDallas\n<parameter=state>\nTX\n</parameter>\n"
        "<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>"
    )
    got = check_splits(with_tools, text)
    assert got.content == "Let me check the weather for you:\n"
    assert got.named_args == [
        ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})
    ]
    # no </function>: the call ends with </tool_call>; a value keeps its inner newlines
    got = check_splits(
        Qwen3Coder,
        "<tool_call>\n<function=write>\n<parameter=code>\n"
        "def f():\n    return 1\n\n</parameter>\n</tool_call>",
    )
    assert got.named_args == [("write", {"code": "def f():\n    return 1\n"})] and got.calls[0].complete


def test_plain_text_is_content(check_splits):
    text = "This is a test response without any tool calls. <function=x> in prose is text too."
    assert check_splits(with_tools, text).content == text


def test_unreadable_body_is_content(check_splits):
    for text in (
        "<tool_call>\nnot xml\n</tool_call>",
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        "<tool_call>\n<function=\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
    ):
        got = check_splits(with_tools, text)
        assert got.calls == [] and got.content == text


def test_cut_off_call(parse):
    # the parameter being written when max_tokens hit is not sent; the call has no end
    got = parse(
        with_tools,
        [
            (
                "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n"
                "</parameter>\n<parameter=state>\nT"
            )
        ],
    )
    assert streamed(got) == [("get_current_weather", '{"city": "Dallas"', False)]
    got = parse(with_tools, ["<tool_call>\n<function=get_current_weather>\n<param"])
    assert streamed(got) == [("get_current_weather", "", False)]
    text = "Sure.<tool_call>\n<function=get_curr"
    got = parse(with_tools, [text])
    assert got.calls == [] and got.content == text


def test_schema_types():
    assert convert_value("42", {"type": "integer"}) == 42
    assert convert_value("4.0", {"type": "number"}) == 4 and convert_value("2.5", {"type": "float"}) == 2.5
    assert convert_value("True", {"type": "boolean"}) is True
    assert convert_value("yes", {"type": "boolean"}) is False
    assert convert_value("[1, 2]", {"type": "array"}) == [1, 2]
    assert convert_value("{'a': (1, None)}", {"type": "object"}) == {"a": [1, None]}
    assert convert_value("NULL", {"type": "string"}) is None
    assert convert_value("abc", {"type": "integer"}) == "abc"
    assert convert_value("inf", {"type": "number"}) == "inf"
    assert convert_value("5", {"anyOf": [{"type": "null"}, {"type": "integer"}]}) == 5
    assert convert_value("5", {"type": ["null", "integer"]}) == 5
    assert convert_value("5", {"description": "untyped"}) == "5"
    assert convert_value("{1, 2}", {"type": "object"}) == "{1, 2}"  # a set is no JSON value
    assert convert_value("[NaN]", {"type": "array"}) == "[NaN]"
    assert convert_value("1e999", {"type": "any"}) == "1e999"
    assert convert_value("__import__('os')", {"type": "object"}) == "__import__('os')"  # never evaluated


def test_render_reads_back(check_splits):
    args = {"shape": "square", "dimensions": {"side": 2}, "precision": 1}
    calls = [ToolCall("calculate_area", json.dumps(args)), ToolCall("noop", "{}")]
    got = check_splits(with_tools, Qwen3Coder.render(calls))
    assert got.named_args == [("calculate_area", args), ("noop", {})] and got.content == ""
    assert TOOL_PARSERS.get("qwen3_xml") is Qwen3Coder and TOOL_PARSERS.get("nemotron_nano") is Qwen3Coder
