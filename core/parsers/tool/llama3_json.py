"""Llama 3.1 / 3.2 / 3.3 (and Llama 4) JSON tool calls: the answer is one or more JSON objects,
``{"name": ..., "parameters": {...}}`` (``"arguments"`` too), several separated by ``; ``,
optionally after ``<|python_tag|>`` (llama-models' prompt_format.md, "JSON based tool calling"):

    <|python_tag|>{"type": "function", "name": "trending_songs", "parameters": {"n": "10"}}

As in vLLM's ``llama3_json`` streaming reader, the output is read as calls only when it opens
with them: ``{`` as its first character (after whitespace), or ``<|python_tag|>`` (a special
token, so usually skipped before the parser sees the text; this parser also reads calls after
the tag later in the output, as Dynamo does). Anything else is content, and so is an output
whose first object is not a call. Text after the calls is content.
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.call_lists import CallListParser, CallListReader
from dyn.core.parsers.tool.delimited import json_call
from dyn.core.parsers.tool.json_list import JsonCallList


@TOOL_PARSERS.register("llama3_json", "llama4_json")
class Llama3JsonToolParser(CallListParser):
    markers = ("<|python_tag|>",)
    output_openers = "{"

    def reader(self, marker: str) -> CallListReader:
        return JsonCallList(array=False, separator=";")

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return "; ".join(json_call(c, "parameters") for c in calls)
