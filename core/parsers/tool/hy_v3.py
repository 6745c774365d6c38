"""Tencent Hunyuan Hy3 tool calls (vLLM's ``hy_v3``; tencent/Hy3-preview and its chat template).

Format: a ``<tool_calls>`` section after any content; in it each call between ``<tool_call>`` and
``</tool_call>`` holds the function's name, ``<tool_sep>``, then its arguments as key/value pairs,
each on its own line:

    Let me look it up.<tool_calls>
    <tool_call>get_weather<tool_sep>
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>
    </tool_calls>

The markers are added tokens (not special ones: they survive ``skip_special_tokens``). Some
checkpoints give them a suffix (``<tool_calls:opensource>``, ``</arg_value:opensource>``); like
vLLM, the parser reads it from the served model's vocabulary (``token_suffix``; vLLM's ``hy_v3``
takes it from the tokenizer config's ``token_suffix``, which names the same suffix).

A value is the text between its tags, unstripped, typed by the tool's schema as vLLM's HY parsers
type it (``hy_value``). The call starts once ``<tool_sep>`` ends its name; the arguments go out one
member per complete pair and close with ``</tool_call>``; a pair cut off by the end of the stream
is not sent. A call without a name (or without ``<tool_sep>``) is content, markers included.

Where dyn's reading differs from vLLM's: text after the section is content (vLLM's unary path
drops it); a ``<tool_call>`` the model writes without the section marker is still read as a call
(vLLM reads none unless ``<tool_calls>`` came); a ``<tool_calls>`` followed by no call stays
content.
"""

from __future__ import annotations

import abc
import ast
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.kv_arguments import MemberCalls, parameter_schema, value_text
from dyn.core.parsers.tool.sectioned import SectionedToolParser

# ---------------------------------------------------------------------------------- the markers

_STRUCTURAL = re.compile(r"<(?:think|tool_calls|tool_call|arg_key|arg_value)(:[^\s>]+)?>")


def token_suffix(tokenizer: Any) -> str:
    """The suffix the served model's HY markers carry (``":opensource"``), read from its added
    tokens as vLLM reads it from the vocabulary; ``""`` when they carry none or there is no
    tokenizer."""
    added: Mapping[int, str] = getattr(tokenizer, "added_tokens", None) or {}
    for token in added.values():
        match = _STRUCTURAL.fullmatch(token)
        if match is not None:
            return match.group(1) or ""
    return ""


class Markers(NamedTuple):
    """The HY tool-call markers of one suffix."""

    section: str
    section_end: str
    call: str
    call_end: str
    sep: str
    key: str
    key_end: str
    value: str
    value_end: str

    @classmethod
    def of(cls, suffix: str = "") -> Markers:
        names = "tool_calls /tool_calls tool_call /tool_call tool_sep arg_key /arg_key arg_value /arg_value"
        return cls(*(f"<{n}{suffix}>" for n in names.split()))

    def pair(self) -> re.Pattern[str]:
        """A key/value pair (whitespace may separate the key's end tag and the value's start tag)."""
        k, ke, v, ve = (re.escape(m) for m in (self.key, self.key_end, self.value, self.value_end))
        return re.compile(rf"{k}(.*?){ke}\s*{v}(.*?){ve}", re.DOTALL)


# ----------------------------------------------------------------------------- typing the values

_ALIASES = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "bool": "boolean",
    "binary": "boolean",
    "int": "integer",
    "float": "number",
    "double": "number",
    "list": "array",
    "dict": "object",
    "map": "object",
}
_SCALARS = frozenset(("string", "boolean", "integer", "number"))


def _type_name(name: Any) -> str:
    """A schema's type name as JSON Schema spells it: the aliases above, then any ``int*``,
    ``uint*``, ``long*``, ``short*``, ``unsigned*`` is an integer and any ``num*``, ``float*`` a
    number; other names stay as they are."""
    if not isinstance(name, str):
        return "string"
    if name in _ALIASES:
        return _ALIASES[name]
    lower = name.lower()
    if lower.startswith(("int", "uint", "long", "short", "unsigned")):
        return "integer"
    if lower.startswith(("num", "float")):
        return "number"
    return name


