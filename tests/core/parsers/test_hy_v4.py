"""The hy_v4 parser on HYV4 outputs (format: vLLM's hy_v4 parser and its tests
tests/tool_parsers/test_hy_v4_tool_parser.py and the truncated-stream tests, whose vocabulary
mirrors tencent/Hy4-preview's: every marker with the ``:opensource`` suffix, no ``<tool_sep>``)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.hy_v3 import Markers
from dyn.core.parsers.tool.hy_v4 import HyV4ToolParser

HyV4 = TOOL_PARSERS.get("hy_v4")
S = ":opensource"

WEATHER = Tool(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
)
DATE = Tool("get_current_date", {"type": "object", "properties": {}})


class Vocabulary:
    """What the parser reads of the served model's tokenizer: its added tokens."""

    def __init__(self, suffix: str = S) -> None:
        names = ("think", "tool_calls", "tool_call", "arg_key", "arg_value")
        self.added_tokens = dict(
            enumerate([f"<{n}{suffix}>" for n in names] + [f"</{n}{suffix}>" for n in names])
        )


def with_tools(suffix: str = S):
    return lambda: HyV4([WEATHER, DATE], tokenizer=Vocabulary(suffix))


def arg(key: str, value: str) -> str:
    return f"<arg_key{S}>{key}</arg_key{S}><arg_value{S}>{value}</arg_value{S}>"


def call(name: str, args: str = "") -> str:
    return f"<tool_call{S}>{name}{args}</tool_call{S}>"


def block(body: str) -> str:
    return f"<tool_calls{S}>\n{body}\n</tool_calls{S}>"


# vLLM's test_values_typed_from_schema and test_multiple_calls_keep_their_order
TEXT_THEN_CALL = "sure!" + block(call("get_weather", arg("city", "Beijing") + arg("days", "3")))
TWO_CALLS = block(call("get_weather", arg("city", "北京")) + call("get_current_date"))


def test_text_then_a_call_with_typed_values(check_splits):
    got = check_splits(with_tools(), TEXT_THEN_CALL)
    assert got.content == "sure!"
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"city": "Beijing", "days": 3}', True)
    ]


def test_two_calls_one_without_arguments(check_splits):
    got = check_splits(with_tools(), TWO_CALLS)
    assert got.content == ""
    assert [(c.name, c.arguments) for c in got.calls] == [
        ("get_weather", '{"city": "北京"}'),
        ("get_current_date", "{}"),
    ]


def test_unknown_tool_keeps_values_as_text(check_splits):
    got = check_splits(with_tools(), block(call("mystery", arg("x", "1") + arg("days", "2"))))
    assert got.calls[0].arguments == '{"x": "1", "days": "2"}'


def test_call_cut_off_by_max_tokens(parse):
    # vLLM's test_hy4_truncated_mid_value: the complete pair goes out, the cut one does not
    text = (
        f"<tool_calls{S}>\n<tool_call{S}>get_weather"
        + arg("city", "Beijing")
        + f"<arg_key{S}>days</arg_key{S}><arg_value{S}>2"
    )
    got = parse(with_tools(), [text])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"city": "Beijing"', False)
    ]
    # cut off inside the name: nothing to call, the text is content
    got = parse(with_tools(), [f"<tool_calls{S}>\n<tool_call{S}>get_wea"])
    assert got.calls == [] and got.content == f"<tool_call{S}>get_wea"


def test_whitespace_between_a_key_and_its_value(check_splits):
    # vLLM's test_hy4_truncated_with_whitespace_between_tags: the template writes none, a model may
    text = block(
        f"<tool_call{S}>get_weather<arg_key{S}>city</arg_key{S}>\n<arg_value{S}>Beijing</arg_value{S}></tool_call{S}>"
    )
    assert check_splits(with_tools(), text).named_args == [("get_weather", {"city": "Beijing"})]


def test_unreadable_calls_are_content(check_splits):
    # vLLM's empty_function_name: a call without a name (and one with a separator in its name)
    text = block(
        call("", arg("city", "X"))
        + call(f"get_weather<tool_sep{S}>", arg("city", "Y"))
        + call("get_current_date")
    )
    got = check_splits(with_tools(), text)
    assert got.content == call("", arg("city", "X")) + call(f"get_weather<tool_sep{S}>", arg("city", "Y"))
    assert got.named_args == [("get_current_date", {})]


def test_markers_of_other_suffixes_are_text(check_splits):
    plain = "<tool_calls><tool_call>get_current_date</tool_call></tool_calls>"
    got = check_splits(with_tools(), plain)
    assert got.calls == [] and got.content == plain
    assert check_splits(with_tools(""), plain).named_args == [("get_current_date", {})]
    # a suffix holding regex metacharacters (vLLM's test_regex_metacharacters_in_suffix)
    odd = ":a+b(c"
    text = f"<tool_calls{odd}><tool_call{odd}>get_weather<arg_key{odd}>days</arg_key{odd}><arg_value{odd}>4</arg_value{odd}></tool_call{odd}></tool_calls{odd}>"
    assert check_splits(with_tools(odd), text).named_args == [("get_weather", {"days": 4})]


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("get_weather", json.dumps({"city": "Paris", "days": 2})),
        ToolCall("get_current_date", "{}"),
    ]
    text = HyV4.render(calls)
    assert text == (
        "<tool_calls>\n<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call><tool_call>get_current_date</tool_call>\n</tool_calls>"
    )
    got = check_splits(with_tools(""), text)
    assert got.content == "" and got.named_args == [(c.name, c.args) for c in calls]
    suffixed = HyV4ToolParser.write(calls, Markers.of(S))
    assert check_splits(with_tools(), suffixed).named_args == [(c.name, c.args) for c in calls]


def test_name_resolves():
    assert HyV4 is HyV4ToolParser and TOOL_PARSERS.get("HY-V4") is HyV4ToolParser
    assert HyV4ToolParser.takes_tokenizer and not HyV4ToolParser.needs_special_tokens
