"""Qwen3-Coder tool calls (also Qwen3.5 and Nemotron-Nano, which write the same): XML
parameters inside ``<tool_call>`` ... ``</tool_call>`` (the chat template of
Qwen/Qwen3-Coder-480B-A35B-Instruct and its reference parser qwen3coder_tool_parser.py):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A value is the text between ``<parameter=NAME>`` and ``</parameter>`` (or the next
``<parameter=`` or ``</function>`` when the model forgets to close it), one newline trimmed at
each end, turned into JSON by the type the tool's schema gives the parameter, as vLLM's
``qwen3_coder`` does: ``null`` is null; strings stay text; integers and numbers are parsed
(a number without a fraction becomes an integer); booleans are ``true`` (any other text is
false); objects and arrays are read as JSON, else as a Python literal (``ast.literal_eval``,
never evaluated); a value that does not convert, or a parameter the schema does not list, is
text. The call starts at ``<function=NAME>`` and its arguments stream as one JSON object, a
parameter at a time once each is complete (``{"city": "Paris"`` ... ``, "days": 3`` ... ``}``);
a parameter cut off by the end of the stream is not sent.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallArgs, ToolCallStart
from dyn.core.parsers.text import find_first
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall
from dyn.core.parsers.tool.delimited import DelimitedToolParser

_FUNCTION, _FUNCTION_END = "<function=", "</function>"
_PARAMETER, _PARAMETER_END = "<parameter=", "</parameter>"

_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_NUMBER_PREFIXES = ("num", "float")
_BOOLEAN_TYPES = ("boolean", "bool", "binary")
_JSON_TYPES = ("object", "array", "arr")
_JSON_PREFIXES = ("dict", "list")


def schema_type(schema: Any) -> str:
    """The type a parameter's schema names: its ``type`` (the first that is not ``null`` when it
    lists several), else that of the first ``anyOf`` / ``oneOf`` branch that is not null;
    ``string`` when there is none."""
    if not isinstance(schema, Mapping):
        return "string"
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind is None:
        for key in ("anyOf", "oneOf"):
            for branch in schema.get(key) or ():
                if isinstance(branch, Mapping) and "type" in branch and schema_type(branch) != "null":
                    return schema_type(branch)
        return "string"
    return str(kind).strip().lower()


def convert_value(raw: str, schema: Any) -> Any:
    """The JSON value of a parameter's text under its schema (``None``: not in the schema)."""
    if raw.lower() == "null":
        return None
    if schema is None:
        return raw
    kind = schema_type(schema)
    if kind in _STRING_TYPES:
        return raw
    if kind.startswith(_INTEGER_PREFIXES):
        try:
            return int(raw)
        except ValueError:
            return raw
    if kind.startswith(_NUMBER_PREFIXES):
        try:
            number = float(raw)
        except ValueError:
            return raw
        if not math.isfinite(number):
            return raw
        return int(number) if number.is_integer() else number
    if kind in _BOOLEAN_TYPES:
        return raw.lower() == "true"
    if kind in _JSON_TYPES or kind.startswith(_JSON_PREFIXES):
        try:
            return _plain_json(json.loads(raw))
        except (ValueError, RecursionError):
            pass
    try:
        return _plain_json(ast.literal_eval(raw))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return raw


def _plain_json(value: Any) -> Any:
    """``value`` as plain JSON data (tuples as lists); ``ValueError`` / ``TypeError`` when JSON
    cannot hold it (sets, bytes, NaN)."""
    return json.loads(json.dumps(value, allow_nan=False))


