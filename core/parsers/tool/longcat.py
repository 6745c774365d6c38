"""LongCat-Flash tool calls (vLLM's ``longcat``): Hermes-style JSON calls between LongCat's own
markers (meituan-longcat/LongCat-Flash-Chat, its chat template and tokenizer, whose
``<longcat_tool_call>`` and ``</longcat_tool_call>`` are added tokens):

    Let me check the weather for you.
    <longcat_tool_call>
    {"name": "get_weather", "arguments": {"city": "Tokyo"}}
    </longcat_tool_call>

Each call is one JSON object with ``name`` and ``arguments``, read as the ``hermes`` parser reads
it (the arguments stream verbatim); text before, between and after calls is content.
"""

from __future__ import annotations

from dyn.core.parsers.tool import TOOL_PARSERS
from dyn.core.parsers.tool.hermes import HermesToolParser


@TOOL_PARSERS.register("longcat")
class LongCatToolParser(HermesToolParser):
    call_start = "<longcat_tool_call>"
    call_end = "</longcat_tool_call>"
    needs_special_tokens = True  # vLLM's adjust_request (the parser it derives from Hermes')
