"""Salesforce xLAM tool calls (vLLM's ``xlam``: Llama-xLAM-2-8b-fc-r, xLAM-2-32b-fc-r and kin):
a JSON array of ``{"name", "arguments"}`` objects (the xLAM-2 chat templates' format):

    [{"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX"}},
     {"name": "get_current_weather", "arguments": {"city": "Orlando", "state": "FL"}}]

The array is read where vLLM's xLAM parser looks for it: at the start of the output, right after
a ``</think>``, in a code fence (three backticks, maybe followed by ``json``), after
``[TOOL_CALLS]``, or between ``<tool_call>`` and ``</tool_call>``:

    I'll help you with that.
    ```json
    [{"name": "get_current_weather", "arguments": {"city": "Dallas"}}]
    ```

Each call streams verbatim as its object arrives; the list ends where its JSON does and the
closing fence or ``</tool_call>`` after it is dropped. Text around the array is content, and so
is an opening that holds no array of calls (a code fence of Python, ``[1]`` in prose, ``[]``),
marker included.
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.text import find_first, marker_tail
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.call_list_readers import ClosedList
from dyn.core.parsers.tool.call_lists import CallListParser, CallListReader, skip_space
from dyn.core.parsers.tool.delimited import json_call
from dyn.core.parsers.tool.json_list import JsonCallList

THINK_END = "</think>"
_CLOSINGS = {"```json": "```", "```": "```", "<tool_call>": "</tool_call>"}


@TOOL_PARSERS.register("xlam")
class XLamToolParser(CallListParser):
    markers = ("[TOOL_CALLS]", "<tool_call>", "```json", "```")

    def reader(self, marker: str) -> CallListReader:
        return ClosedList(JsonCallList(array=True), _CLOSINGS.get(marker, ""))

    def find_opening(self, text: str, at_start: bool) -> tuple[int, str] | int:
        """A marker, or a ``[`` that starts the output or follows ``</think>`` (after
        whitespace), whichever comes first; else what to hold back."""
        if at_start:
            first = skip_space(text, 0)
            if first == len(text):
                return len(text)
            if text[first] == "[":
                return first, ""
        found: tuple[int, str] | None = find_first(text, self.markers)
        if found is not None and "```json".startswith(text[found[0] :]) and found[1] == "```":
            return len(text) - found[0]  # the fence's language may still come
        keep = marker_tail(text, (*self.markers, THINK_END))
        think = text.find(THINK_END)
        while think >= 0 and (found is None or think < found[0]):
            after = skip_space(text, think + len(THINK_END))
            if after == len(text):
                keep = max(keep, len(text) - think)
                break
            if text[after] == "[":
                found = (after, "")
                break
            think = text.find(THINK_END, after)
        return keep if found is None else found

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        items = ", ".join(json_call(c) for c in calls)
        return f"[{items}]"
