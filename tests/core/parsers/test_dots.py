"""The dots parser on dots.llm outputs (format: vLLM's tool_parsers/dots_tool_parser.py; the
outputs follow SGLang's test/registered/function_call/test_dots_detector.py and vLLM's parser
docstring)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

Dots = TOOL_PARSERS.get("dots")

SET_LOCATION = Tool(
    "set_location",
    {
        "type": "object",
        "properties": {
            "location": {"$ref": "#/$defs/Location"},
            "days": {"type": "integer"},
            "include_weather": {"type": "boolean"},
            "note": {"anyOf": [{"type": "null"}, {"type": "string"}]},
            "ratio": {"type": ["number", "null"]},
        },
        "$defs": {"Location": {"type": "object", "properties": {"city": {"type": "string"}}}},
    },
)
SEARCH = Tool(
    "search", {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}
)
OPEN = Tool("open", {"type": "object", "properties": {"id": {"type": "integer"}}})


def with_tools():
    return Dots([SET_LOCATION, SEARCH, OPEN])


# one block, one invoke per line (vLLM's parser docstring), text before it
LOOK = (
    "Let me look.\n<dots_function_call>\n"
    '<invoke name="search">\n'
    '<parameter name="query">weather in Shanghai</parameter>\n'
    '<parameter name="limit">3</parameter>\n'
    "</invoke>\n"
    "</dots_function_call>"
)
# two invokes in a block, then a block holding a JSON call (SGLang's
# test_non_stream_supports_multiple_invokes_and_json_fallback)
MIXED = (
    "<dots_function_call>"
    '<invoke name="search"><parameter name="query">chairs</parameter></invoke>'
    '<invoke name="open"><parameter name="id">7</parameter></invoke>'
    "</dots_function_call>"
    '<dots_function_call>{"name":"search","arguments":{"query":"tables"}}'
    "</dots_function_call>"
)


def test_content_then_a_call(check_splits):
    got = check_splits(with_tools, LOOK)
    assert got.content == "Let me look.\n"
    assert got.named_args == [("search", {"query": "weather in Shanghai", "limit": 3})]
    assert got.calls[0].arguments == '{"query": "weather in Shanghai", "limit": 3}' and got.calls[0].complete


def test_several_invokes_and_a_json_block(check_splits):
    got = check_splits(with_tools, MIXED)
    assert got.content == ""
    assert got.named_args == [
        ("search", {"query": "chairs"}),
        ("open", {"id": 7}),
        ("search", {"query": "tables"}),
    ]
    assert got.calls[2].arguments == '{"query":"tables"}'  # a JSON block's arguments go out verbatim
    assert all(c.complete for c in got.calls)


def test_values_typed_by_the_schema(check_splits):
    # SGLang's test_non_stream_xml_converts_schema_types_and_resolves_ref, with more kinds
    text = (
        "ok<dots_function_call>"
        '<invoke name="set_location">'
        '<parameter name="location">{"city": "Shanghai"}</parameter>'
        '<parameter name="days"> 3 </parameter>'
        '<parameter name="include_weather">true</parameter>'
        '<parameter name="note">42</parameter>'
        '<parameter name="ratio">2.0</parameter>'
        '<parameter name="extra">null</parameter>'
        '<parameter name="more">5</parameter>'
        "</invoke>"
        "</dots_function_call>"
    )
    got = check_splits(with_tools, text)
    assert got.content == "ok"
    # $ref followed to an object; the non-null anyOf branch is a string; unlisted: text, null is null
    assert got.named_args == [
        (
            "set_location",
            {
                "location": {"city": "Shanghai"},
                "days": 3,
                "include_weather": True,
                "note": "42",
                "ratio": 2,
                "extra": None,
                "more": "5",
            },
        )
    ]


def test_quoted_and_bare_names_and_the_parameters_key(check_splits):
    text = (
        "<dots_function_call>\n<invoke name='search'>\n<parameter name=query>x</parameter>\n</invoke>\n"
        "</dots_function_call>\n"
        '<dots_function_call>{"name": "open", "parameters": {"id": 2}}</dots_function_call>'
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [("search", {"query": "x"}), ("open", {"id": 2})] and got.content == ""


def test_text_between_and_after_blocks_is_content(check_splits):
    text = LOOK + "\nThen I'll open it.\n" + MIXED.split("<dots_function_call>{")[0] + "Done."
    got = check_splits(with_tools, text)
    assert got.content == "Let me look.\nThen I'll open it.\nDone."
    assert [c.name for c in got.calls] == ["search", "search", "open"]


def test_cut_off_call(parse):
    cut = '<dots_function_call>\n<invoke name="search">\n<parameter name="query">chairs</parameter>\n<parameter name="li'
    got = parse(with_tools, [cut])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("search", '{"query": "chairs"', False)]
    got = parse(with_tools, ['<dots_function_call>{"name": "search", "arguments": {"query": "ch'])
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("search", '{"query": "ch', False)]
    # cut off before a name: content
    got = parse(with_tools, ['Sure.<dots_function_call>\n<invoke name="sea'])
    assert got.calls == [] and got.content == 'Sure.<dots_function_call>\n<invoke name="sea'


def test_malformed_blocks_are_content(check_splits):
    for text in (
        "Hi <dots_function_call>not a call</dots_function_call>",
        '<dots_function_call>{"name": "search", "arguments": "query"}</dots_function_call>',
        "<dots_function_call><invoke>no name</invoke></dots_function_call>",
    ):
        got = check_splits(with_tools, text)
        assert got.calls == [] and got.content == text


def test_plain_text_is_content(check_splits):
    text = 'Use <invoke name="x"> inside a dots_function_call block to call a tool.'
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [
        ToolCall(
            "set_location", json.dumps({"location": {"city": "Paris"}, "days": 2, "include_weather": False})
        ),
        ToolCall("search", json.dumps({"query": "a < b & c"})),
        ToolCall("open", "{}"),
    ]
    text = Dots.render(calls)
    assert text.startswith('<dots_function_call>\n<invoke name="set_location">\n<parameter name="location">')
    got = check_splits(with_tools, text)
    assert got.named_args == [(c.name, c.args) for c in calls] and got.content == ""


def test_name_resolves():
    assert Dots.name == "dots" and Dots.__module__.endswith("tool.dots")
    assert TOOL_PARSERS.get("DOTS") is Dots and not Dots.needs_special_tokens