class FunctionReader:
    """Reads the functions in one ``<tool_call>`` body as it grows (see the module)."""

    def __init__(self, tools: Mapping[str, Tool]) -> None:
        self.tools = tools
        self.calls = 0
        self.unreadable = False
        self._pos = 0
        self._in_function = False
        self._properties: Mapping[str, Any] = {}
        self._sent_any = False
        self._param: tuple[str, int] | None = None

    def read(self, body: str, complete: bool, final: bool) -> list[Event]:
        """Events for the body so far; sets ``unreadable`` when no function starts it."""
        events: list[Event] = []
        while not self.unreadable:
            if not self._in_function:
                if not self._read_head(body, complete or final, events):
                    return events
            elif self._param is not None:
                if not self._read_value(self._param, body, complete, events):
                    return events
            else:
                hit = find_first(body, (_PARAMETER, _FUNCTION_END), self._pos)
                if hit is None:
                    if complete:
                        self._close(events)
                    return events
                at, marker = hit
                if marker == _FUNCTION_END:
                    self._close(events)
                    self._pos = at + len(marker)
                    continue
                name_end = body.find(">", at)
                if name_end < 0:
                    if complete:
                        self._close(events)
                    return events
                self._param = (body[at + len(_PARAMETER) : name_end].strip(), name_end + 1)
                self._pos = name_end + 1
        return events

    def _read_head(self, body: str, ended: bool, events: list[Event]) -> bool:
        rest = body[self._pos :].lstrip()
        if rest.startswith(_FUNCTION):
            name_end = rest.find(">")
            name = rest[len(_FUNCTION) : name_end if name_end >= 0 else len(rest)]
            if "<" in name or "\n" in name or (name_end >= 0 and not name.strip()):
                self.unreadable = self.calls == 0
                return False
            if name_end < 0:
                self.unreadable = ended and self.calls == 0
                return False
            name = name.strip()
            self._pos = len(body) - len(rest) + name_end + 1
            tool = self.tools.get(name)
            properties = tool.parameters.get("properties") if tool is not None else None
            self._properties = properties if isinstance(properties, Mapping) else {}
            self._in_function = True
            self._sent_any = False
            self.calls += 1
            events.append(ToolCallStart(name))
            return True
        if not _FUNCTION.startswith(rest) or ended:
            self.unreadable = self.calls == 0
        return False

    def _read_value(self, param: tuple[str, int], body: str, complete: bool, events: list[Event]) -> bool:
        name, start = param
        hit = find_first(body, (_PARAMETER_END, _PARAMETER, _FUNCTION_END), start)
        if hit is None:
            if not complete:
                return False
            end, after = len(body), len(body)
        else:
            end, marker = hit
            after = end + len(marker) if marker == _PARAMETER_END else end
        value = convert_value(self.value_text(body[start:end]), self._properties.get(name))
        piece = json.dumps(name, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)
        events.append(ToolCallArgs((", " if self._sent_any else "{") + piece))
        self._sent_any = True
        self._param = None
        self._pos = after
        return True

    def value_text(self, raw: str) -> str:
        """A parameter's value from the text between its tags: without the one newline the
        template puts at each end."""
        return raw.removeprefix("\n").removesuffix("\n")

    def _close(self, events: list[Event]) -> None:
        events.append(ToolCallArgs("}" if self._sent_any else "{}"))
        events.append(TOOL_CALL_END)
        self._in_function = False


@TOOL_PARSERS.register("qwen3_coder", "qwen3_xml", "nemotron_nano")
class Qwen3CoderToolParser(DelimitedToolParser):
    call_start = "<tool_call>"
    call_end = "</tool_call>"

    def call_begin(self) -> None:
        self._functions = FunctionReader(self.tools)

    def call_events(self, body: str, *, complete: bool, final: bool) -> list[Event]:
        events = self._functions.read(body, complete, final)
        if self._functions.unreadable:
            return self.unreadable(body, complete, final)
        return events

    parameter_format: ClassVar[str] = "<parameter={name}>\n{text}\n</parameter>\n"
    """How ``render`` writes one parameter (the model's own layout)."""

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        def parameter(name: str, value: Any) -> str:
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            return cls.parameter_format.format(name=name, text=text)

        return "\n".join(
            f"<tool_call>\n<function={c.name}>\n"
            + "".join(parameter(k, v) for k, v in json.loads(c.arguments).items())
            + "</function>\n</tool_call>"
            for c in calls
        )
