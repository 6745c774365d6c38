"""The mimo parser on outputs of MiMo-V2-Flash (format: XiaomiMiMo/MiMo-V2-Flash's chat template, the
Qwen3-Coder XML grammar with compact, verbatim parameter values; vLLM's parser/mimo.py; recorded
outputs from vLLM's tests/tool_parsers/test_mimov2_flash_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.events import ToolCallArgs
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

MiMo = TOOL_PARSERS.get("mimo")

CODE = Tool(
    "execute_code",
    {
        "type": "object",
        "properties": {
            "language": {"type": "string"},
            "code": {"type": "string"},
            "timeout": {"type": "integer"},
            "env": {"type": "object"},
        },
    },
)


def with_tools():
    return MiMo([CODE])


# vLLM's test_extract_content_before_tool_call
MIMO_TEXT_THEN_CALL = """Let me execute that command for you.
<tool_call>
<function=execute_bash>
<parameter=command>pwd && ls</parameter>
</function>
</tool_call>"""
# vLLM's test_extract_multiple_tool_calls (its second call written the usual way round)
MIMO_TWO_CALLS = """Here is the result:
<tool_call>
<function=execute_bash>
<parameter=command>pwd</parameter>
</function>
</tool_call>
<tool_call>
<function=list_files>
<parameter=path>/tmp</parameter>
</function>
</tool_call>"""


def test_content_then_one_call(check_splits):
    got = check_splits(MiMo, MIMO_TEXT_THEN_CALL)
    assert got.content == "Let me execute that command for you.\n"
    assert got.named_args == [("execute_bash", {"command": "pwd && ls"})] and got.calls[0].complete


def test_two_calls(check_splits):
    got = check_splits(MiMo, MIMO_TWO_CALLS)
    assert got.content == "Here is the result:\n"
    assert got.named_args == [("execute_bash", {"command": "pwd"}), ("list_files", {"path": "/tmp"})]


def test_values_are_verbatim(check_splits):
    # vLLM's test_extract_tool_call_multiline_parameter; a value keeps the newlines at its ends
    text = (
        "<tool_call>\n<function=example_function_name>\n"
        "<parameter=example_parameter_1>value_1</parameter>\n"
        "<parameter=example_parameter_2>This is the value for the second parameter\n"
        "that can span\nmultiple lines</parameter>\n"
        "<parameter=code>def f():\n    return 1\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    got = check_splits(MiMo, text)
    assert got.named_args == [
        (
            "example_function_name",
            {
                "example_parameter_1": "value_1",
                "example_parameter_2": "This is the value for the second parameter\nthat can span\nmultiple lines",
                "code": "def f():\n    return 1\n",
            },
        )
    ]


def test_values_typed_by_the_schema_and_markup_inside_strings(check_splits):
    text = (
        "<tool_call>\n<function=execute_code>\n"
        "<parameter=language>python</parameter>\n"
        "<parameter=code>print(\"hello <tool_call> 'x'\")</parameter>\n"
        "<parameter=timeout>30</parameter>\n"
        '<parameter=env>{"DEBUG": "1"}</parameter>\n'
        "</function>\n</tool_call>"
    )
    got = check_splits(with_tools, text)
    args = {
        "language": "python",
        "code": "print(\"hello <tool_call> 'x'\")",
        "timeout": 30,
        "env": {"DEBUG": "1"},
    }
    assert got.named_args == [("execute_code", args)]
    assert got.calls[0].arguments == json.dumps(args)  # streamed pieces join to the unary result
    parser = with_tools()
    pieces = [
        e.text for e in parser.feed(text.split("<parameter=timeout>")[0]) if isinstance(e, ToolCallArgs)
    ]
    assert pieces == ['{"language": "python"', ', "code": "print(\\"hello <tool_call> \'x\'\\")"']


def test_call_without_parameters(check_splits):
    got = check_splits(MiMo, "<tool_call>\n<function=noop>\n</function>\n</tool_call>")
    assert got.named_args == [("noop", {})] and got.calls[0].arguments == "{}"


def test_cut_off_call(parse):
    got = parse(
        MiMo, ["<tool_call>\n<function=test>\n<parameter=arg1>value1</parameter>\n<parameter=arg2>val"]
    )
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("test", '{"arg1": "value1"', False)]
    text = "Sure.<tool_call>\n<function=te"
    got = parse(MiMo, [text])
    assert got.calls == [] and got.content == text


def test_unreadable_body_is_content(check_splits):
    text = '<tool_call>\n{"name": "execute_bash", "arguments": {}}\n</tool_call>'
    got = check_splits(MiMo, text)
    assert got.calls == [] and got.content == text


def test_plain_text_is_content(check_splits):
    text = "This is just regular text without any tool calls. <parameter=x> in prose too."
    got = check_splits(MiMo, text)
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    args = {"language": "python", "code": "print(1)\n", "timeout": 5, "env": {"A": "b"}}
    calls = [ToolCall("execute_code", json.dumps(args)), ToolCall("noop", "{}")]
    text = MiMo.render(calls)
    assert "<parameter=timeout>5</parameter>\n" in text
    got = check_splits(with_tools, text)
    assert got.named_args == [("execute_code", args), ("noop", {})] and got.content == ""
    assert MiMo.needs_special_tokens
