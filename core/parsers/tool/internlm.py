"""InternLM2 / InternLM2.5 chat tool calls: after any content, ``<|action_start|><|plugin|>``,
then a JSON object with ``name`` and ``parameters`` (``arguments`` too), then ``<|action_end|>``
(all three markers are special tokens; InternLM/InternLM chat/chat_format.md):

    Sure, I will search for the weather of Shanghai.<|action_start|><|plugin|>
    {"name": "get_current_weather", "parameters": {"location": "Shanghai"}}<|action_end|>

``<|action_start|><|interpreter|>`` (code for the interpreter) is not a function call and stays
content. vLLM reads only the first call of an output; this parser reads each one.
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import CallBodyReader, DelimitedToolParser, json_call
from dyn.core.parsers.tool.json_list import CallObject


@TOOL_PARSERS.register("internlm")
class InternLMToolParser(DelimitedToolParser):
    call_start = "<|action_start|><|plugin|>"
    call_end = "<|action_end|>"
    needs_special_tokens = True  # vLLM's adjust_request: the markers are special tokens

    def body_reader(self) -> CallBodyReader:
        return CallObject()

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return "\n".join(f"{cls.call_start}\n{json_call(c, 'parameters')}{cls.call_end}" for c in calls)
