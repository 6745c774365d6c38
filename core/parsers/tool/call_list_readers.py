"""Wrappers of a ``CallListReader`` (``call_lists``) for formats whose list of calls has rules of its
own around it: ``ClosedList`` makes an empty list unreadable (``[]`` after a marker is no call,
so it stays content, marker included) and, for formats that close the list with a marker of
their own (a code fence, ``</tool_call>``), drops that marker after it.
"""

from __future__ import annotations

from dyn.core.parsers.events import Event
from dyn.core.parsers.tool.call_lists import CallListReader, skip_space


class ClosedList(CallListReader):
    """``inner``'s list, unreadable when it holds no call; then (after whitespace) its
    ``closing`` marker, when there is one and the model writes it."""

    def __init__(self, inner: CallListReader, closing: str = "") -> None:
        super().__init__()
        self.inner = inner
        self.closing = closing

    def read(self, text: str, final: bool) -> list[Event]:
        events: list[Event] = []
        if self.inner.end < 0:
            events = self.inner.read(text, final)
            self.calls, self.failed = self.inner.calls, self.inner.failed
            if self.inner.end < 0:
                return events
            if not self.calls:
                self.failed = True
                return events
        if not self.closing:
            self.end = self.inner.end
            return events
        at = skip_space(text, self.inner.end)
        if text.startswith(self.closing, at):
            self.end = at + len(self.closing)
        elif final or not self.closing.startswith(text[at:]):
            self.end = self.inner.end
        return events
