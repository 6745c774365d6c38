"""Structured outputs: the request's constraint, checked once and sent to the worker as one
``OutputConstraint`` (``dyn.core.messages``), the way vLLM 0.32 accepts them.

Sources (at most one per request, else a 400 naming both): ``response_format``
(``json_object``, ``json_schema``; ``text`` is none), vLLM's ``guided_json``, ``guided_regex``,
``guided_choice``, ``guided_grammar`` and its ``structured_outputs`` object (``json``,
``regex``, ``choice``, ``grammar``, ``json_object``), and a forced tool choice (``required`` or a
named function: the tools' schemas, ``dyn.core.protocol.tools.forced_schema``).

Every constraint is compiled once by llguidance without a tokenizer (a schema, regex or grammar
it cannot read is a 400 with its message), bounded in size, and the verdicts of the last few
hundred distinct constraints are cached (agents send the same schema every turn).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import msgspec

from dyn.core.messages import OutputConstraint
from dyn.core.protocol.errors import ApiError, bad_request

MAX_CONSTRAINT_BYTES = 256 * 1024
MAX_CHOICES = 1024

_VLLM_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def request_constraint(req: Any, forced_tool_schema: dict[str, Any] | None = None) -> OutputConstraint | None:
    """The constraint of a chat or completion request, or ``None`` for free text."""
    found: list[tuple[str, OutputConstraint]] = []
    rf = req.response_format
    if rf is not None:
        constraint = _response_format(rf)
        if constraint is not None:
            found.append(("response_format", constraint))
    if req.guided_json is not None:
        found.append(("guided_json", _json("guided_json", req.guided_json, req.guided_whitespace_pattern)))
    if req.guided_regex is not None:
        found.append(("guided_regex", _text("guided_regex", "regex", req.guided_regex)))
    if req.guided_choice is not None:
        found.append(("guided_choice", _choice("guided_choice", req.guided_choice)))
    if req.guided_grammar is not None:
        found.append(("guided_grammar", _text("guided_grammar", "grammar", req.guided_grammar)))
    if req.structured_outputs is not None:
        constraint = _structured_outputs(req.structured_outputs, req.guided_whitespace_pattern)
        if constraint is not None:
            found.append(("structured_outputs", constraint))
    if forced_tool_schema is not None:
        found.append(("tool_choice", _json("tool_choice", forced_tool_schema, None)))
    if not found:
        return None
    if len(found) > 1:
        names = " and ".join(name for name, _ in found[:2])
        raise bad_request(
            f"only one kind of structured output per request: got {names}; keep one", param=found[1][0]
        )
    param, constraint = found[0]
    _validate(param, constraint)
    return constraint


def _response_format(rf: dict[str, Any]) -> OutputConstraint | None:
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint("json_object")
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request(
                'response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}',
                param="response_format.json_schema",
            )
        schema = spec.get("schema", spec.get("json_schema"))
        if schema is None:
            schema = {}
        return _json("response_format.json_schema.schema", schema, None)
    raise bad_request(
        f"response_format type must be text, json_object or json_schema, got {kind!r}",
        param="response_format.type",
    )


def _structured_outputs(so: dict[str, Any], whitespace: str | None) -> OutputConstraint | None:
    given = [k for k in _VLLM_KEYS if so.get(k) not in (None, False)]
    if len(given) > 1:
        raise bad_request(
            f"structured_outputs may set only one of {', '.join(_VLLM_KEYS)}; got {', '.join(given)}",
            param="structured_outputs",
        )
    unknown = [k for k in ("structural_tag",) if so.get(k) is not None]
    if unknown:
        raise bad_request(
            "structured_outputs.structural_tag is not supported by this server yet; "
            "use json, regex, choice or grammar",
            param="structured_outputs.structural_tag",
            code="unsupported_parameter",
        )
    if not given:
        return None
    key = given[0]
    where = f"structured_outputs.{key}"
    whitespace = so.get("whitespace_pattern", whitespace)
    if key == "json":
        return _json(where, so["json"], whitespace)
    if key == "json_object":
        return OutputConstraint("json_object")
    if key == "choice":
        return _choice(where, so["choice"])
    return _text(where, key, so[key])


def _json(where: str, schema: Any, whitespace: str | None) -> OutputConstraint:
    if isinstance(schema, str):
        try:
            schema = msgspec.json.decode(schema)
        except msgspec.DecodeError as exc:
            raise bad_request(f"{where} is not valid JSON: {exc}", param=where) from None
    if not isinstance(schema, (dict, bool)):
        raise bad_request(f"{where} must be a JSON Schema (an object)", param=where)
    if whitespace is not None and not isinstance(whitespace, str):
        raise bad_request("guided_whitespace_pattern must be a string", param="guided_whitespace_pattern")
    return OutputConstraint("json", msgspec.json.encode(schema).decode(), whitespace_pattern=whitespace)


def _text(where: str, kind: str, value: Any) -> OutputConstraint:
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"{where} must be a non-empty string", param=where)
    return OutputConstraint(kind, value)


def _choice(where: str, value: Any) -> OutputConstraint:
    if (
        not isinstance(value, list)
        or not value
        or len(value) > MAX_CHOICES
        or not all(isinstance(c, str) and c for c in value)
    ):
        raise bad_request(f"{where} must be a list of 1 to {MAX_CHOICES} non-empty strings", param=where)
    return OutputConstraint("choice", choices=tuple(value))


def _validate(param: str, constraint: OutputConstraint) -> None:
    size = len(constraint.spec) + sum(len(c) for c in constraint.choices)
    if size > MAX_CONSTRAINT_BYTES:
        raise bad_request(
            f"{param} is {size} bytes; at most {MAX_CONSTRAINT_BYTES} are accepted", param=param
        )
    error = constraint_error(constraint)
    if error:
        raise bad_request(f"{param} cannot be used as a constraint: {error}", param=param)


@lru_cache(maxsize=512)
def constraint_error(constraint: OutputConstraint) -> str:
    """Why llguidance cannot compile ``constraint`` ("" when it can); pure, so cached."""
    try:
        grammar = llguidance_grammar(constraint)
    except ValueError as exc:
        return str(exc)
    from llguidance import LLMatcher

    return LLMatcher.validate_grammar(grammar)


def llguidance_grammar(constraint: OutputConstraint, schema: Any = None) -> str:
    """The constraint as an llguidance grammar (JSON text). ``schema`` replaces a ``json``
    constraint's schema (the mocker tightens it). ``ValueError`` for a grammar llguidance's
    GBNF converter refuses."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    kind = constraint.kind
    if kind == "json":
        schema = msgspec.json.decode(constraint.spec) if schema is None else schema
        if constraint.whitespace_pattern is not None and isinstance(schema, dict):
            schema = {**schema, "x-guidance": {"whitespace_pattern": constraint.whitespace_pattern}}
        return LLMatcher.grammar_from_json_schema(schema)
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"} if schema is None else schema)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(constraint.spec)
    if kind == "choice":
        return LLMatcher.grammar_from_lark(
            "start: " + " | ".join(msgspec.json.encode(c).decode() for c in constraint.choices)
        )
    if kind == "grammar":
        try:
            text = any_to_lark(constraint.spec)
        except Exception as exc:  # llguidance's converter raises plain exceptions
            raise ValueError(f"not a valid GBNF or Lark grammar: {exc}") from None
        return LLMatcher.grammar_from_lark(text)
    raise ApiError(500, f"unknown constraint kind {kind!r}")
