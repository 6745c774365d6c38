"""Wrapper markers dropped from a tool-call parser's content as it streams: formats that wrap the
answer in markers of its own (Kimi K3's ``<|open|>response<|sep|>`` channel, ERNIE's
``<response>``), which are not calls and not part of the answer.

``ContentMarkers.apply(events)`` rewrites a parser's events: content loses every marker (and,
when asked, the characters ``after`` a marker and those ``before_calls`` at the end of the
content that a call follows); other events pass unchanged, in order. A tail of the content that
may begin a marker (or be dropped before a call) is held until the next events tell.
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.events import Event, ToolCallStart
from dyn.core.parsers.text import find_first, marker_tail


class ContentMarkers:
    """Drops ``markers`` from the content events of one parser's stream (see the module)."""

    __slots__ = ("markers", "after", "before_calls", "_held", "_skipping")

    def __init__(self, markers: Sequence[str], *, after: str = "", before_calls: str = "") -> None:
        self.markers = tuple(markers)
        self.after = after
        """Characters dropped right after a marker (``"\\n"``: the newlines that follow it)."""
        self.before_calls = before_calls
        """Characters dropped at the end of content that a call follows."""
        self._held = ""
        self._skipping = False

    def apply(self, events: list[Event], final: bool = False) -> list[Event]:
        """``events`` with their content rewritten; ``final``: the stream ended (nothing held)."""
        out: list[Event] = []
        for event in events:
            if isinstance(event, str):
                self._take(event, out)
            else:
                self._flush(out, before_call=isinstance(event, ToolCallStart))
                out.append(event)
        if final:
            self._flush(out, before_call=False)
        return out

    def _take(self, text: str, out: list[Event]) -> None:
        held = self._held + text
        while (hit := find_first(held, self.markers)) is not None:
            at, marker = hit
            self._emit(held[:at], out)
            held = held[at + len(marker) :]
            self._skipping = bool(self.after)
        cut = len(held) - marker_tail(held, self.markers)
        while self.before_calls and cut > 0 and held[cut - 1] in self.before_calls:
            cut -= 1
        self._emit(held[:cut], out)
        self._held = held[cut:]

    def _flush(self, out: list[Event], before_call: bool) -> None:
        text, self._held = self._held, ""
        if before_call and self.before_calls:
            text = text.rstrip(self.before_calls)
        self._emit(text, out)
        self._skipping = False

    def _emit(self, text: str, out: list[Event]) -> None:
        if self._skipping:
            text = text.lstrip(self.after)
            if text:
                self._skipping = False
        if text:
            out.append(text)
