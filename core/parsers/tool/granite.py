"""IBM Granite tool calls.

``granite`` (Granite 3.0, 3.1, 3.2, 3.3): a JSON array of calls after ``<|tool_call|>`` (3.0, a
special token) or ``<tool_call>`` (3.1 and later, plain text); the models write each call's
``"arguments"`` before its ``"name"`` (as vLLM's tests record for granite-3.1-8b-instruct):

    <tool_call>[{"arguments": {"city": "Tokyo"}, "name": "get_weather"}]

As in vLLM's ``granite`` parser, an output that starts with the array itself is read as calls
too (the special token skipped by the detokenizer); unlike it, a marker later in the output
also opens calls (vLLM reads calls only at the start and returns such text as content).

``granite-20b-fc`` (granite-20b-functioncalling): one JSON object after each
``<function_call>``, after any content:

    <function_call> {"name": "get_weather", "arguments": {"city": "Tokyo"}}
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import json_call
from dyn.core.parsers.tool.json_list import JsonListParser


@TOOL_PARSERS.register("granite")
class GraniteToolParser(JsonListParser):
    markers = ("<|tool_call|>", "<tool_call>")
    output_openers = "["

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        items = ", ".join(f'{{"arguments": {c.arguments}, "name": {json.dumps(c.name)}}}' for c in calls)
        return f"<tool_call>[{items}]"


@TOOL_PARSERS.register("granite-20b-fc")
class Granite20bFCToolParser(JsonListParser):
    markers = ("<function_call>",)
    json_array = False

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return "\n".join(f"<function_call> {json_call(c)}" for c in calls)
