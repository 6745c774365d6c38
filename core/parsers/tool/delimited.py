"""The common shape of most tool-call formats: content, then calls each written between a start
and an end marker (``<tool_call>`` ... ``</tool_call>``).

``DelimitedToolParser`` finds the markers in streamed text (holding back a tail that may be the
start of one) and hands each call's body, as it grows, to the subclass's ``call_events``.
Whitespace right after a call is dropped (models put newlines between calls); other text after a
call is content. A call whose end marker never came is read when the stream ends, as far as it
got (``finish``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallArgs, ToolCallStart
from dyn.core.parsers.text import JsonScanner, marker_tail, split_held
from dyn.core.parsers.tool import Tool, ToolCall
from dyn.core.parsers.tool.buffered import BufferedToolParser


class DelimitedToolParser(BufferedToolParser):
    """Calls between ``call_start`` and ``call_end``; subclasses read the body (``call_events``)."""

    call_start: str
    call_end: str
    """The call markers: class attributes, which a parser may set anew per instance in its
    constructor (markers that depend on the served checkpoint's vocabulary)."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        self._in_call = False
        self._searched = 0
        """How far the current call's body was searched for its end marker (a long call is not
        searched from its start at every piece)."""
        self._reader = self.body_reader()
        self.call_begin()

    def feed(self, text: str) -> list[Event]:
        if not self._in_call and not self._buf and self.call_start[0] not in text:
            events: list[Event] = []  # the common piece: plain content, nothing held
            self._content(events, text)
            return events
        return super().feed(text)

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            buf = self._buf
            if not self._in_call:
                hit = buf.find(self.call_start)
                if hit < 0:
                    ready, self._buf = split_held(buf, (self.call_start,), final)
                    self._content(events, ready)
                    return events
                self._content(events, buf[:hit])
                self._buf = buf[hit + len(self.call_start) :]
                self._in_call = True
                self._searched = 0
                self.call_begin()
                continue
            end = buf.find(self.call_end, self._searched)
            if end < 0:
                self._searched = max(0, len(buf) - len(self.call_end) + 1)
                if final:
                    events.extend(self.call_events(buf, complete=False, final=True))
                    self._buf = ""
                    return events
                keep = marker_tail(buf, (self.call_end,))
                events.extend(self.call_events(buf[: len(buf) - keep], complete=False, final=False))
                return events
            events.extend(self.call_events(buf[:end], complete=True, final=final))
            self._buf = buf[end + len(self.call_end) :]
            self._in_call = False
            self._after_call = True

    def raw_call(self, body: str, complete: bool = True) -> str:
        """A call that cannot be read, returned as content with its markers."""
        return self.call_start + body + (self.call_end if complete else "")

    def unreadable(self, body: str, complete: bool, final: bool) -> list[Event]:
        """The events of a body whose head cannot be read (yet): nothing while more may come,
        and the call as content (``raw_call``) once it ended (``complete`` or ``final``)."""
        return [self.raw_call(body, complete)] if complete or final else []

    # ------------------------------------------------------------------ subclass hooks

    def body_reader(self) -> CallBodyReader | None:
        """The reader of every call's body, for formats that one reader handles; the others
        override ``call_begin`` and ``call_events`` instead."""
        return None

    def call_begin(self) -> None:
        """A new call's start marker was read (also called once when the parser is built, so
        that overrides set up the per-call state there)."""
        if self._reader is not None:
            self._reader.reset()

    def call_events(self, body: str, *, complete: bool, final: bool) -> list[Event]:
        """Events for the current call's ``body`` so far (everything after its start marker,
        growing by appends between calls). ``complete``: the end marker was read; ``final``:
        the stream ended (a call cut off is ``final`` and not ``complete``). By default the
        ``body_reader``'s, and a body it cannot read is content."""
        if self._reader is None:
            raise NotImplementedError(f"{type(self).__name__} reads no call bodies")
        events = self._reader.events(body, complete, final)
        return [self.raw_call(body, complete)] if events is None else events


class CallBodyReader(Protocol):
    """Reads one call's body as it grows (``JsonCallBody`` and its kin)."""

    def reset(self) -> None:
        """A new call begins."""

    def events(self, body: str, complete: bool, final: bool) -> list[Event] | None:
        """Events for the body so far; ``None`` when a body that ended cannot be read."""


class VerbatimJson:
    """Sends the text of one JSON value (a call's arguments) as it arrives, verbatim, up to
    where the value ends.

    ``send(text, events)``: ``text`` is the value's text so far (from its first character, or
    whitespace before it), growing between calls. It appends a ``ToolCallArgs`` with the part
    not sent yet (up to the value's end; nothing when there is none) and returns the index in
    ``text`` just past the value, or -1 while it is still open; ``end`` keeps that answer.
    """

    __slots__ = ("_scanner", "_sent", "end")

    def __init__(self) -> None:
        self._scanner = JsonScanner()
        self._sent = 0
        self.end = -1

    def send(self, text: str, events: list[Event]) -> int:
        end = self._scanner.scan(text)
        upto = end if end >= 0 else len(text)
        if upto > self._sent:
            events.append(ToolCallArgs(text[self._sent : upto]))
            self._sent = upto
        self.end = end
        return end


class JsonCallBody:
    """Reads a call body that is a JSON object holding the function's name and its arguments
    (``{"name": "f", "arguments": {...}}``), streaming the arguments as they arrive.

    When the body starts with the name and then the arguments key, the name is announced as soon
    as it is read and the arguments object's text goes out verbatim as it grows; any other shape
    (keys in another order, arguments as a JSON string) is read once the body is complete.
    """

    __slots__ = ("head", "args_keys", "_started", "_args_at", "_args")

    def __init__(
        self, name_key: str = "name", args_keys: Sequence[str] = ("arguments", "parameters")
    ) -> None:
        self.args_keys = tuple(args_keys)
        self.head = _call_head(name_key, self.args_keys)
        self.reset()

    def reset(self) -> None:
        self._started = False
        self._args_at = -1
        self._args = VerbatimJson()

    def events(
        self, body: str, complete: bool, final: bool = False, name_key: str = "name"
    ) -> list[Event] | None:
        """Events for the body so far; ``None`` when a body that ended (``complete``, or cut off
        by the end of the stream: ``final``) cannot be read as a call."""
        events: list[Event] = []
        if not self._started:
            match = self.head.match(body)
            name = None
            if match is not None and len(body) > match.end() and body[match.end()] == "{":
                name = _json_string(match.group(1))
            if match is not None and name is not None:
                self._started = True
                self._args_at = match.end()
                events.append(ToolCallStart(name))
            elif complete or final:
                call = read_json_call(body, name_key, self.args_keys)
                if call is None:
                    return None
                name, arguments = call
                return [ToolCallStart(name), ToolCallArgs(arguments), TOOL_CALL_END]
            else:
                return events
        if self._args.end < 0:
            self._args.send(body[self._args_at :], events)
        if complete or (final and self._args.end >= 0):
            events.append(TOOL_CALL_END)
        return events


def _json_string(text: str) -> str | None:
    """The string a JSON string literal holds; ``None`` when it is not valid JSON (a raw
    control character, an unknown escape)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


@functools.lru_cache(maxsize=16)
def _call_head(name_key: str, args_keys: tuple[str, ...]) -> re.Pattern[str]:
    """The pattern of a call object's start: the name, then the arguments key (one per key set)."""
    keys = "|".join(re.escape(k) for k in args_keys)
    return re.compile(
        r'\s*\{\s*"' + re.escape(name_key) + r'"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:' + keys + r')"\s*:\s*'
    )


def read_json_call(
    text: str, name_key: str = "name", args_keys: Sequence[str] = ("arguments", "parameters")
) -> tuple[str, str] | None:
    """(name, arguments JSON) of a complete JSON call object, or ``None`` when it is not one.
    Arguments given as a JSON string are decoded (some models double-encode them)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get(name_key), str):
        return None
    args: Any = next((obj[k] for k in args_keys if k in obj), {})
    return obj[name_key], arguments_json(args)


def json_call(call: ToolCall, args_key: str = "arguments") -> str:
    """A call written as the JSON object ``read_json_call`` reads back:
    ``{"name": NAME, "<args_key>": ARGUMENTS}``, the arguments' JSON text as it is."""
    return f'{{"name": {json.dumps(call.name)}, {json.dumps(args_key)}: {call.arguments}}}'


def arguments_json(args: Any) -> str:
    """Arguments as JSON text; a string holding a JSON object is taken as that object."""
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            args = decoded
    return json.dumps(args, ensure_ascii=False)
