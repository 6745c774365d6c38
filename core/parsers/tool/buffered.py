"""``BufferedToolParser``: the base of the tool parsers that buffer their text (``BufferedParser``)
and drop the whitespace a model writes between calls."""

from __future__ import annotations

from dyn.core.parsers.events import Event
from dyn.core.parsers.stream import BufferedParser
from dyn.core.parsers.tool import ToolParser


class BufferedToolParser(BufferedParser, ToolParser):
    """A ``BufferedParser`` tool parser whose content goes out through ``_content``.

    Set ``_after_call`` when a call (or a list of calls) ends: the whitespace that starts the
    content after it is then dropped, up to its first other character (which clears the flag).
    """

    _after_call: bool = False
    """A call just ended: leading whitespace of the next content is dropped."""

    def _content(self, events: list[Event], text: str) -> None:
        """Append ``text`` to ``events`` as content (nothing when it is empty, or only
        whitespace right after a call)."""
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        if text:
            events.append(text)
