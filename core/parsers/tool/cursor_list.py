"""``CursorListReader``: a ``CallListReader`` (``call_lists``) that walks its list from a cursor
and ends it after its last complete call; the JSON lists (``json_list``) and the Python calls
(``pythonic``) read this way.
"""

from __future__ import annotations

import abc

from dyn.core.parsers.events import Event
from dyn.core.parsers.tool.call_lists import CallListReader, skip_space


class CursorListReader(CallListReader, abc.ABC):
    """A list reader whose cursor ``_pos`` is where reading resumes and ``_last_end`` the index
    just past its last complete call (both 0 at first).

    ``read`` alternates, until the list ends or fails, between a call being read
    (``in_call``, ``read_call``) and what stands between calls, taken at each next
    non-whitespace character (``read_between``). Either returns False to wait for more text.
    """

    def __init__(self) -> None:
        super().__init__()
        self._pos = 0
        self._last_end = 0

    def read(self, text: str, final: bool) -> list[Event]:
        events: list[Event] = []
        while self.end < 0 and not self.failed:
            if self.in_call():
                if not self.read_call(text, final, events):
                    return events
                continue
            pos = self.next_char(text, final)
            if pos < 0 or not self.read_between(text, pos, final, events):
                return events
        return events

    @abc.abstractmethod
    def in_call(self) -> bool:
        """Whether a call is being read."""

    @abc.abstractmethod
    def read_call(self, text: str, final: bool, events: list[Event]) -> bool:
        """Read on in the call, adding its events; False while it needs more text."""

    @abc.abstractmethod
    def read_between(self, text: str, pos: int, final: bool, events: list[Event]) -> bool:
        """Take the character at ``pos`` outside a call (an opening, a separator, a call's start,
        the list's end); False while it needs more text."""

    def next_char(self, text: str, final: bool) -> int:
        """The index of the first non-whitespace character of ``text`` at or after the cursor,
        or -1 when the text so far has none; then, when ``final``, the list stops (``_stop``)."""
        pos = skip_space(text, self._pos)
        if pos == len(text):
            if final:
                self._stop()
            return -1
        return pos

    def _stop(self) -> None:
        """The list ends after its last complete call; with none, it is unreadable."""
        if self.calls:
            self.end = self._last_end
        else:
            self.failed = True
