"""Tencent Hunyuan-A13B tool calls (vLLM's ``hunyuan_a13b``).

Format (the chat template of tencent/Hunyuan-A13B-Instruct and vLLM's parser): a JSON array of
``{"name", "arguments"}`` objects between ``<tool_calls>`` and ``</tool_calls>``, after any
content (the model's ``<think>`` and ``<answer>`` sections are the reasoning parser's):

    I'll check the weather.<tool_calls>[{"name": "get_weather", "arguments": {"city": "Beijing"}}]</tool_calls>

The array ends where its JSON does; ``</tool_calls>`` after it is dropped, and text after that
is content. An array that is not calls is content, markers included. (vLLM also drops a
``助手：`` the model may echo from the template, in its unary path only; this parser keeps it.)
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import json_call
from dyn.core.parsers.tool.json_list import JsonListParser


@TOOL_PARSERS.register("hunyuan_a13b")
class HunyuanA13BToolParser(JsonListParser):
    markers = ("<tool_calls>",)
    end_marker = "</tool_calls>"
    # vLLM asks for no change: the markers reach the text with special tokens skipped

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        items = ", ".join(json_call(c) for c in calls)
        return f"<tool_calls>[{items}]</tool_calls>"
