"""DeepSeek-V3.1 tool calls (vLLM's ``deepseek_v31``, Dynamo's ``deepseek_v3_1``).

Format (DeepSeek-V3.1's model card, "ToolCall" section, and its chat template): the V3 call
section without the type and the code block: the function's name, the separator, then the
arguments' JSON.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>

(one line in the output; wrapped here).

Read by the DeepSeek body reader of ``deepseek_v3`` (which takes both shapes).
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.deepseek_v3 import (
    CALL_BEGIN,
    CALL_END,
    CALLS_BEGIN,
    CALLS_END,
    SEP,
    DeepSeekToolParser,
)


@TOOL_PARSERS.register("deepseek_v31", "deepseek_v3_1")
class DeepSeekV31ToolParser(DeepSeekToolParser):
    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        body = "".join(f"{CALL_BEGIN}{c.name}{SEP}{c.arguments}{CALL_END}" for c in calls)
        return f"{CALLS_BEGIN}{body}{CALLS_END}"
