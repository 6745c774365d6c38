"""Structured outputs: the request's constraint, checked once and sent to the worker as one
``OutputConstraint`` (``dyn.core.messages``), the way vLLM 0.32 accepts them.

Sources (at most one per request, else a 400 naming both): ``response_format``
(``json_object``, ``json_schema``; ``text`` is none), vLLM's ``guided_json``, ``guided_regex``,
``guided_choice``, ``guided_grammar`` and its ``structured_outputs`` object (``json``,
``regex``, ``choice``, ``grammar``, ``json_object``), and a forced tool choice (``required`` or a
named function: the tools' schemas, ``dyn.core.protocol.tools.forced_schema``).

Every constraint is bounded in size, then compiled and probed as a worker compiles it, with the
model's tokenizer and the same limits (``dyn.core.protocol.grammar.GrammarCompiler.check``): a
schema, regex or grammar the engine cannot read, or one over its limits, is a 400 naming the field
with a one-line reason. Verdicts are cached there, grammars are not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from dyn.core.messages import OutputConstraint
from dyn.core.protocol.errors import bad_request

if TYPE_CHECKING:
    from dyn.core.protocol.grammar import GrammarCompiler

MAX_CONSTRAINT_BYTES = 256 * 1024
MAX_CHOICES = 1024

_VLLM_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def request_constraint(
    req: Any, forced_tool_schema: dict[str, Any] | None = None, compiler: GrammarCompiler | None = None
) -> OutputConstraint | None:
    """The constraint of a chat or completion request, or ``None`` for free text; ``compiler``
    checks it (the model's; default a byte-level one, ``grammar.byte_compiler``)."""
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
    _validate(constraint_param(req) or param, constraint, compiler)
    return constraint


def constraint_param(req: Any) -> str | None:
    """Where a request's constraint is (the field its refusals name: ``response_format.json_schema.
    schema``, ``guided_regex``, ``structured_outputs.json``, ``tool_choice`` for a forced call...),
    or None when it has none."""
    rf = req.response_format
    kind = rf.get("type", "text") if isinstance(rf, dict) else None
    if kind == "json_schema":
        return "response_format.json_schema.schema"
    if kind is not None and kind != "text":
        return "response_format"
    for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar"):
        if getattr(req, name) is not None:
            return name
    so = req.structured_outputs
    given = [k for k in _VLLM_KEYS if so.get(k) not in (None, False)] if isinstance(so, dict) else []
    if given:
        return f"structured_outputs.{given[0]}"
    if getattr(req, "tool_choice", None) not in (None, "none", "auto"):
        return "tool_choice"
    return None


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


def _validate(param: str, constraint: OutputConstraint, compiler: GrammarCompiler | None) -> None:
    size = len(constraint.spec) + sum(len(c) for c in constraint.choices)
    if size > MAX_CONSTRAINT_BYTES:
        raise bad_request(
            f"{param} is {size} bytes; at most {MAX_CONSTRAINT_BYTES} are accepted", param=param
        )
    from dyn.core.protocol.grammar import byte_compiler

    error = (compiler or byte_compiler()).check(constraint)
    if error:
        raise bad_request(f"{param} cannot be used as a constraint: {error}", param=param)
