"""The k2_horizon parser on K2 Horizon outputs (format: the model's chat template, its three
``tool_call_format``s; recorded outputs from vLLM's tests/tool_parsers/test_k2_horizon_tool_parser.py
and the template's own layout, one tag per line)."""

from __future__ import annotations

import json

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall

K2Horizon = TOOL_PARSERS.get("k2_horizon")

LOOKUP = Tool(
    "lookup",
    {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "enabled": {"type": "boolean"},
        },
    },
)
PING = Tool("ping", {"type": "object", "properties": {}})
STUDY = Tool(
    "study_args",
    {
        "type": "object",
        "properties": {
            "user_id": {"type": "string"},
            "include_revoked": {"type": "boolean"},
            "page": {"type": "integer"},
            "filters": {"type": "object"},
            "either": {"type": ["integer", "string"]},
        },
    },
)


def with_tools():
    return K2Horizon([LOOKUP, PING, STUDY])


def xml_call(name: str, *arguments: tuple[str, str], typed: dict[str, str] | None = None) -> str:
    parts = [f"<ifm|tool_call>{name}\n"]
    for key, value in arguments:
        parts.append(f"<ifm|arg_key>{key}</ifm|arg_key>\n")
        if typed is not None:
            parts.append(f"<ifm|arg_type>{typed[key]}</ifm|arg_type>\n")
        parts.append(f"<ifm|arg_value>{value}</ifm|arg_value>\n")
    return "".join(parts) + "</ifm|tool_call>"


def group(*calls: str) -> str:
    return "<ifm|tool_calls>\n" + "\n".join(calls) + "\n</ifm|tool_calls>"


# vLLM's test_xml_default_parses_multiple_calls_and_coerces_schema
TWO_CALLS = (
    "Before " + group(xml_call("lookup", ("query", "123"), ("limit", "3")), xml_call("ping")) + " after."
)


def test_content_around_two_calls(check_splits):
    got = check_splits(with_tools, TWO_CALLS)
    # vLLM keeps "Before  after." (both spaces); the whitespace right after a call is dropped here
    assert got.content == "Before after."
    assert got.named_args == [("lookup", {"query": "123", "limit": 3}), ("ping", {})]
    assert got.calls[0].arguments == '{"query": "123", "limit": 3}' and got.calls[1].arguments == "{}"
    assert all(c.complete for c in got.calls)


def test_xml_values_typed_by_the_schema(check_splits):
    # vLLM's test_ifm_xml_format (study_args): a string parameter keeps its text as written
    text = group(
        xml_call(
            "study_args",
            ("user_id", "12345"),
            ("include_revoked", "true"),
            ("page", " 2 "),
            ("filters", '{"unit":"celsius"}'),
            ("extra", " 7 "),
        )
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [
        (
            "study_args",
            {
                "user_id": "12345",
                "include_revoked": True,
                "page": 2,
                "filters": {"unit": "celsius"},
                "extra": " 7 ",
            },
        )
    ]


def test_xml_typed_arguments(check_splits):
    # vLLM's test_ifm_xml_typed_format_uses_arg_type_without_schema, and the written type
    # narrowing a schema that allows several
    types = {
        "user_id": "string",
        "either": "string",
        "other": "integer",
        "raw": "any",
        "ids": "array[integer]",
    }
    text = group(
        xml_call(
            "study_args",
            ("user_id", "12345"),
            ("either", "42"),
            ("other", "8"),
            ("raw", "8"),
            ("ids", "[1, 2]"),
            typed=types,
        )
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [
        ("study_args", {"user_id": "12345", "either": "42", "other": 8, "raw": "8", "ids": [1, 2]})
    ]


def test_json_calls_typed_by_the_schema(check_splits):
    # vLLM's test_json_format_emits_full_coerced_arguments
    text = group(
        '<ifm|tool_call>{"name": "study_args", "arguments": {"user_id": 12345, "include_revoked": "true", '
        '"page": "2", "filters": "{\\"unit\\":\\"celsius\\"}", "x": [1]}}</ifm|tool_call>',
        '<ifm|tool_call>{"name": "ping", "arguments": {}}</ifm|tool_call>',
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [
        (
            "study_args",
            {
                "user_id": "12345",
                "include_revoked": True,
                "page": 2,
                "filters": {"unit": "celsius"},
                "x": [1],
            },
        ),
        ("ping", {}),
    ]
    assert got.content == ""


def test_cut_off_call(parse):
    cut = "Checking.<ifm|tool_calls>\n<ifm|tool_call>lookup\n<ifm|arg_key>query</ifm|arg_key>\n<ifm|arg_value>rust</ifm|arg_value>\n<ifm|arg_key>limit</ifm|arg_key>\n<ifm|arg_value>1"
    got = parse(with_tools, [cut])
    assert got.content == "Checking."
    assert [(c.name, c.arguments, c.complete) for c in got.calls] == [("lookup", '{"query": "rust"', False)]
    # cut off before the name is known, or inside a JSON call: content (the group marker dropped)
    got = parse(with_tools, ["Before<ifm|tool_calls><ifm|tool_call>ping"])
    assert got.calls == [] and got.content == "Before<ifm|tool_call>ping"
    got = parse(with_tools, ['<ifm|tool_calls><ifm|tool_call>{"name": "ping", "argu'])
    assert got.calls == [] and got.content == '<ifm|tool_call>{"name": "ping", "argu'


def test_malformed_calls_are_content(check_splits):
    for call in (
        "<ifm|tool_call>get weather</ifm|tool_call>",  # a name with a space
        '<ifm|tool_call>{"name": "lookup", "arguments": "query"}</ifm|tool_call>',
        '<ifm|tool_call>{"name": "lookup", "arguments": {broken}</ifm|tool_call>',
    ):
        got = check_splits(with_tools, f"<ifm|tool_calls>{call}</ifm|tool_calls>")
        assert got.calls == [] and got.content == call
    text = "<ifm|tool_calls>junk</ifm|tool_calls>"  # vLLM's test_malformed_and_incomplete_input_is_content
    assert check_splits(with_tools, text).content == text


def test_plain_text_is_content(check_splits):
    text = "Wrap calls in <ifm|tool_calls> ... and keys in <ifm|arg_key>, please."
    got = check_splits(with_tools, text)
    assert got.calls == [] and got.content == text


def test_render_reads_back(check_splits):
    calls = [
        ToolCall("lookup", json.dumps({"query": "rust <lang>", "limit": 10, "enabled": False})),
        ToolCall("study_args", json.dumps({"filters": {"unit": "celsius"}, "page": 2})),
        ToolCall("ping", "{}"),
    ]
    text = K2Horizon.render(calls)
    assert text.startswith(
        "<ifm|tool_calls>\n<ifm|tool_call>lookup\n<ifm|arg_key>query</ifm|arg_key>\n<ifm|arg_value>rust <lang></ifm|arg_value>\n"
    )
    got = check_splits(with_tools, text)
    assert got.named_args == [(c.name, c.args) for c in calls] and got.content == ""


def test_name_resolves():
    assert K2Horizon.name == "k2_horizon" and TOOL_PARSERS.get("K2-Horizon") is K2Horizon
    assert K2Horizon is not TOOL_PARSERS.get("kimi_k2") and not K2Horizon.needs_special_tokens
