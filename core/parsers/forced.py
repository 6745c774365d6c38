"""Reading the output of a forced tool call (``tool_choice`` named or ``required``).

The engine was constrained to a JSON Schema (``dyn.core.protocol.tools.forced_schema``), so the
output is JSON, not a model's own call format:

- named: the whole output is the function's arguments object;
- required: an array of ``{"name": ..., "parameters": {...}}`` objects.

Both stream like the format parsers (``dyn.core.parsers.tool``): the call starts as soon as its
name is known and its arguments go out verbatim as they arrive.
"""

from __future__ import annotations

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallArgs, ToolCallStart
from dyn.core.parsers.stream import BufferedParser
from dyn.core.parsers.text import JsonScanner
from dyn.core.parsers.tool import ToolParser
from dyn.core.parsers.tool.delimited import JsonCallBody


class NamedToolCallParser(ToolParser):
    """The output is the arguments of ``function``; the call ends with the stream."""

    def __init__(self, function: str) -> None:
        super().__init__()
        self.function = function
        self._started = False

    def feed(self, text: str) -> list[Event]:
        if not self._started:
            text = text.lstrip()
            if not text:
                return []
            self._started = True
            return [ToolCallStart(self.function), ToolCallArgs(text)]
        return [ToolCallArgs(text)] if text else []

    def finish(self) -> list[Event]:
        return [TOOL_CALL_END] if self._started else []


class RequiredToolCallsParser(BufferedParser, ToolParser):
    """The output is a JSON array of ``{"name", "parameters"}`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self._opened = False
        self._item: JsonCallBody | None = None
        self._scanner = JsonScanner()

    def _run(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while True:
            if not self._opened:
                stripped = self._buf.lstrip()
                if not stripped:
                    return events
                if stripped[0] != "[":  # not what the schema allows: nothing to read
                    self._buf = ""
                    return events
                self._buf = stripped[1:]
                self._opened = True
            if self._item is None:
                stripped = self._buf.lstrip().lstrip(",").lstrip()
                if not stripped or stripped[0] != "{":
                    self._buf = stripped
                    return events
                self._buf = stripped
                self._item = JsonCallBody(args_keys=("parameters", "arguments"))
                self._scanner = JsonScanner()
            end = self._scanner.scan(self._buf)
            body = self._buf if end < 0 else self._buf[:end]
            got = self._item.events(body, complete=end >= 0, final=final)
            if got:
                events.extend(got)
            if end < 0:
                return events
            self._buf = self._buf[end:]
            self._item = None
