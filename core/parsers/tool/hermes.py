"""Hermes-style tool calls: Hermes 2/3 (NousResearch), Qwen2.5 and Qwen3 instruct models (vLLM's
``hermes``, and ``qwen3_json``, which vLLM 0.32 maps to the same parser).

Format (the Hermes function-calling template; Qwen2.5's and Qwen3's ``tokenizer_config.json``
chat templates write the same): each call is a JSON object with ``name`` and ``arguments`` on its
own line between ``<tool_call>`` and ``</tool_call>``; text before the first call is content.

    I'll check.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import CallBodyReader, DelimitedToolParser, JsonCallBody, json_call


@TOOL_PARSERS.register("hermes", "qwen25", "qwen3", "qwen3_json")
class HermesToolParser(DelimitedToolParser):
    call_start = "<tool_call>"
    call_end = "</tool_call>"
    needs_special_tokens = True  # Hermes 2 Pro's <tool_call> is a special token

    def body_reader(self) -> CallBodyReader:
        return JsonCallBody()

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return "\n".join(f"{cls.call_start}\n{json_call(c)}\n{cls.call_end}" for c in calls)
