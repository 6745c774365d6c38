"""Calls grouped in a section (DeepSeek-V3's ``<｜tool▁calls▁begin｜>`` ... ``<｜tool▁calls▁end｜>``,
Kimi K2's ``<|tool_calls_section_begin|>`` ...), each call between its own markers, its body a
head (the function's name, maybe an id) followed by the arguments as a JSON object.

``SectionedToolParser`` drops the section markers that wrap calls and reads the calls as
``DelimitedToolParser`` does: a section start followed (after whitespace) by a call start is
dropped, and so is the section end inside a section; a section start followed by anything
else stays content. A call start outside any section is still read as a call (models that
forget the section marker). ``JsonArgsBody`` streams a headed body's JSON arguments verbatim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallStart
from dyn.core.parsers.text import find_first, split_held
from dyn.core.parsers.tool import Tool
from dyn.core.parsers.tool.delimited import DelimitedToolParser, VerbatimJson

_OUTSIDE, _OPENED, _INSIDE = 0, 1, 2


class SectionedToolParser(DelimitedToolParser):
    """``DelimitedToolParser`` whose calls sit inside ``section_starts`` ... ``section_ends``."""

    section_starts: tuple[str, ...]
    section_ends: tuple[str, ...]
    """The section markers, class attributes a parser may set per instance (as the call markers)."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        self._pending = ""
        self._section = _OUTSIDE
        self._opened = ""

    def feed(self, text: str) -> list[Event]:
        return super().feed(self._unwrap(text, final=False))

    def finish(self) -> list[Event]:
        rest = self._unwrap("", final=True)
        events = super().feed(rest) if rest else []
        return events + super().finish()

    def _unwrap(self, text: str, final: bool) -> str:
        """The text with the section markers around calls removed; holds back what may still
        turn out to be one."""
        buf = self._pending + text
        out: list[str] = []
        while True:
            if self._section == _OUTSIDE:
                buf, marker = _until(buf, self.section_starts, final, out)
                if marker is None:
                    break
                self._opened = marker
                self._section = _OPENED
            elif self._section == _OPENED:
                body = buf.lstrip()
                if body.startswith(self.call_start):
                    buf = body
                    self._opened = ""
                    self._section = _INSIDE
                elif not final and self.call_start.startswith(body):
                    break  # maybe a call start, not complete yet
                else:
                    out.append(self._opened)
                    self._opened = ""
                    self._section = _OUTSIDE
            else:
                buf, marker = _until(buf, self.section_ends, final, out)
                if marker is None:
                    break
                self._section = _OUTSIDE
        self._pending = buf
        return "".join(out)


def _until(buf: str, markers: tuple[str, ...], final: bool, out: list[str]) -> tuple[str, str | None]:
    """Move the text before the first of ``markers`` into ``out``: (what follows it, the marker);
    without one, all but a tail that may begin one: (that tail, None)."""
    hit = find_first(buf, markers)
    if hit is None:
        ready, held = split_held(buf, markers, final)
        out.append(ready)
        return held, None
    at, marker = hit
    out.append(buf[:at])
    return buf[at + len(marker) :], marker


class CallHead(NamedTuple):
    """What a call body's head says: the function's name, the model's call id (if its format
    has one), and where the arguments object starts in the body."""

    name: str
    id: str | None
    args_at: int


HeadReader = Callable[[str, bool], CallHead | None]
"""``(body so far, complete) -> CallHead``, or ``None`` while the head is not (or cannot be)
read. Once it reads a head from a body it must read the same head from every longer body."""


class JsonArgsBody:
    """Streams a call whose body is a head and then a JSON object (the arguments).

    The call starts as soon as ``read_head`` reads the head (the arguments' ``{`` included);
    the object's text then goes out verbatim as it arrives, up to its closing brace (anything
    after it in the body, like DeepSeek-V3's closing code fence, is ignored). A body that ends
    before a head was read is unreadable (``None``).
    """

    __slots__ = ("read_head", "_args_at", "_args")

    def __init__(self, read_head: HeadReader) -> None:
        self.read_head = read_head
        self.reset()

    def reset(self) -> None:
        self._args_at = -1
        self._args = VerbatimJson()

    def events(self, body: str, complete: bool, final: bool) -> list[Event] | None:
        events: list[Event] = []
        if self._args_at < 0:
            head = self.read_head(body, complete)
            if head is None:
                return None if complete or final else events
            self._args_at = head.args_at
            events.append(ToolCallStart(head.name, head.id))
        if self._args.end < 0:
            self._args.send(body[self._args_at :], events)
        if complete or (final and self._args.end >= 0):
            events.append(TOOL_CALL_END)
        return events
