"""A user's tool-call parser, as a ``--tool-parser-plugin`` file (the tests load it by path):
calls written as whole lines, ``CALL NAME ARGS_JSON``; other lines are content."""

from dyn.core.parsers.events import TOOL_CALL_END, ToolCallArgs, ToolCallStart
from dyn.core.parsers.tool import TOOL_PARSERS, ToolParser


@TOOL_PARSERS.register("line_calls")
class LineCalls(ToolParser):
    def __init__(self, tools=()):
        super().__init__(tools)
        self.buf = ""

    def feed(self, text):
        self.buf += text
        return []

    def finish(self):
        events = []
        for line in self.buf.split("\n"):
            if line.startswith("CALL "):
                _, name, args = line.split(" ", 2)
                events += [ToolCallStart(name), ToolCallArgs(args), TOOL_CALL_END]
            elif line:
                events.append(line + "\n")
        return events
