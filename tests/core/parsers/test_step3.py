"""The step3 parser on outputs of Step-3 (format: stepfun-ai/step3's chat template, ``steptml`` calls in a
``<｜tool_calls_begin｜>`` section; recorded outputs from SGLang's step3 detector docs and tests and vLLM's
tests/tool_parsers/test_step3_tool_parser.py)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

Step3 = TOOL_PARSERS.get("step3")

SEARCH = Tool(
    "search",
    {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}},
)
WEATHER = Tool(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "count": {"type": "integer"},
            "metric": {"type": "boolean"},
            "where": {"type": "object"},
        },
    },
)


def with_tools():
    return Step3([SEARCH, WEATHER])


# Step-3 answering with text around one call (SGLang's step3 parser test)
STEP3_TEXT_AROUND = """Let me help you.
<｜tool_calls_begin｜>
<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="search">
<steptml:parameter name="query">rust programming</steptml:parameter>
<steptml:parameter name="limit">10</steptml:parameter>
</steptml:invoke><｜tool_call_end｜>
<｜tool_calls_end｜>
Here are the results..."""
# two calls in one section
STEP3_TWO_CALLS = (
    "<｜tool_calls_begin｜>\n"
    '<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">\n'
    '<steptml:parameter name="city">Shanghai</steptml:parameter>\n'
    '<steptml:parameter name="count">5</steptml:parameter>\n'
    "</steptml:invoke><｜tool_call_end｜>\n"
    '<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">\n'
    '<steptml:parameter name="city">Tokyo</steptml:parameter>\n'
    "</steptml:invoke><｜tool_call_end｜>\n"
    "<｜tool_calls_end｜>"
)


def test_content_around_one_call(check_splits):
    got = check_splits(with_tools, STEP3_TEXT_AROUND)
    assert got.content == "Let me help you.\nHere are the results..."
    assert got.named_args == [("search", {"query": "rust programming", "limit": 10})]
    assert got.calls[0].arguments == '{"query": "rust programming", "limit": 10}' and got.calls[0].complete


def test_two_calls(check_splits):
    got = check_splits(with_tools, STEP3_TWO_CALLS)
    assert got.content == ""
    assert got.named_args == [
        ("get_weather", {"city": "Shanghai", "count": 5}),
        ("get_weather", {"city": "Tokyo"}),
    ]


def test_values_typed_only_by_the_schema(check_splits):
    text = (
        '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">'
        '<steptml:parameter name="city"> Paris </steptml:parameter>'
        '<steptml:parameter name="metric">true</steptml:parameter>'
        '<steptml:parameter name="where">{"lat": 48.9}</steptml:parameter>'
        '<steptml:parameter name="note">42</steptml:parameter>'
        "</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>"
    )
    got = check_splits(with_tools, text)
    # "note" is not in the schema: its value stays text, as vLLM's reading keeps it
    assert got.named_args == [
        ("get_weather", {"city": "Paris", "metric": True, "where": {"lat": 48.9}, "note": "42"})
    ]
    got = check_splits(Step3, text)  # no tools: every value is text
    assert got.calls[0].args == {"city": "Paris", "metric": "true", "where": '{"lat": 48.9}', "note": "42"}


def test_quotes_and_markup_inside_values(check_splits):
    # the value holds '<' (SGLang's test_detect_and_parse_value_containing_lt) and quotes
    text = (
        '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="run_code">'
        '<steptml:parameter name="code">if a < b: print("a \'b\'")</steptml:parameter>'
        '<steptml:parameter name="lang">python</steptml:parameter>'
        "</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>"
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [("run_code", {"code": "if a < b: print(\"a 'b'\")", "lang": "python"})]


def test_call_without_its_type(check_splits):
    # vLLM's test data writes the invoke right after the call marker
    text = (
        '<｜tool_calls_begin｜><｜tool_call_begin｜><steptml:invoke name="get_weather">'
        '<steptml:parameter name="city">Tokyo</steptml:parameter>'
        "</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>"
    )
    assert check_splits(with_tools, text).named_args == [("get_weather", {"city": "Tokyo"})]


def test_cut_off_call(parse):
    got = parse(
        with_tools,
        [
            "<｜tool_calls_begin｜>\n"
            '<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="search">\n'
            '<steptml:parameter name="query">rust</steptml:parameter>\n'
            '<steptml:parameter name="limit">1'
        ],
    )
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("search", '{"query": "rust"', False)]
    text = '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="sea'
    got = parse(with_tools, [text])
    assert (
        got.calls == []
        and got.content == '<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="sea'
    )


def test_unreadable_body_is_content(check_splits):
    # a call of another type (SGLang's test_skipped_non_function_entry) is no function call
    text = (
        "<｜tool_calls_begin｜>\n<｜tool_call_begin｜>thought<｜tool_sep｜>hmm<｜tool_call_end｜>\n"
        '<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">\n'
        '<steptml:parameter name="city">Paris</steptml:parameter>\n'
        "</steptml:invoke><｜tool_call_end｜>\n<｜tool_calls_end｜>"
    )
    got = check_splits(with_tools, text)
    assert got.content == "<｜tool_call_begin｜>thought<｜tool_sep｜>hmm<｜tool_call_end｜>"
    assert got.named_args == [("get_weather", {"city": "Paris"})]


def test_plain_text_is_content(check_splits):
    text = 'This is a regular response without any tool calls. <steptml:invoke name="x"> is markup.'
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("get_weather", json.dumps({"city": "Paris", "count": 2, "where": {"lat": 1.5}})),
        ToolCall("noop", "{}"),
    ]
    text = Step3.render(calls)
    assert text.startswith(
        '<｜tool_calls_begin｜>\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">\n'
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [
        ("get_weather", {"city": "Paris", "count": 2, "where": {"lat": 1.5}}),
        ("noop", {}),
    ]
    assert got.content == ""
