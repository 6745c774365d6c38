"""The glm45 / glm47 parsers on GLM outputs (format: zai-org/GLM-4.5 and GLM-4.7 chat
templates; recorded strings from vLLM's tests/tool_parsers/test_glm4_moe_tool_parser.py
(zai-org/GLM-4.5) and Dynamo's lib/parsers/src/tool_calling/test_cases/fixtures/glm47.rs)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

Glm45 = TOOL_PARSERS.get("glm45")
Glm47 = TOOL_PARSERS.get("glm47")

WEATHER = Tool(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "date": {"type": "string"},
            "days": {"type": "integer"},
            "zip": {"type": "string"},
        },
    },
)

# GLM-4.5 with prose before two calls and between them
# (vLLM test_glm4_moe_tool_parser.py, test_extract_tool_calls_mixed_content)
GLM45_TWO_CALLS = (
    "I will help you get the weather info.\n\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
    "<arg_value>Beijing</arg_value>\n<arg_key>date</arg_key>\n<arg_value>2025-08-01</arg_value>\n</tool_call>\n\n"
    "meaningwhile, I will also check the weather in Shanghai.\n\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
    "<arg_value>Shanghai</arg_value>\n<arg_key>date</arg_key>\n<arg_value>2025-08-01</arg_value>\n</tool_call>"
)
# GLM-4.7: the same call written back to back (Dynamo glm47.rs, case_1_single_call)
GLM47_CALL = (
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value>"
    "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
)


def test_glm45_calls_with_content_around(check_splits):
    got = check_splits(lambda: Glm45([WEATHER]), GLM45_TWO_CALLS)
    assert got.content == (
        "I will help you get the weather info.\n\n"
        "meaningwhile, I will also check the weather in Shanghai.\n\n"
    )
    assert got.named_args == [
        ("get_weather", {"city": "Beijing", "date": "2025-08-01"}),
        ("get_weather", {"city": "Shanghai", "date": "2025-08-01"}),
    ]
    # built member by member, the arguments are exactly the unary json.dumps
    assert got.calls[0].arguments == json.dumps({"city": "Beijing", "date": "2025-08-01"})
    assert all(c.complete for c in got.calls)


def test_glm47_back_to_back_pairs(check_splits):
    got = check_splits(lambda: Glm47([WEATHER]), GLM47_CALL)
    assert got.named_args == [("get_weather", {"city": "Beijing", "days": 3})] and got.content == ""


def test_values_typed_by_schema(check_splits):
    text = (
        "<tool_call>get_weather\n<arg_key>zip</arg_key>\n<arg_value>02134</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value> 7 </arg_value>\n<arg_key>tags</arg_key>\n"
        '<arg_value>["a", "b"]</arg_value>\n<arg_key>strict</arg_key>\n<arg_value>True</arg_value>\n'
        '<arg_key>note</arg_key>\n<arg_value>say "hi" </arg_value>\n</tool_call>'
    )
    got = check_splits(lambda: Glm45([WEATHER]), text)
    # a string parameter keeps its text; others are JSON, then a Python literal, else text
    assert got.calls[0].args == {
        "zip": "02134",
        "days": 7,
        "tags": ["a", "b"],
        "strict": True,
        "note": 'say "hi"',
    }
    # without a schema saying "string", a value that reads as a number is a number
    got = check_splits(
        Glm45, "<tool_call>get_weather\n<arg_key>zip</arg_key>\n<arg_value>12345</arg_value>\n</tool_call>"
    )
    assert got.calls[0].args == {"zip": 12345}


def test_call_without_arguments(check_splits):
    assert check_splits(Glm45, "<tool_call>get_current_time\n</tool_call>").calls[0].arguments == "{}"
    assert check_splits(Glm47, "<tool_call>get_current_time</tool_call>").calls[0].arguments == "{}"


def test_plain_text_is_content(check_splits):
    text = "This is a test. <arg_key>x</arg_key> and <tool_call without a close."
    assert check_splits(Glm45, text).content == text


def test_unreadable_body_is_content(check_splits):
    bad = "<tool_call>\n\n<arg_value>orphan</arg_value>\n</tool_call>"
    got = check_splits(Glm45, bad)
    assert got.calls == [] and got.content == bad
    bad_name = "<tool_call>get weather now</tool_call>"
    got = check_splits(Glm47, bad_name)
    assert got.calls == [] and got.content == bad_name


def test_cut_off_call(parse):
    # max_tokens in the second value: the first pair went out, the call never ended
    got = parse(
        lambda: Glm45([WEATHER]),
        [
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing"
            "</arg_value>\n<arg_key>date</arg_key>\n<arg_value>2025-"
        ],
    )
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"city": "Beijing"', False)
    ]
    # cut off in the name: the text is content
    got = parse(Glm47, ["Sure. <tool_call>get_wea"])
    assert got.calls == [] and got.content == "Sure. <tool_call>get_wea"


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("get_weather", json.dumps({"city": "Paris", "days": 3, "opts": {"metric": True}})),
        ToolCall("noop", "{}"),
    ]
    for parser in (Glm45, Glm47):
        got = check_splits(lambda parser=parser: parser([WEATHER]), parser.render(calls))
        assert got.named_args == [
            ("get_weather", {"city": "Paris", "days": 3, "opts": {"metric": True}}),
            ("noop", {}),
        ]
        assert got.content == ""
    assert Glm45.render(calls[1:]) == "<tool_call>noop\n</tool_call>"
    assert Glm47.render(calls[:1]) == (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>opts</arg_key>"
        '<arg_value>{"metric": true}</arg_value></tool_call>'
    )
