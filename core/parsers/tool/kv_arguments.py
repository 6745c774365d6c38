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
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallArgs, ToolCallStart
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


class MemberCalls:
    """The current call of a ``DelimitedToolParser`` format whose body is a head naming the
    function and then the arguments one key/value at a time (GLM, DSML, MiniMax, Kimi K3,
    Step-3, Gemma 4). Mixed in before the parser base, so that its ``call_begin`` resets the
    state at each call's start marker (and when the parser is built).

    ``_name``: the function, ``None`` until the head is read; ``_pos``: where in the body the
    next member is searched; ``_args``: the writer of the arguments object. ``start_call``,
    ``add_member`` and ``end_call`` append the events of each step.

    ``call_events`` reads a body with the format's hooks: ``call_head`` reads the head, then
    ``read_members`` the members (by default each match of ``member_pattern``, read by
    ``member``). A format whose body is read otherwise overrides ``call_events`` itself.
    """

    _name: str | None
    _pos: int
    _args: ArgumentsWriter
    member_pattern: re.Pattern[str]
    """One complete member of the body, for the default ``read_members``."""

    if TYPE_CHECKING:  # the parser base's

        def unreadable(self, body: str, complete: bool, final: bool) -> list[Event]: ...

    def call_begin(self) -> None:
        self._name = None
        self._pos = 0
        self._args = ArgumentsWriter()

    def start_call(self, events: list[Event], name: str, pos: int) -> None:
        """The head is read: the call of ``name`` starts; its members are searched from ``pos``."""
        self._name, self._pos = name, pos
        events.append(ToolCallStart(name))

    def add_member(self, events: list[Event], key: str, value: Any) -> None:
        """The next argument, ``key`` = ``value``, goes out as a piece of the object."""
        events.append(ToolCallArgs(self._args.member(key, value)))

    def add_members(
        self,
        events: list[Event],
        body: str,
        pattern: re.Pattern[str],
        member: Callable[[re.Match[str]], tuple[str, Any]],
    ) -> None:
        """Every complete member that ``pattern`` finds in ``body`` from ``_pos`` on goes out
        (``member`` reads its key and value from the match); ``_pos`` moves past each."""
        while (match := pattern.search(body, self._pos)) is not None:
            self.add_member(events, *member(match))
            self._pos = match.end()

    def end_call(self, events: list[Event]) -> None:
        """The body is complete: the object closes and the call ends."""
        events += [ToolCallArgs(self._args.close()), TOOL_CALL_END]

    def call_events(self, body: str, *, complete: bool, final: bool) -> list[Event]:
        """The call starts once ``call_head`` reads its head (until then the body is
        ``unreadable``); its members go out as ``read_members`` reads them, and it ends when
        ``read_members`` says so."""
        events: list[Event] = []
        if self._name is None:
            head = self.call_head(body, complete)
            if head is None:
                return self.unreadable(body, complete, final)
            self.start_call(events, *head)
        if self.read_members(events, body, complete, final):
            self.end_call(events)
        return events

    def call_head(self, body: str, complete: bool) -> tuple[str, int] | None:
        """(the function's name, where its members start) once ``body`` holds the head; None
        while it does not, or when it cannot be read."""
        raise NotImplementedError(f"{type(self).__name__} reads no call heads")

    def read_members(self, events: list[Event], body: str, complete: bool, final: bool) -> bool:
        """Adds the members complete in ``body`` from ``_pos`` on; True when the call ends with
        them. By default every ``member_pattern`` match, read by ``member``, and the call ends
        with its end marker (``complete``)."""
        self.add_members(events, body, self.member_pattern, self.member)
        return complete

    def member(self, match: re.Match[str]) -> tuple[str, Any]:
        """(key, value) of the member ``match`` of ``member_pattern`` found."""
        raise NotImplementedError(f"{type(self).__name__} reads no members")
