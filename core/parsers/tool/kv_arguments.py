"""Arguments written as key/value pairs (GLM's ``<arg_key>``/``<arg_value>``, DeepSeek-V3.2's
DSML parameters) turned into a JSON object, one member at a time.

``typed_value`` gives a value its JSON type the way vLLM's GLM parser does, from the tool's
parameter schema; ``ArgumentsWriter`` writes the object as pieces that, joined, are exactly
``json.dumps(the whole dict, ensure_ascii=False)``, so a streamed call carries what the unary
one does.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from dyn.core.parsers.tool import Tool


def parameter_schema(tool: Tool | None, key: str) -> Mapping[str, Any]:
    """The JSON Schema of parameter ``key`` of ``tool`` (empty when unknown)."""
    if tool is None:
        return {}
    properties = (tool.parameters or {}).get("properties")
    schema = properties.get(key) if isinstance(properties, Mapping) else None
    return schema if isinstance(schema, Mapping) else {}


def typed_value(text: str, schema: Mapping[str, Any]) -> Any:
    """The value of a parameter written as ``text``: the text itself when the schema says
    ``"type": "string"``; otherwise the JSON value it spells, else the Python literal it spells
    (``True``, ``'a'``, ``(1, 2)``), else the text."""
    if schema.get("type") == "string":
        return text
    for read in (json.loads, ast.literal_eval):
        try:
            value = read(text)
            json.dumps(value, allow_nan=False)  # a value JSON can carry (no NaN, set, bytes)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        return value
    return text


class ArgumentsWriter:
    """Writes one JSON object member by member (``member``), then ``close``."""

    __slots__ = ("members",)

    def __init__(self) -> None:
        self.members = 0

    def member(self, key: str, value: Any) -> str:
        head = ", " if self.members else "{"
        self.members += 1
        return f"{head}{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"

    def close(self) -> str:
        return "}" if self.members else "{}"


def value_text(value: Any) -> str:
    """How key/value formats write a value: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
