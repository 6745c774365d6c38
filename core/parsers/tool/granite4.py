"""IBM Granite 4.0 tool calls (vLLM's ``granite4``).

Format (the chat template of ibm-granite/granite-4.0-h-small and its siblings): each call is a
JSON object with ``name`` and ``arguments`` between ``<tool_call>`` and ``</tool_call>``,
Hermes-style; text around the calls is content.

    I'll look that up.<tool_call>
    {"name": "get_current_weather", "arguments": {"city": "Boston"}}
    </tool_call>

Unlike Granite 3 (``granite``: one JSON array after the marker), each call has its own pair of
markers. vLLM keeps special tokens in the text, as some Granite 4 tokenizers mark
``<tool_call>`` special.
"""

from __future__ import annotations

from dyn.core.parsers.tool import TOOL_PARSERS
from dyn.core.parsers.tool.hermes import HermesToolParser


@TOOL_PARSERS.register("granite4")
class Granite4ToolParser(HermesToolParser):
    needs_special_tokens = True  # vLLM's adjust_request keeps <tool_call> when tools are offered
