"""Google Gemma 4 tool calls (vLLM's ``gemma4``).

Format (the chat template of google/gemma-4 models, its ``format_argument`` macro; vLLM's
parser/gemma4.py): each call between ``<|tool_call>`` and ``<tool_call|>`` (special tokens) is
``call:NAME{...}``: the arguments as ``key:value`` pairs joined by ``,``, keys bare, strings
between ``<|"|>`` markers (a special token; no escaping inside), booleans ``true`` /
``false``, numbers as they are, objects ``{key:value,...}`` and arrays ``[value,...]``
nested the same way. Text before, between and after calls is content.

    Let me check.<|tool_call>call:get_weather{location:<|"|>Tokyo<|"|>,days:3}<tool_call|>

A string is its text; a bare value is the JSON it spells (``3``, ``true``, ``null``), else its
text; and where the tool's schema lists the parameter, a top-level string or bare value is
typed by it as vLLM's parser engine types it (``schema_values.coerce``). Some checkpoints
drop ``call`` (``:NAME{...}``) or write ``NAME(...)`` parentheses; both are read, as vLLM does.
The call starts once its name and opening brace are read; its arguments stream one member per
complete ``key:value`` and close with the brace. A call whose closing brace came but whose
``<tool_call|>`` did not (the stream ended, or the model wrote ``<turn|>``) is complete.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dyn.core.parsers.events import Event
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import DelimitedToolParser
from dyn.core.parsers.tool.kv_arguments import MemberCalls
from dyn.core.parsers.tool.schema_values import coerce

CALL_START = "<|tool_call>"
CALL_END = "<tool_call|>"
QUOTE = '<|"|>'

_HEAD = re.compile(r"\s*(?:call)?:\s*([\w.\-]+)\s*([{(])")
_CLOSING = {"{": "}", "(": ")"}
_SPACE = " \t\r\n"


def _bare(text: str) -> Any:
    """A bare value: the JSON it spells, else its text."""
    text = text.strip()
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if value is None or isinstance(value, (bool, int, float)) else text


def _skip(text: str, pos: int, chars: str = _SPACE) -> int:
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


def value_end(text: str, pos: int, closers: str) -> int:
    """Where the value at ``text[pos]`` ends: past its closing quote or bracket, or (a bare value)
    at the first of ``closers``; -1 when the text does not reach it."""
    if text.startswith(QUOTE, pos):
        end = text.find(QUOTE, pos + len(QUOTE))
        return -1 if end < 0 else end + len(QUOTE)
    if pos < len(text) and text[pos] in "{[":
        depth = 0
        while pos < len(text):
            if text.startswith(QUOTE, pos):
                end = text.find(QUOTE, pos + len(QUOTE))
                if end < 0:
                    return -1
                pos = end + len(QUOTE)
                continue
            char = text[pos]
            if char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 0:
                    return pos + 1
            pos += 1
        return -1
    stops = [i for i in (text.find(c, pos) for c in closers) if i >= 0]
    return min(stops) if stops else -1


def read_value(text: str) -> tuple[Any, bool]:
    """(value, scalar) of one complete value's text; ``scalar``: a string or bare value."""
    text = text.strip(_SPACE)
    if text.startswith(QUOTE):  # a string (its closing quote missing when the call was cut off)
        inner = text[len(QUOTE) :]
        return inner.removesuffix(QUOTE) if inner.endswith(QUOTE) else inner, True
    if text.startswith("{"):
        return dict(read_members(text, 1, "}")), False
    if text.startswith("["):
        items: list[Any] = []
        pos = 1
        while (pos := _skip(text, pos, _SPACE + ",")) < len(text) and text[pos] != "]":
            end = value_end(text, pos, ",]")
            end = len(text) if end < 0 else end
            items.append(read_value(text[pos:end])[0])
            pos = end
        return items, False
    return _bare(text), True


def read_members(text: str, pos: int, closer: str) -> list[tuple[str, Any]]:
    """The ``key:value`` members of a complete object's text from ``pos`` to ``closer``."""
    members: list[tuple[str, Any]] = []
    while (pos := _skip(text, pos, _SPACE + ",")) < len(text) and text[pos] != closer:
        member = read_member(text, pos, closer, ended=True)
        if member is None:
            break
        key, raw, pos = member
        members.append((key, read_value(raw)[0]))
    return members


def read_member(text: str, pos: int, closer: str, ended: bool) -> tuple[str, str, int] | None:
    """The member at ``text[pos]``: (key, its value's text, index past it); ``None`` when the
    text does not (yet) hold all of it. ``ended``: no more text comes (a bare value then runs to
    the end)."""
    if text.startswith(QUOTE, pos):
        key_end = text.find(QUOTE, pos + len(QUOTE))
        if key_end < 0:
            return None
        key = text[pos + len(QUOTE) : key_end]
        colon = _skip(text, key_end + len(QUOTE))
        if colon >= len(text) or text[colon] != ":":
            return None
    else:
        colon = text.find(":", pos)
        if colon < 0:
            return None
        key = text[pos:colon].strip(_SPACE)
        if not key or any(c in key for c in "{}[](),<"):
            return None
    start = _skip(text, colon + 1)
    end = value_end(text, start, "," + closer)
    if end < 0:
        if not ended or start >= len(text):
            return None
        end = len(text)
    return key, text[start:end], end


@TOOL_PARSERS.register("gemma4")
class Gemma4ToolParser(MemberCalls, DelimitedToolParser):
    call_start = CALL_START
    call_end = CALL_END
    needs_special_tokens = True  # <|tool_call>, <tool_call|> and <|"|> are special tokens

    def call_begin(self) -> None:
        super().call_begin()
        self._closer = "}"
        self._closed = False

    def call_head(self, body: str, complete: bool) -> tuple[str, int] | None:
        head = _HEAD.match(body)
        if head is None:
            return None
        self._closer = _CLOSING[head.group(2)]
        return head.group(1), head.end()

    def read_members(self, events: list[Event], body: str, complete: bool, final: bool) -> bool:
        """Bare members up to the closing brace (or parenthesis); a call cut off after it ends."""
        while not self._closed:
            pos = _skip(body, self._pos, _SPACE + ",")
            if pos < len(body) and body[pos] == self._closer:
                self._closed = True
                break
            member = read_member(body, pos, self._closer, ended=complete) if pos < len(body) else None
            if member is None:
                break
            key, raw, self._pos = member
            self.add_member(events, key, self._value(key, raw))
        return complete or (final and self._closed)

    def _value(self, key: str, raw: str) -> Any:
        value, scalar = read_value(raw)
        tool = self.tools.get(self._name or "")
        properties = (tool.parameters or {}).get("properties") if tool is not None else None
        schema = properties.get(key) if isinstance(properties, Mapping) else None
        if scalar and isinstance(schema, Mapping):
            text = raw.strip(_SPACE)
            return coerce(value if text.startswith(QUOTE) else text, schema)
        return value

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return "".join(f"{CALL_START}call:{c.name}{format_value(c.args)}{CALL_END}" for c in calls)


def format_value(value: Any) -> str:
    """A JSON value written as the template's ``format_argument`` writes it."""
    if isinstance(value, str):
        return f"{QUOTE}{value}{QUOTE}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return json.dumps(value)
