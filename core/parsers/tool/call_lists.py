"""Calls written as a list that opens at a marker and whose own syntax says where it ends: a JSON
array after Mistral's ``[TOOL_CALLS]``, Granite's ``<tool_call>`` or Jamba's ``<tool_calls>``,
``{...}; {...}`` at the start of a Llama 3 answer, ``[f(a=1), g()]`` in Python syntax.

``CallListParser`` is the content around such lists: it finds where a list opens (one of
``markers``, or, for formats that allow it, the list's own first character at the very start of
the output) and hands the text after the opening to a ``CallListReader``, which reads calls as
the text grows and says where the list ended (``end``) or that it cannot be read (``failed``).
A list that cannot be read is content, its marker included, and the text after the marker is
searched again. After a list, whitespace and an optional ``end_marker`` are dropped; the text
that follows is content and may open another list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from dyn.core.parsers.events import Event, ToolCallStart
from dyn.core.parsers.text import find_first, marker_tail
from dyn.core.parsers.tool import Tool
from dyn.core.parsers.tool.buffered import BufferedToolParser

_CONTENT, _LIST, _CLOSING = 0, 1, 2


class CallListReader:
    """Reads one list of calls from the text after its opening, which grows between calls.

    ``read(text, final)`` returns the events that the text so far completes. Once the list is
    over, ``end`` is the index in ``text`` just past it; if the list cannot be read as calls,
    ``failed`` is set instead; a reader only fails before its first call started (later trouble
    ends the list after its last call). When ``final`` (the stream ended), ``read`` settles one
    or the other: a call cut off is left as far as it got, without its end.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.end = -1
        self.failed = False

    def read(self, text: str, final: bool) -> list[Event]:
        raise NotImplementedError

    def count(self, events: list[Event]) -> list[Event]:
        """``events``, counting the calls they start."""
        self.calls += sum(isinstance(e, ToolCallStart) for e in events)
        return events


def skip_space(text: str, pos: int) -> int:
    """The index of the first non-whitespace character of ``text`` at or after ``pos``."""
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    return pos


class CallListParser(BufferedToolParser):
    """Content and lists of calls; subclasses name the markers and make the readers."""

    markers: ClassVar[tuple[str, ...]] = ()
    end_marker: ClassVar[str] = ""
    """Dropped right after a list (after whitespace) when the model writes it there."""
    output_openers: ClassVar[str] = ""
    """Characters that open a list without a marker when they start the output (after
    whitespace): vLLM's reading of Llama 3 JSON (``{``) and Granite (``[``) calls."""

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        self._state = _CONTENT
        self._at_start = True
        self._marker = ""
        self._reader: CallListReader | None = None

    def reader(self, marker: str) -> CallListReader:
        """A reader for the list opened by ``marker`` (``""``: opened by its first character)."""
        raise NotImplementedError

    def find_opening(self, text: str, at_start: bool) -> tuple[int, str] | int:
        """Where the first list in ``text`` opens: ``(index, marker)``, the marker ``""`` for a
        list that opens with its own first character there; or, when none opens, how many
        characters at the end of ``text`` to hold back (they may begin an opening).
        ``at_start``: ``text`` starts the output."""
        if at_start and self.output_openers:
            first = skip_space(text, 0)
            if first == len(text):
                return len(text)
            if text[first] in self.output_openers:
                return 0, ""
        hit = find_first(text, self.markers)
        if hit is not None:
            return hit
        return marker_tail(text, self.markers)

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            if self._state == _CONTENT:
                buf = self._buf
                found = self.find_opening(buf, self._at_start)
                if isinstance(found, int):
                    cut = len(buf) if final else len(buf) - found
                    self._content(events, buf[:cut])
                    self._buf = buf[cut:]
                    return events
                at, marker = found
                self._content(events, buf[:at])
                self._buf = buf[at + len(marker) :]
                self._marker = marker
                self._reader = self.reader(marker)
                self._state = _LIST
            elif self._state == _LIST:
                reader = self._reader
                assert reader is not None
                events.extend(reader.read(self._buf, final))
                if reader.failed:
                    self._unreadable(events)
                elif reader.end >= 0:
                    self._buf = self._buf[reader.end :]
                    self._state = _CLOSING
                else:
                    return events
            else:
                rest = self._buf.lstrip()
                if self.end_marker:
                    if rest.startswith(self.end_marker):
                        self._buf = rest[len(self.end_marker) :]
                    elif not final and self.end_marker.startswith(rest):
                        return events
                self._after_call = True
                self._state = _CONTENT

    def _unreadable(self, events: list[Event]) -> None:
        """The list just opened is no list of calls: its marker is content and the text after
        it is searched again (a list without a marker gives up its first character, so it
        does not open again at the same place)."""
        self._at_start = False
        if self._marker:
            self._content(events, self._marker)
        elif self._buf:
            self._content(events, self._buf[0])
            self._buf = self._buf[1:]
        self._state = _CONTENT

    def _content(self, events: list[Event], text: str) -> None:
        sent = len(events)
        super()._content(events, text)
        if len(events) > sent:
            self._at_start = False
