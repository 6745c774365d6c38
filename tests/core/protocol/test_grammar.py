"""The compile path of structured outputs (``dyn.core.protocol.grammar``): llguidance under limits,
with the model's tokenizer, probed past its lazy first steps.

Issue 31: a self-referencing ``$ref``, two ``$defs`` that refer to each other, the regex
``(a{600}){1000}`` and a 60-rule doubling Lark grammar all passed the frontend's old check (no
tokenizer, no limits) and failed in the worker with a 500 carrying llguidance's parser state, after
~0.9 s and ~180 MB for the regex. Each is now refused at once, in one line; big realistic
constraints (``realistic_constraints.py``) still compile.
"""

from __future__ import annotations

import json
import time

import msgspec
import pytest

from dyn.core.messages import OutputConstraint
from dyn.core.model import load_model_info
from dyn.core.protocol.errors import ApiError
from dyn.core.protocol.grammar import (
    VERDICTS,
    GrammarCompiler,
    _compiler,
    byte_compiler,
    heap_bytes,
    is_refusal,
    one_line,
    refusal,
    refused_param,
)
from dyn.core.protocol.openai import ChatCompletionRequest, CompletionRequest, decode_request
from dyn.core.protocol.structured import constraint_param, request_constraint
from dyn.core.protocol.tools import forced_schema, tool_plan
from tests.core.protocol.realistic_constraints import AGENT_TOOLS, ORDER_SCHEMA

COMPILER = GrammarCompiler.for_model(load_model_info(None, None))
DOUBLING_LARK = "\n".join(['r0: "a"', *(f"r{i}: r{i - 1} r{i - 1}" for i in range(1, 60)), "start: r59"])
SELF_REF = {"$ref": "#"}
MUTUAL_DEFS = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}

ATTACKS = {
    "self-referencing $ref": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SELF_REF}}},
        "response_format.json_schema.schema",
        "no output satisfies it",
    ),
    "mutually referencing $defs": ({"guided_json": MUTUAL_DEFS}, "guided_json", "no output satisfies it"),
    "(a{600}){1000}": (
        {"guided_regex": "(a{600}){1000}"},
        "guided_regex",
        "too complex for the grammar engine's limits (lexer error: too many expressions",
    ),
    "60-rule doubling Lark grammar": (
        {"guided_grammar": DOUBLING_LARK},
        "guided_grammar",
        "too complex for the grammar engine's limits (parser error: Too many items",
    ),
}


def chat(**fields) -> ChatCompletionRequest:
    return decode_request(
        msgspec.json.encode({"messages": [{"role": "user", "content": "x"}], **fields}), ChatCompletionRequest
    )


def assert_clean(message: str) -> None:
    assert "\n" not in message and "<state>" not in message and "<grammar>" not in message, message
    assert "non-verbose" not in message and len(message) <= 600, message


@pytest.mark.parametrize("name", ATTACKS)
@pytest.mark.parametrize("compiler", [COMPILER, None], ids=["model tokenizer", "bytes"])
def test_the_four_refusals_are_quick_one_line_400s(name, compiler):
    fields, param, reason = ATTACKS[name]
    start = time.perf_counter()
    with pytest.raises(ApiError) as info:
        request_constraint(chat(**fields), None, compiler)
    took = time.perf_counter() - start
    err = info.value
    assert (err.status, err.param) == (400, param)
    assert err.message.startswith(f"{param} cannot be used as a constraint: ") and reason in err.message
    assert_clean(err.message)
    assert took < 1.0, took  # ~50 ms for the regex; it was accepted before, then ~0.9 s in the worker


def test_a_refused_regex_hands_its_memory_back():
    constraint = OutputConstraint("regex", "(a{1234}){1000}")
    before = heap_bytes()
    assert "too complex" in COMPILER.check(constraint)
    assert heap_bytes() - before < 8 << 20  # ~19 MB at its peak, 180 MB and kept before