def value_types(schema: Mapping[str, Any]) -> set[str]:
    """The types a parameter's schema allows, null left out: its ``type`` (one or a list), else
    its ``anyOf`` / ``oneOf`` branches' types; ``string`` when it names none."""
    kind = schema.get("type")
    if "type" in schema:
        options: list[Any] = [{"type": k} for k in kind] if isinstance(kind, list) else [schema]
    else:
        branches = schema.get("anyOf", schema.get("oneOf"))
        options = branches if isinstance(branches, list) else [{"type": "string"}]
    return {_type_name(o.get("type", "string") if isinstance(o, Mapping) else None) for o in options} - {
        "null"
    }


def _json_value(value: Any) -> tuple[bool, Any]:
    """(True, ``value`` as plain JSON data) when JSON can carry it, else (False, None)."""
    try:
        return True, json.loads(json.dumps(value, allow_nan=False))
    except (ValueError, TypeError, RecursionError):
        return False, None


def hy_value(text: str, schema: Mapping[str, Any]) -> Any:
    """The value of a parameter written as ``text`` (see the module): tried in turn as a boolean
    (``true``/``false``, any case), an integer, a number (an integer unless it has a ``.``, ``e``
    or ``E``), JSON (when the schema allows a type beyond those and strings), then the text for a
    string; a schema that allows no string reads JSON, then a Python literal, else the text. A
    parameter the schema does not list is a string."""
    types = value_types(schema)
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "integer" in types:
        try:
            return int(text)
        except ValueError:
            pass
    if "number" in types:
        try:
            number = float(text) if any(c in text for c in ".eE") else int(text)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return number
    if types - _SCALARS:
        try:
            ok, value = _json_value(json.loads(text))
        except (ValueError, RecursionError):
            ok = False
        if ok:
            return value
    if "string" in types:
        return text
    for read in (json.loads, ast.literal_eval):
        try:
            ok, value = _json_value(read(text))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if ok:
            return value
    return text


# ---------------------------------------------------------------------------------- the parser


class HyToolParser(MemberCalls, SectionedToolParser):
    """The HY call format, its markers with the suffix of the served model's ``tokenizer``.
    Subclasses say where a call's name ends (``_head``) and how they write calls (``write``)."""

    takes_tokenizer = True
    markers = Markers.of()
    section_starts = (markers.section,)
    section_ends = (markers.section_end,)
    call_start = markers.call
    call_end = markers.call_end

    def __init__(self, tools: Sequence[Tool] = (), tokenizer: Any = None) -> None:
        super().__init__(tools)
        m = self.markers = Markers.of(token_suffix(tokenizer))
        self.section_starts, self.section_ends = (m.section,), (m.section_end,)
        self.call_start, self.call_end = m.call, m.call_end
        self.member_pattern = m.pair()

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        """``calls`` with unsuffixed markers (``write`` writes them with any)."""
        return cls.write(calls, Markers.of())

    @staticmethod
    @abc.abstractmethod
    def write(calls: Sequence[ToolCall], m: Markers) -> str:
        """``calls`` as this format writes them, with the markers ``m``."""

    def call_begin(self) -> None:
        super().call_begin()
        self._broken = False

    def call_head(self, body: str, complete: bool) -> tuple[str, int] | None:
        """``_head``'s; an empty name, or one with a ``<``, breaks the call for good (it stays
        content)."""
        head = None if self._broken else self._head(body, complete)
        if head is not None and (not head[0] or "<" in head[0]):
            self._broken, head = True, None
        return head

    @abc.abstractmethod
    def _head(self, body: str, complete: bool) -> tuple[str, int] | None:
        """(the function's name, where its arguments start), or None while it is not written."""

    def member(self, pair: re.Match[str]) -> tuple[str, Any]:
        key = pair.group(1).strip()
        return key, hy_value(pair.group(2), parameter_schema(self.tools.get(self._name or ""), key))


@TOOL_PARSERS.register("hy_v3")
class HyV3ToolParser(HyToolParser):
    """Hy3: the name ends at ``<tool_sep>``; whitespace may separate the tags (see the module)."""

    def _head(self, body: str, complete: bool) -> tuple[str, int] | None:
        sep = self.markers.sep
        at = body.find(sep)
        return None if at < 0 else (body[:at].strip(), at + len(sep))

    @staticmethod
    def write(calls: Sequence[ToolCall], m: Markers) -> str:
        return (
            f"{m.section}\n"
            + "".join(
                f"{m.call}{c.name}{m.sep}\n"
                + "".join(
                    f"{m.key}{k}{m.key_end}\n{m.value}{value_text(v)}{m.value_end}\n"
                    for k, v in c.args.items()
                )
                + f"{m.call_end}\n"
                for c in calls
            )
            + m.section_end
        )
