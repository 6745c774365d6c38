"""Fixtures of the mocker's agent-double tests: a JSON Schema checker (``jsonschema`` is not a
dependency, so the keywords the tests use are checked by hand, as the JSON Schema 2020-12
validation spec words them)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    ),
}
_KNOWN = {
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "minProperties",
    "maxProperties",
    "format",
    "title",
    "description",
    "default",
}


def schema_errors(value: Any, schema: Any, root: Any = None, path: str = "$") -> list[str]:
    """Why ``value`` is not valid under ``schema`` (empty: valid)."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return []
    if schema is False:
        return [f"{path}: nothing is allowed"]
    unknown = set(schema) - _KNOWN
    assert not unknown, f"the test checker does not know {unknown}"
    errors: list[str] = []
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        errors += schema_errors(value, target, root, path)
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_TYPES[t](value) for t in types):
            return [f"{path}: {value!r} is not of type {types}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {value!r} is not {schema['const']!r}")
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} > maximum {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            errors.append(f"{path}: {value} <= exclusiveMinimum {schema['exclusiveMinimum']}")
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            errors.append(f"{path}: {value} >= exclusiveMaximum {schema['exclusiveMaximum']}")
        if "multipleOf" in schema:
            q = value / schema["multipleOf"]
            if not math.isclose(q, round(q), abs_tol=1e-9):
                errors.append(f"{path}: {value} is not a multiple of {schema['multipleOf']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if schema.get("format") == "date" and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            errors.append(f"{path}: {value!r} is not a date")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: more than {schema['maxItems']} items")
        prefix = schema.get("prefixItems", [])
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else schema.get("items", True)
            errors += schema_errors(item, sub, root, f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{path}: missing required {name!r}")
        if len(value) < schema.get("minProperties", 0):
            errors.append(f"{path}: fewer than {schema['minProperties']} properties")
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            errors.append(f"{path}: more than {schema['maxProperties']} properties")
        for name, item in value.items():
            sub = props[name] if name in props else schema.get("additionalProperties", True)
            errors += schema_errors(item, sub, root, f"{path}.{name}")
    if "anyOf" in schema and not any(not schema_errors(value, s, root, path) for s in schema["anyOf"]):
        errors.append(f"{path}: matches no anyOf branch")
    if "oneOf" in schema and sum(not schema_errors(value, s, root, path) for s in schema["oneOf"]) != 1:
        errors.append(f"{path}: does not match exactly one oneOf branch")
    for sub in schema.get("allOf", []):
        errors += schema_errors(value, sub, root, path)
    return errors


@pytest.fixture
def check_schema():
    """``check_schema(value, schema)`` fails the test with the reasons ``value`` is invalid."""

    def check(value: Any, schema: Any) -> None:
        errors = schema_errors(value, schema)
        assert not errors, f"{value!r} is invalid: {errors}"

    return check
