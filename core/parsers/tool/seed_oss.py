"""ByteDance Seed-OSS tool calls (vLLM's ``seed_oss``).

Format (the chat template of ByteDance-Seed/Seed-OSS-36B-Instruct; vLLM reads it with its Qwen3
XML grammar): Qwen3-Coder's XML parameters inside ``<seed:tool_call>`` ...
``</seed:tool_call>`` (single tokens of the Seed-OSS tokenizer); text before a call is
content (the reasoning before it, ``<seed:think>`` ... ``</seed:think>``, is the reasoning
parser's).

    <seed:tool_call>
    <function=get_weather>
    <parameter=location>San Francisco, CA</parameter>
    <parameter=unit>celsius</parameter>
    </function>
    </seed:tool_call>

The body is read as ``qwen3_coder`` reads it (values typed by the tool's schema, one newline
trimmed at each end of a value).
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.kv_arguments import value_text
from dyn.core.parsers.tool.qwen3_coder import Qwen3CoderToolParser


@TOOL_PARSERS.register("seed_oss")
class SeedOssToolParser(Qwen3CoderToolParser):
    call_start = "<seed:tool_call>"
    call_end = "</seed:tool_call>"
    needs_special_tokens = True  # vLLM's parser engine keeps <seed:tool_call> in the text

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return "\n".join(
            f"{cls.call_start}\n<function={c.name}>\n"
            + "".join(f"<parameter={k}>{value_text(v)}</parameter>\n" for k, v in c.args.items())
            + f"</function>\n{cls.call_end}"
            for c in calls
        )
