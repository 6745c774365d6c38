"""AI21 Jamba tool calls: a JSON array of ``{"name", "arguments"}`` objects between
``<tool_calls>`` and ``</tool_calls>`` (special tokens of the Jamba 1.5 / 1.6 tokenizers), after
any content:

    Sure! let me call the tool for you.<tool_calls>[
        {"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX"}}
    ]</tool_calls>

The array (or a single object, as Dynamo also reads it) ends where its JSON does; the closing
``</tool_calls>`` after it is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import json_call
from dyn.core.parsers.tool.json_list import JsonListParser


@TOOL_PARSERS.register("jamba")
class JambaToolParser(JsonListParser):
    markers = ("<tool_calls>",)
    end_marker = "</tool_calls>"
    needs_special_tokens = True  # vLLM's adjust_request: the markers are special tokens
    json_array = None

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        items = ",\n".join("    " + json_call(c) for c in calls)
        return f"<tool_calls>[\n{items}\n]</tool_calls>"
