"""DeepSeek-V4.1 tool calls in spaced DSML (vLLM's ``deepseek_v41``).

Format (vLLM's parser/deepseek_v41.py): DeepSeek-V4's DSML block with a space after the
``｜DSML｜`` tag (full-width bars, U+FF5C) of every element and the block named ``calls``
instead of ``tool_calls``:

    Checking.

    <｜DSML｜ calls>
    <｜DSML｜ invoke name="get_weather">
    <｜DSML｜ parameter name="city" string="true">杭州</｜DSML｜ parameter>
    <｜DSML｜ parameter name="count" string="false">42</｜DSML｜ parameter>
    </｜DSML｜ invoke>
    </｜DSML｜ calls>

The invokes are read as ``deepseek_v32`` reads its own (``string="true"``: the text;
``"false"``: JSON, else the text; no attribute: typed by the tool's schema). V4's unspaced
elements are no V4.1 calls (vLLM's V4.1 grammar replaces them) and stay content. The reasoning
before the block is the ``deepseek_v41`` reasoning parser's.

Differs from vLLM: text after the block is content (vLLM drops it: a call ends the turn), and a
value without the ``string`` attribute is typed by the schema where vLLM reads it as JSON.
"""

from __future__ import annotations

import re

from dyn.core.parsers.tool import TOOL_PARSERS
from dyn.core.parsers.tool.deepseek_v32 import DSML, DeepSeekV32ToolParser

CALLS_BEGIN = f"<{DSML} calls>"
CALLS_END = f"</{DSML} calls>"
INVOKE = f"<{DSML} invoke"
INVOKE_END = f"</{DSML} invoke>"
PARAMETER = f"<{DSML} parameter"
PARAMETER_END = f"</{DSML} parameter>"

_PARAMETER = re.compile(
    rf'{PARAMETER}\s+name="([^"<>]+)"(?:\s+string="(true|false)")?\s*>(.*?){PARAMETER_END}', re.DOTALL
)


@TOOL_PARSERS.register("deepseek_v41")
class DeepSeekV41ToolParser(DeepSeekV32ToolParser):
    section_starts = (CALLS_BEGIN,)
    section_ends = (CALLS_END,)
    call_start = INVOKE
    call_end = INVOKE_END
    needs_special_tokens = True  # vLLM's parser engine keeps special tokens in the text
    member_pattern = _PARAMETER
    parameter_tags = (PARAMETER, PARAMETER_END)