REALISTIC = {
    "40-property nested order": OutputConstraint("json", json.dumps(ORDER_SCHEMA)),
    "16 agent tools, required": OutputConstraint(
        "json", json.dumps(forced_schema(tool_plan(AGENT_TOOLS, "required")))
    ),
    **{
        f"agent tool {t['function']['name']}": OutputConstraint(
            "json",
            json.dumps(
                forced_schema(tool_plan(AGENT_TOOLS, {"type": "function", "function": t["function"]}))
            ),
        )
        for t in AGENT_TOOLS
    },
    "Unicode words": OutputConstraint("regex", r"(\w+ ){5,50}\w+\."),
    "ISO date-time": OutputConstraint(
        "regex", r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})"
    ),
    "choice of 1024": OutputConstraint("choice", choices=tuple(f"label {i}" for i in range(1024))),
    "a{1000}": OutputConstraint("regex", "a{1000}"),
    "(a{40}){1000}": OutputConstraint("regex", "(a{40}){1000}"),
}


@pytest.mark.parametrize("name", REALISTIC)
def test_big_realistic_constraints_compile_under_the_limits(name):
    assert COMPILER.check(REALISTIC[name]) == ""


def test_a_forced_call_over_the_agent_tools_passes_the_frontend_check():
    req = chat(tools=AGENT_TOOLS, tool_choice="required")
    constraint = request_constraint(req, forced_schema(tool_plan(req.tools, req.tool_choice)), COMPILER)
    assert constraint is not None and constraint.kind == "json"


def test_verdicts_are_cached_by_digest_and_bounded():
    compiler = GrammarCompiler(COMPILER.tokenizer)
    for i in range(VERDICTS + 5):
        assert compiler.check(OutputConstraint("regex", f"x{i}[a-z]")) == ""
    assert len(compiler._verdicts) == VERDICTS
    assert all(len(key) == 16 for key in compiler._verdicts)
    bad = OutputConstraint("regex", "(a{600}){1000}")
    first = compiler.check(bad)
    start = time.perf_counter()
    assert compiler.check(bad) == first and time.perf_counter() - start < 0.005


def test_the_compiler_falls_back_to_bytes_without_a_readable_tokenizer(tmp_path):
    assert _compiler(str(tmp_path / "tokenizer.json"), 100, None) is byte_compiler()
    (tmp_path / "tokenizer.json").write_text("{not a tokenizer")
    assert _compiler(str(tmp_path / "tokenizer.json"), 100, None) is byte_compiler()


def test_one_line_drops_the_engine_state_and_newlines():
    raw = "lexer error: too many expressions constructed\n<state>\nTokens: x\n</state><grammar>{...}"
    assert one_line(raw) == "lexer error: too many expressions constructed"
    assert one_line("NoExtension\n<non-verbose/>") == "NoExtension"
    assert len(one_line("x" * 10_000)) == 500


def test_worker_refusals_name_the_field_of_the_request():
    message = refusal("it is too complex")
    assert is_refusal(message) and refused_param(message, "guided_regex") == "guided_regex"
    tool = refusal("no output satisfies it", "edit_file")
    assert is_refusal(tool) and refused_param(tool, "guided_regex") == "tools"
    assert not is_refusal("ttl_s must be a positive number") and refused_param("x", "guided_json") is None


@pytest.mark.parametrize(
    "fields, param",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "text"}}, None),
        ({"guided_regex": "a"}, "guided_regex"),
        ({"structured_outputs": {"grammar": 'start: "a"'}}, "structured_outputs.grammar"),
        ({"tool_choice": "required", "tools": AGENT_TOOLS[:1]}, "tool_choice"),
        ({"tool_choice": "auto", "tools": AGENT_TOOLS[:1]}, None),
        ({}, None),
    ],
)
def test_constraint_param_says_where_the_constraint_is(fields, param):
    assert constraint_param(chat(**fields)) == param


def test_constraint_param_reads_completions_too():
    req = decode_request(b'{"prompt": "x", "guided_choice": ["a"]}', CompletionRequest)
    assert constraint_param(req) == "guided_choice"
