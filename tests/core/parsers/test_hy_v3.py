"""The hy_v3 parser on outputs of Tencent Hy3 (format: tencent/Hy3-preview's chat template; outputs
from vLLM's tests/tool_parsers/test_hy_v3_tool_parser.py, which runs on the Hy3-preview tokenizer,
and a recorded Hy3-preview agent turn)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.hy_v3 import HyV3ToolParser, Markers, hy_value, token_suffix

HyV3 = TOOL_PARSERS.get("hy_v3")

WEATHER = Tool(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}, "date": {"type": "string"}}},
)
DATE = Tool("get_current_date", {})
TYPED = Tool(
    "typed",
    {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "arr": {"type": "array"},
            "obj": {"type": "object"},
            "alias_int": {"type": "int"},
            "prefix_uint": {"type": "uint32"},
            "union": {"type": ["string", "object"]},
            "any_of": {"anyOf": [{"type": "string"}, {"type": "array"}]},
            "nullable": {"type": ["integer", "null"]},
        },
    },
)


def with_tools():
    return HyV3([WEATHER, DATE, TYPED])


class Vocabulary:
    """What the parser reads of the served model's tokenizer: its added tokens."""

    def __init__(self, suffix: str) -> None:
        names = ("think", "tool_calls", "tool_call", "tool_sep", "arg_key", "arg_value")
        tokens = [f"<{n}{suffix}>" for n in names] + [f"</{n}{suffix}>" for n in names]
        self.added_tokens = dict(enumerate(["<｜hy_eos｜>", *tokens], 120000))


# vLLM's test_args_with_newlines and test_multiple: the template's layout, one tag per line
TWO_CALLS = (
    "<tool_calls>\n<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n<arg_value>Beijing"
    "</arg_value>\n<arg_key>date</arg_key>\n<arg_value>2026-03-30</arg_value>\n</tool_call>\n"
    "<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n<arg_value>Hangzhou</arg_value>\n"
    "<arg_key>date</arg_key>\n<arg_value>2026-03-30</arg_value>\n</tool_call>\n</tool_calls>"
)
# a Hy3-preview agent turn (recorded in a public opencode transcript): text, then a call
AGENT_TURN = (
    "Let's read the relevant files:\n\nFirst, read public/worklets/recorder.worklet.js:<tool_calls>\n"
    "<tool_call>read<tool_sep>\n<arg_key>filePath</arg_key>\n"
    "<arg_value>/home/user/code/awnn/public/worklets/recorder.worklet.js</arg_value>\n"
    "</tool_call>\n</tool_calls>"
)


def test_two_calls_one_tag_per_line(check_splits):
    got = check_splits(with_tools, TWO_CALLS)
    assert got.content == ""
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"city": "Beijing", "date": "2026-03-30"}', True),
        ("get_weather", '{"city": "Hangzhou", "date": "2026-03-30"}', True),
    ]


def test_text_before_the_calls_is_content(check_splits):
    got = check_splits(with_tools, AGENT_TURN)
    assert got.content == "Let's read the relevant files:\n\nFirst, read public/worklets/recorder.worklet.js:"
    assert got.named_args == [
        ("read", {"filePath": "/home/user/code/awnn/public/worklets/recorder.worklet.js"})
    ]


def test_same_line_arguments_and_calls_without_arguments(check_splits):
    # vLLM's test_args_same_line and test_zero_arg_inline / test_zero_arg_newline
    text = (
        "<tool_calls><tool_call>get_weather<tool_sep><arg_key>city</arg_key><arg_value>Beijing"
        "</arg_value><arg_key>date</arg_key><arg_value>2026-03-30</arg_value></tool_call></tool_calls>"
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [("get_weather", {"city": "Beijing", "date": "2026-03-30"})]
    got = check_splits(
        with_tools, "<tool_calls><tool_call>get_current_date<tool_sep></tool_call></tool_calls>"
    )
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("get_current_date", "{}", True)]
    got = check_splits(
        with_tools,
        "Checking.<tool_calls>\n<tool_call>get_current_date<tool_sep>\n</tool_call>\n</tool_calls>",
    )
    assert got.content == "Checking." and got.named_args == [("get_current_date", {})]


def test_values_typed_by_the_schema(check_splits):
    pairs = [("s", "007"), ("i", "3"), ("n", "5"), ("b", "True"), ("arr", '["a", "b"]'), ("obj", '{"k": 1}')]
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs)
    got = check_splits(
        with_tools, f"<tool_calls>\n<tool_call>typed<tool_sep>\n{body}</tool_call>\n</tool_calls>"
    )
    assert (
        got.calls[0].arguments
        == '{"s": "007", "i": 3, "n": 5, "b": true, "arr": ["a", "b"], "obj": {"k": 1}}'
    )
    props = TYPED.parameters["properties"]
    assert hy_value("2.5", props["n"]) == 2.5 and hy_value("1e3", props["n"]) == 1000.0
    # type aliases, unions and parameters the schema does not list
    others = [
        ("alias_int", "7"),
        ("prefix_uint", "42"),
        ("union", '{"a": 1}'),
        ("any_of", "plain"),
        ("nullable", "null"),
        ("unlisted", "42"),
    ]
    typed = {k: hy_value(v, props.get(k, {})) for k, v in others}
    assert typed == {
        "alias_int": 7,
        "prefix_uint": 42,
        "union": {"a": 1},
        "any_of": "plain",
        "nullable": None,
        "unlisted": "42",
    }


