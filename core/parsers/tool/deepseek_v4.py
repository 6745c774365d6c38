"""DeepSeek-V4 tool calls in DSML (vLLM's ``deepseek_v4``).

Format (vLLM's parser/deepseek_v4.py, from DeepSeek-V4's encoding): DeepSeek-V3.2's DSML
``invoke`` elements, in a ``tool_calls`` block instead of ``function_calls``; ``｜DSML｜`` uses
the full-width bar U+FF5C. The reasoning before it (``<think>`` ... ``</think>``) is the
reasoning parser's.

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="location" string="true">杭州</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

The invokes are read as ``deepseek_v32`` reads them (``string="true"``: the text; ``false``:
JSON; no attribute: typed by the tool's schema). The block's other spellings seen from the
model (``toolcalls``, ``tool``) open it too, as in vLLM.
"""

from __future__ import annotations

from dyn.core.parsers.tool import TOOL_PARSERS
from dyn.core.parsers.tool.deepseek_v32 import DSML, DeepSeekV32ToolParser

TOOL_CALLS_BEGIN = f"<{DSML}tool_calls>"
TOOL_CALLS_END = f"</{DSML}tool_calls>"


@TOOL_PARSERS.register("deepseek_v4")
class DeepSeekV4ToolParser(DeepSeekV32ToolParser):
    # (mypy takes DeepSeekV32ToolParser's one-marker tuples for the attributes' type)
    section_starts = (TOOL_CALLS_BEGIN, f"<{DSML}toolcalls>", f"<{DSML}tool>")  # type: ignore[assignment]
    section_ends = (TOOL_CALLS_END, f"</{DSML}toolcalls>", f"</{DSML}tool>")  # type: ignore[assignment]
    needs_special_tokens = True  # vLLM's parser engine keeps special tokens in the text
