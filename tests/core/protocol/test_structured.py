"""Structured outputs: every accepted spelling becomes one OutputConstraint, checked once."""

from __future__ import annotations

import json

import msgspec
import pytest

from dyn.core.messages import OutputConstraint
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.openai import ChatCompletionRequest, CompletionRequest, decode_request
from dyn.core.protocol.structured import MAX_CHOICES, MAX_CONSTRAINT_BYTES, request_constraint

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name"],
    "additionalProperties": False,
}


def chat(**fields) -> ChatCompletionRequest:
    return decode_request(
        msgspec.json.encode({"messages": [{"role": "user", "content": "x"}], **fields}), ChatCompletionRequest
    )


def refused(req, forced=None) -> ApiError:
    with pytest.raises(ApiError) as info:
        request_constraint(req, forced)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, OutputConstraint("json_object")),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}},
            OutputConstraint("json", json.dumps(SCHEMA, separators=(",", ":"))),
        ),
        ({"guided_json": SCHEMA}, OutputConstraint("json", json.dumps(SCHEMA, separators=(",", ":")))),
        (
            {"guided_json": json.dumps(SCHEMA)},
            OutputConstraint("json", json.dumps(SCHEMA, separators=(",", ":"))),
        ),
        (
            {"guided_json": SCHEMA, "guided_whitespace_pattern": " "},
            OutputConstraint("json", json.dumps(SCHEMA, separators=(",", ":")), whitespace_pattern=" "),
        ),
        ({"guided_regex": r"^\d{3}-\d{4}$"}, OutputConstraint("regex", r"^\d{3}-\d{4}$")),
        ({"guided_choice": ["yes", "no"]}, OutputConstraint("choice", choices=("yes", "no"))),
        ({"guided_grammar": 'root ::= "a" | "b"'}, OutputConstraint("grammar", 'root ::= "a" | "b"')),
        ({"guided_grammar": 'start: "a" | "b"'}, OutputConstraint("grammar", 'start: "a" | "b"')),
        ({"structured_outputs": {"choice": ["x", "y"]}}, OutputConstraint("choice", choices=("x", "y"))),
        ({"structured_outputs": {"json_object": True}}, OutputConstraint("json_object")),
        ({"structured_outputs": {"regex": "[a-z]+"}}, OutputConstraint("regex", "[a-z]+")),
    ],
)
def test_spellings(fields, expected):
    assert request_constraint(chat(**fields)) == expected


def test_completions_take_them_too():
    req = decode_request(b'{"prompt": "x", "guided_choice": ["a", "b"]}', CompletionRequest)
    assert request_constraint(req) == OutputConstraint("choice", choices=("a", "b"))


def test_forced_tool_schema_is_a_json_constraint():
    got = request_constraint(chat(), {"type": "object", "properties": {}})
    assert got.kind == "json" and json.loads(got.spec) == {"type": "object", "properties": {}}
    assert refused(chat(response_format={"type": "json_object"}), {"type": "object"}).param == "tool_choice"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"guided_json": {"type": "strng"}}, "guided_json"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_json": [1, 2]}, "guided_json"),
        ({"guided_regex": "a(b"}, "guided_regex"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["a", ""]}, "guided_choice"),
        ({"guided_grammar": "root ::= missing_rule"}, "guided_grammar"),
        ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice"),
        ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
        ({"guided_regex": "a" * (MAX_CONSTRAINT_BYTES + 1)}, "guided_regex"),
        ({"guided_choice": [f"c{i}" for i in range(MAX_CHOICES + 1)]}, "guided_choice"),
    ],
)
def test_refusals_name_the_field(fields, param):
    assert refused(chat(**fields)).param == param
