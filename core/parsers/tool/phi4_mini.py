"""Phi-4-mini JSON tool calls (vLLM's ``phi4_mini_json``, for microsoft/Phi-4-mini-instruct; the
format of vLLM's phi4mini_tool_parser.py and its tests): the word ``functools`` and, right after
it, a JSON array of ``{"name", "arguments"}`` objects (``"parameters"`` too):

    Let me check the weather for you.
    functools[{"name": "get_weather", "arguments": {"city": "Tokyo"}}]

The array is read as the other JSON-list formats read theirs (each call streams verbatim as its
object arrives; the list ends where its JSON does). Text before and after it is content, and so
is ``functools`` that opens no array of calls (prose about Python's ``functools``, an empty
array).
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.call_list_readers import ClosedList
from dyn.core.parsers.tool.call_lists import CallListParser, CallListReader
from dyn.core.parsers.tool.delimited import json_call
from dyn.core.parsers.tool.json_list import JsonCallList


@TOOL_PARSERS.register("phi4_mini_json")
class Phi4MiniJsonToolParser(CallListParser):
    markers = ("functools",)

    def reader(self, marker: str) -> CallListReader:
        return ClosedList(JsonCallList(array=True))

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        items = ", ".join(json_call(c) for c in calls)
        return f"functools[{items}]"
