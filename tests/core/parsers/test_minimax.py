"""The minimax_m2 and minimax_m3 parsers on MiniMax outputs (formats: MiniMax-M2's chat template
and tool-calling guide, MiniMaxAI/MiniMax-M2 docs/tool_calling_guide.md; vLLM's
parser/minimax_m2.py and parser/minimax_m3.py, whose docstrings give the M3 example used here)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.schema_values import coerce, schema_types

M2 = TOOL_PARSERS.get("minimax_m2")
M3 = TOOL_PARSERS.get("minimax_m3")
NS = "]<]minimax[>["

WEATHER = Tool(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "location": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
    },
)
SEARCH = Tool(
    "search_web",
    {
        "type": "object",
        "properties": {
            "query_tag": {"type": "array", "items": {"type": "string"}},
            "query_list": {"type": "array", "items": {"type": "string"}},
        },
    },
)
ORDER = Tool(
    "create_order",
    {
        "type": "object",
        "properties": {
            "user_id": {"type": "integer"},
            "shipping": {"type": "object", "properties": {"zip": {"type": "string"}}},
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"qty": {"type": "integer"}}},
            },
            "gift": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    },
)


def m2():
    return M2([WEATHER, SEARCH])


def m3():
    return M3([ORDER, WEATHER])


# MiniMax-M2 after its reasoning (the guide's search example, values on one line each)
M2_SEARCH = (
    "I'll search for that.\n"
    "<minimax:tool_call>\n"
    '<invoke name="search_web">\n'
    '<parameter name="query_tag">["technology", "events"]</parameter>\n'
    '<parameter name="query_list">["\\"OpenAI\\" \\"latest\\" \\"release\\""]</parameter>\n'
    "</invoke>\n"
    "</minimax:tool_call>"
)
M2_TWO_CALLS = (
    "<minimax:tool_call>\n"
    '<invoke name="get_weather">\n'
    '<parameter name="location">San Francisco, CA</parameter>\n'
    '<parameter name="unit">celsius</parameter>\n'
    '<parameter name="days">3</parameter>\n'
    "</invoke>\n"
    '<invoke name="get_weather">\n'
    '<parameter name="location">Tokyo</parameter>\n'
    "</invoke>\n"
    "</minimax:tool_call>"
)


def test_m2_content_then_call_typed_by_schema(check_splits):
    got = check_splits(m2, M2_SEARCH)
    assert got.content == "I'll search for that.\n"
    assert got.named_args == [
        ("search_web", {"query_tag": ["technology", "events"], "query_list": ['"OpenAI" "latest" "release"']})
    ]
    assert got.calls[0].complete


def test_m2_two_invokes_in_one_block(check_splits):
    got = check_splits(m2, M2_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [
        ("get_weather", {"location": "San Francisco, CA", "unit": "celsius", "days": 3}),
        ("get_weather", {"location": "Tokyo"}),
    ]
    # joined pieces are the unary result, one member per parameter
    assert got.calls[0].arguments == json.dumps(
        {"location": "San Francisco, CA", "unit": "celsius", "days": 3}
    )


def test_m2_values_are_kept_as_written_and_text_without_schema(check_splits):
    text = (
        "<minimax:tool_call>\n<invoke name='run'>\n"
        '<parameter name="code">print("<b>")\n  x = 1 </parameter>\n'
        "<parameter name=n>7</parameter>\n"
        "</invoke>\n</minimax:tool_call>"
    )
    got = check_splits(m2, text)
    # quotes and markup inside a value stay; no tool lists these, so 7 stays text
    assert got.named_args == [("run", {"code": 'print("<b>")\n  x = 1 ', "n": "7"})]


def test_m2_unclosed_parameter_ends_at_the_next(check_splits):
    text = (
        '<minimax:tool_call>\n<invoke name="get_weather">\n'
        '<parameter name="location">Paris\n<parameter name="days">2</parameter>\n'
        "</invoke>\n</minimax:tool_call>"
    )
    got = check_splits(m2, text)
    assert got.named_args == [("get_weather", {"location": "Paris\n", "days": 2})]


def test_m2_plain_text_is_content(check_splits):
    text = "The <invoke> tag and <minimax:tool_call without its bracket are just prose."
    assert check_splits(m2, text).content == text


def test_m2_unreadable_invoke_is_content(check_splits):
    text = '<minimax:tool_call>\n<invoke name=>\n<parameter name="a">1</parameter>\n</invoke>\n</minimax:tool_call>'
    got = check_splits(m2, text)
    assert got.calls == []
    assert got.content == '<invoke name=>\n<parameter name="a">1</parameter>\n</invoke>'


def test_m2_cut_off_call(parse):
    got = parse(
        m2,
        [
            '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="location">Paris</parameter>\n'
            '<parameter name="days">1'
        ],
    )
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [
        ("get_weather", '{"location": "Paris"', False)
    ]


def test_m2_render_reads_back(check_splits):
    calls = [
        ToolCall("get_weather", json.dumps({"location": "Paris", "days": 2})),
        ToolCall("search_web", json.dumps({"query_tag": ["a", "b"]})),
    ]
    rendered = M2.render(calls)
    assert rendered.startswith(
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="location">Paris'
    )
    got = check_splits(m2, rendered)
    assert got.named_args == [(c.name, c.args) for c in calls]


# MiniMax-M3: vLLM's parser docstring example, with schema-typed nested values
M3_ORDER = (
    "Placing the order now.\n"
    f"{NS}<tool_call>\n"
    f'{NS}<invoke name="create_order">\n'
    f"{NS}<user_id>42{NS}</user_id>\n"
    f"{NS}<shipping>\n{NS}<zip>018956{NS}</zip>\n{NS}</shipping>\n"
    f"{NS}<items>\n"
    f"{NS}<item>{NS}<sku>book-001{NS}</sku>{NS}<qty>2{NS}</qty>{NS}</item>\n"
    f"{NS}<item>{NS}<sku>pen</sku>{NS}<qty>1{NS}</qty>{NS}</item>\n"
    f"{NS}</items>\n"
    f"{NS}<gift>true{NS}</gift>\n"
    f"{NS}<tags>{NS}</tags>\n"
    f"{NS}</invoke>\n"
    f"{NS}</tool_call>"
)


def test_m3_nested_elements_typed_by_schema(check_splits):
    got = check_splits(m3, M3_ORDER)
    assert got.content == "Placing the order now.\n"
    [(name, args)] = got.named_args
    assert name == "create_order"
    # the second item's sku closes with a bare </sku>: not an element end, so that item is
    # malformed and the elements stop there (vLLM keeps the parameters before it)
    assert args == {"user_id": 42, "shipping": {"zip": "018956"}}
    fixed = M3_ORDER.replace("pen</sku>", f"pen{NS}</sku>")
    got = check_splits(m3, fixed)
    assert got.named_args == [
        (
            "create_order",
            {
                "user_id": 42,
                "shipping": {"zip": "018956"},
                "items": [{"sku": "book-001", "qty": 2}, {"sku": "pen", "qty": 1}],
                "gift": True,
                "tags": [],
            },
        )
    ]


def test_m3_repeated_elements_collect_into_a_list_without_schema(check_splits):
    text = (
        f'{NS}<tool_call>\n{NS}<invoke name="notify">\n'
        f"{NS}<to>ann{NS}</to>\n{NS}<to>bob{NS}</to>\n{NS}<body>a <b>bold</b> note{NS}</body>\n"
        f"{NS}</invoke>\n{NS}</tool_call>"
    )
    got = check_splits(m3, text)
    assert got.named_args == [("notify", {"to": ["ann", "bob"], "body": "a <b>bold</b> note"})]


def test_m3_arguments_come_whole_at_the_invoke_end(parse):
    parser = m3()
    head = f'{NS}<tool_call>\n{NS}<invoke name="get_weather">\n{NS}<location>Oslo{NS}</location>\n'
    events = parser.feed(head)
    assert [type(e).__name__ for e in events] == ["ToolCallStart"]
    events = parser.feed(f"{NS}</invoke>\n{NS}</tool_call>") + parser.finish()
    assert [type(e).__name__ for e in events] == ["ToolCallArgs", "ToolCallEnd"]
    # cut off before the invoke's end: the call has its name only
    got = parse(m3, [head + f"{NS}<days>3"])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("get_weather", "", False)]


def test_m3_plain_text_and_unreadable_invoke(check_splits):
    text = "MiniMax writes ]<]minimax[>[ before its tags; <invoke name=x> alone is prose."
    assert check_splits(m3, text).content == text
    bad = f"{NS}<tool_call>\n{NS}<invoke name=>\n{NS}</invoke>\n{NS}</tool_call>"
    got = check_splits(m3, bad)
    assert got.calls == [] and got.content == f"{NS}<invoke name=>\n{NS}</invoke>"


def test_m3_render_reads_back(check_splits):
    args = {"user_id": 7, "items": [{"sku": "a", "qty": 1}], "gift": False, "tags": ["x", "y"]}
    rendered = M3.render([ToolCall("create_order", json.dumps(args)), ToolCall("get_weather", "{}")])
    got = check_splits(m3, rendered)
    assert got.named_args == [("create_order", args), ("get_weather", {})]


def test_schema_values():
    assert schema_types({"type": ["integer", "null"]}) == {"integer", "null"}
    assert schema_types({"anyOf": [{"type": "int"}, {"enum": [True, "a"]}]}) == {
        "integer",
        "boolean",
        "string",
    }
    assert schema_types({"description": "untyped"}) == {"string"}
    assert coerce("3", {"type": "integer"}) == 3 and coerce("3.0", {"type": "number"}) == 3
    assert coerce("2.5", {"type": "number"}) == 2.5 and coerce("inf", {"type": "number"}) == "inf"
    assert coerce("NULL", {"type": ["string", "null"]}) is None
    assert coerce("1", {"type": "boolean"}) is True and coerce("yes", {"type": "boolean"}) == "yes"
    assert coerce('{"a": [1]}', {"type": "object"}) == {"a": [1]}
    assert coerce("[1e999]", {"type": "array"}) == "[1e999]"
    assert coerce("42", {"type": "string"}) == "42" and coerce("42", None) == "42"
    assert coerce("x", {"type": "integer"}) == "x" and coerce("[1]", {"type": "integer"}) == [1]
