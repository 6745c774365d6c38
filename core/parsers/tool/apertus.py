"""Apertus tool calls (vLLM's ``apertus``: swiss-ai/Apertus-8B-Instruct and -70B, their chat
template): after any content, a JSON array of one-key objects, each mapping a function's name to
its arguments, between the special tokens ``<|tools_prefix|>`` and ``<|tools_suffix|>``:

    Let me check the weather for you. <|tools_prefix|>[{"get_weather": {"location": "Paris"}},
    {"get_time": {"location": "Paris"}}]<|tools_suffix|>

(one line in the output; wrapped here). A call starts once ``{"NAME": {`` is read and its
arguments object goes out verbatim as it arrives; the array (or a single object, which vLLM
reads too) ends where its JSON does, and the ``<|tools_suffix|>`` after it is dropped. A list
that is empty or whose first element is no call is content, its marker included.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.call_list_readers import ClosedList
from dyn.core.parsers.tool.call_lists import CallListParser, CallListReader
from dyn.core.parsers.tool.json_list import CallObject, JsonCallList

TOOLS_PREFIX = "<|tools_prefix|>"
TOOLS_SUFFIX = "<|tools_suffix|>"

_NAMED_HEAD = re.compile(r'\s*\{\s*("(?:[^"\\]|\\.)*")\s*:\s*')


class NamedCallObject(CallObject):
    """A call object ``{"NAME": {arguments}}``: its one key is the function's name."""

    def __init__(self) -> None:
        super().__init__()
        self.head = _NAMED_HEAD


class NamedCallList(JsonCallList):
    """``JsonCallList`` of ``{"NAME": {arguments}}`` objects."""

    def __init__(self, array: bool | None = None) -> None:
        super().__init__(array)
        self._object = NamedCallObject()


@TOOL_PARSERS.register("apertus")
class ApertusToolParser(CallListParser):
    markers = (TOOLS_PREFIX,)
    end_marker = TOOLS_SUFFIX
    needs_special_tokens = True  # vLLM's adjust_request: the markers are special tokens

    def reader(self, marker: str) -> CallListReader:
        return ClosedList(NamedCallList(array=None))

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        items = ", ".join(f"{{{json.dumps(c.name, ensure_ascii=False)}: {c.arguments}}}" for c in calls)
        return f"{TOOLS_PREFIX}[{items}]{TOOLS_SUFFIX}"
