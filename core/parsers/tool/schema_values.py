"""A parameter written as text, read as the JSON value its schema asks for: how vLLM's parser
engine types the values of formats that write every value as text (MiniMax's ``<parameter>``
elements, Gemma 4's bare values).

``schema_types`` lists the types a parameter's JSON Schema allows: its ``type`` (one or a
list), the types of its ``enum`` values, and those of its ``anyOf`` / ``oneOf`` / ``allOf``
branches; ``string`` when it names none. Common spellings (``int``, ``float``, ``bool``,
``dict``, ``list``, ...) count as the JSON type they stand for.

``coerce`` tries those types in a fixed order, null, integer, number, boolean, object, array,
string, and returns the first reading that works: ``null`` (any case) for null; an integer;
a finite number (an integer when it has no fraction); ``true`` / ``false`` / ``1`` / ``0``
for a boolean; a JSON object or array (finite numbers only); the text itself for a string.
When none works, the text is read as JSON if it is JSON, else kept as text. Without a schema
(a parameter the tool does not list) the value is the text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

_ALIASES = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "int": "integer",
    "int32": "integer",
    "int64": "integer",
    "uint": "integer",
    "uint32": "integer",
    "uint64": "integer",
    "long": "integer",
    "short": "integer",
    "unsigned": "integer",
    "float": "number",
    "float32": "number",
    "float64": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "arr": "array",
    "list": "array",
    "sequence": "array",
}
_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")


def _enum_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"


def schema_types(schema: Any) -> set[str]:
    """The JSON types ``schema`` allows (see the module); ``{"string"}`` when it names none."""
    if not isinstance(schema, Mapping):
        return {"string"}
    found: set[str] = set()
    kind = schema.get("type")
    for name in [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else ():
        if isinstance(name, str):
            name = name.strip().lower()
            found.add(_ALIASES.get(name, name))
    enum = schema.get("enum")
    if isinstance(enum, list):
        found.update(_enum_type(v) for v in enum)
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                if isinstance(branch, Mapping):
                    found.update(schema_types(branch))
    return found or {"string"}


def finite_json(value: Any) -> bool:
    """JSON can carry ``value`` as it is: no NaN or infinity anywhere in it."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(finite_json(v) for v in value)
    if isinstance(value, dict):
        return all(finite_json(v) for v in value.values())
    return True


def _read_json(text: str) -> tuple[bool, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False, None
    return finite_json(value), value


def coerce(text: str, schema: Any) -> Any:
    """The value of a parameter written as ``text`` under its JSON Schema (see the module);
    ``schema`` ``None`` (not listed): the text."""
    if not isinstance(schema, Mapping):
        return text
    types = schema_types(schema)
    for kind in _ORDER:
        if kind not in types:
            continue
        if kind == "null":
            if text.lower() == "null":
                return None
        elif kind == "string":
            return text
        elif kind == "integer":
            try:
                return int(text)
            except ValueError:
                pass
        elif kind == "number":
            try:
                number = float(text)
            except ValueError:
                continue
            if math.isfinite(number):
                return int(number) if number.is_integer() else number
        elif kind == "boolean":
            word = text.strip().lower()
            if word in ("true", "1"):
                return True
            if word in ("false", "0"):
                return False
        else:
            ok, value = _read_json(text)
            if ok:
                return value
    ok, value = _read_json(text)
    return value if ok else text
