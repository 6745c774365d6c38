"""The step3p5 parser on outputs of Step-3.5-Flash (format: stepfun-ai/Step-3.5-Flash's chat template,
the Qwen3-Coder XML grammar unchanged; recorded outputs from vLLM's
tests/tool_parsers/test_step3p5_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.qwen3_coder import Qwen3CoderToolParser

Step3p5 = TOOL_PARSERS.get("step3p5")

TOOLS = [
    Tool(
        "get_current_weather",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "state": {"type": "string"},
                "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]},
            },
        },
    ),
    Tool(
        "calculate_area",
        {
            "type": "object",
            "properties": {
                "shape": {"type": "string"},
                "dimensions": {"type": "object"},
                "precision": {"type": "integer"},
            },
        },
    ),
]


def with_tools():
    return Step3p5(TOOLS)


# vLLM's "single_tool_with_content"
STEP3P5_TEXT_THEN_CALL = """Sure! Let me check the weather for you.<tool_call>
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
</tool_call>"""
# vLLM's "parallel_tools"
STEP3P5_TWO_CALLS = """<tool_call>
<function=get_current_weather>
<parameter=city>
Dallas
</parameter>
<parameter=state>
TX
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
</function>
</tool_call>"""
# vLLM's "single_tool_multiline_param"
STEP3P5_MULTILINE = """<tool_call>
<function=calculate_area>
<parameter=shape>
rectangle
</parameter>
<parameter=dimensions>
{"width": 10,
 "height": 20}
</parameter>
<parameter=precision>
2
</parameter>
</function>
</tool_call>"""


def test_content_then_one_call(check_splits):
    got = check_splits(with_tools, STEP3P5_TEXT_THEN_CALL)
    assert got.content == "Sure! Let me check the weather for you."
    assert got.named_args == [
        ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})
    ]
    assert got.calls[0].complete


def test_two_calls(check_splits):
    got = check_splits(with_tools, STEP3P5_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [
        ("get_current_weather", {"city": "Dallas", "state": "TX"}),
        ("get_current_weather", {"city": "Orlando", "state": "FL"}),
    ]


def test_values_typed_by_the_schema(check_splits):
    got = check_splits(with_tools, STEP3P5_MULTILINE)
    assert got.named_args == [
        ("calculate_area", {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2})
    ]


def test_markup_inside_a_value(check_splits):
    text = (
        "<tool_call>\n<function=write_file>\n<parameter=content>\n"
        'say "hi" <tool_call> {"a": 1}\n</parameter>\n</function>\n</tool_call>'
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [("write_file", {"content": 'say "hi" <tool_call> {"a": 1}'})]


def test_cut_off_call(parse):
    got = parse(
        with_tools,
        ["<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<par"],
    )
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_current_weather", '{"city": "Dallas"', False)
    ]


def test_unreadable_body_is_content(check_splits):
    text = "<tool_call>\nnot xml\n</tool_call>"
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == text


def test_plain_text_is_content(check_splits):
    text = "This is a test response without any tool calls"
    assert check_splits(with_tools, text).content == text


def test_same_format_as_qwen3_coder_and_render_reads_back(check_splits):
    assert issubclass(Step3p5, Qwen3CoderToolParser) and Step3p5.name == "step3p5"
    assert TOOL_PARSERS.get("qwen3_coder").name == "qwen3_coder"  # the alias left its base's name alone
    args = {"shape": "circle", "dimensions": {"radius": 1.5}, "precision": 3}
    text = Step3p5.render([ToolCall("calculate_area", json.dumps(args))])
    got = check_splits(with_tools, text)
    assert got.named_args == [("calculate_area", args)] and got.content == ""