def test_values_that_do_not_fit_their_type_stay_text():
    props = TYPED.parameters["properties"]
    assert hy_value("many", props["i"]) == "many"
    assert hy_value("yes", props["b"]) == "yes"
    assert hy_value("1e999", props["n"]) == "1e999"  # no infinity in JSON
    assert hy_value("{'k': (1, 2)}", props["obj"]) == {"k": [1, 2]}  # a Python literal, as vLLM reads it
    assert hy_value("not json", props["arr"]) == "not json"
    assert hy_value(" spaced ", props["s"]) == " spaced "  # values are not trimmed


def test_call_cut_off_by_max_tokens(parse):
    head = "<tool_calls>\n<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
    got = parse(with_tools, [head + "<arg_key>date</arg_key>\n<arg_value>2026"])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"city": "Beijing"', False)
    ]
    got = parse(with_tools, ["Sure.<tool_calls>\n<tool_call>get_wea"])
    assert got.calls == [] and got.content == "Sure.<tool_call>get_wea"


def test_unreadable_calls_are_content(check_splits):
    text = (
        "<tool_calls>\n<tool_call><tool_sep>\n<arg_key>city</arg_key>\n<arg_value>X</arg_value>\n</tool_call>\n"
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Y</arg_value>\n</tool_call>\n"
        "<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n<arg_value>Z</arg_value>\n</tool_call>\n</tool_calls>"
    )
    got = check_splits(with_tools, text)
    assert got.content == (
        "<tool_call><tool_sep>\n<arg_key>city</arg_key>\n<arg_value>X</arg_value>\n</tool_call>"
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Y</arg_value>\n</tool_call>"
    )
    assert got.named_args == [("get_weather", {"city": "Z"})]


def test_plain_text_and_stray_markers_are_content(check_splits):
    text = "Compare a<b and b>c; <tool_calls> is the HY marker."
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == text


def test_suffixed_markers_from_the_vocabulary(check_splits):
    assert token_suffix(Vocabulary(":opensource")) == ":opensource"
    assert token_suffix(Vocabulary("")) == "" and token_suffix(None) == ""
    text = (
        "OK.<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
        "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris</arg_value:opensource>\n"
        "</tool_call:opensource>\n</tool_calls:opensource>"
    )
    got = check_splits(lambda: HyV3([WEATHER], tokenizer=Vocabulary(":opensource")), text)
    assert got.content == "OK." and got.named_args == [("get_weather", {"city": "Paris"})]
    # on such a checkpoint the bare tags are text, and on an unsuffixed one the suffixed tags are
    plain = "<tool_calls><tool_call>get_current_date<tool_sep></tool_call></tool_calls>"
    got = check_splits(lambda: HyV3([DATE], tokenizer=Vocabulary(":opensource")), plain)
    assert got.calls == [] and got.content == plain
    got = check_splits(lambda: HyV3([WEATHER], tokenizer=Vocabulary("")), text)
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("get_weather", json.dumps({"city": "Paris", "date": "2026-03-30"})),
        ToolCall("typed", json.dumps({"i": 2, "b": False, "obj": {"k": [1, "x"]}})),
        ToolCall("get_current_date", "{}"),
    ]
    text = HyV3.render(calls)
    assert text.startswith(
        "<tool_calls>\n<tool_call>get_weather<tool_sep>\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    )
    got = check_splits(with_tools, text)
    assert got.content == "" and got.named_args == [(c.name, c.args) for c in calls]
    suffixed = HyV3ToolParser.write(calls[:1], Markers.of(":opensource"))
    assert suffixed.startswith("<tool_calls:opensource>\n<tool_call:opensource>get_weather")
    got = check_splits(lambda: HyV3([WEATHER], tokenizer=Vocabulary(":opensource")), suffixed)
    assert got.named_args == [(calls[0].name, calls[0].args)]


def test_name_resolves():
    assert HyV3 is HyV3ToolParser and TOOL_PARSERS.get("HY-V3") is HyV3ToolParser
    assert isinstance(HyV3([], tokenizer=Vocabulary(":opensource")), HyV3ToolParser)
    assert HyV3ToolParser.takes_tokenizer and not HyV3ToolParser.needs_special_tokens
