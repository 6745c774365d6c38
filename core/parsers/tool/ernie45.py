"""Baidu ERNIE-4.5 thinking models' tool calls (vLLM's ``ernie45``).

Format (vLLM's ernie45_tool_parser.py, for baidu/ERNIE-4.5-21B-A3B-Thinking): after the
reasoning, each call is a JSON object with ``name`` and ``arguments`` between ``<tool_call>``
and ``</tool_call>``, Hermes-style; an answer without calls may be wrapped in ``<response>`` ...
``</response>``.

    The user wants the weather.
    </think>


    <tool_call>
    {"name": "get_weather", "arguments": {"location": "Beijing"}}
    </tool_call>

The reasoning (up to ``</think>``) is the ``ernie45`` reasoning parser's. As vLLM does, the
content drops the ``<response>`` markers and the newlines right after them, and the newlines
just before a call.
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.events import Event
from dyn.core.parsers.tool import TOOL_PARSERS, Tool
from dyn.core.parsers.tool.content_markers import ContentMarkers
from dyn.core.parsers.tool.hermes import HermesToolParser


@TOOL_PARSERS.register("ernie45")
class Ernie45ToolParser(HermesToolParser):
    needs_special_tokens = False  # vLLM asks for no change

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        super().__init__(tools)
        self._markers = ContentMarkers(("<response>", "</response>"), after="\n", before_calls="\n")

    def feed(self, text: str) -> list[Event]:
        return self._markers.apply(super().feed(text))

    def finish(self) -> list[Event]:
        return self._markers.apply(super().finish(), final=True)
