"""DeepSeek-V3.2 tool calls in DSML (vLLM's ``deepseek_v32``, Dynamo's ``deepseek_v3_2``).

Format (DeepSeek-V3.2's ``encoding/encoding_dsv32.py``; the example in vLLM's
``deepseekv32_tool_parser.py``): a ``function_calls`` block of ``invoke`` elements, each
parameter an element whose ``string`` attribute says whether its text is the string itself
(``true``) or JSON (``false``). ``｜DSML｜`` uses the full-width bar U+FF5C.

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="location" string="true">杭州</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

The call starts once the invoke's name is read; the arguments object goes out one member per
complete parameter and is closed by the invoke's end.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.kv_arguments import MemberCalls, parameter_schema, typed_value, value_text
from dyn.core.parsers.tool.sectioned import SectionedToolParser

DSML = "\uff5cDSML\uff5c"
CALLS_BEGIN = f"<{DSML}function_calls>"
CALLS_END = f"</{DSML}function_calls>"
INVOKE = f"<{DSML}invoke"
INVOKE_END = f"</{DSML}invoke>"

_HEAD = re.compile(r'\s+name="([^"<>]+)"\s*>')
_PARAMETER = re.compile(
    rf'<{DSML}parameter\s+name="([^"<>]+)"(?:\s+string="(true|false)")?\s*>(.*?)</{DSML}parameter>', re.DOTALL
)


@TOOL_PARSERS.register("deepseek_v32", "deepseek_v3_2")
class DeepSeekV32ToolParser(MemberCalls, SectionedToolParser):
    section_starts = (CALLS_BEGIN,)
    section_ends = (CALLS_END,)
    call_start = INVOKE
    call_end = INVOKE_END
    needs_special_tokens = False  # DSML is plain text; vLLM asks for no change
    member_pattern = _PARAMETER
    """An invoke's parameter element: name, ``string`` attribute, value."""
    parameter_tags = (f"<{DSML}parameter", f"</{DSML}parameter>")
    """How ``render`` opens and closes a parameter element."""

    def call_head(self, body: str, complete: bool) -> tuple[str, int] | None:
        head = _HEAD.match(body)
        return None if head is None else (head.group(1), head.end())

    def member(self, parameter: re.Match[str]) -> tuple[str, Any]:
        key, is_string, text = parameter.groups()
        if is_string == "true":
            return key, text
        schema = parameter_schema(self.tools.get(self._name or ""), key) if is_string is None else {}
        return key, typed_value(text.strip(), schema)

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        opens, closes = cls.parameter_tags

        def parameter(key: str, value: object) -> str:
            string = "true" if isinstance(value, str) else "false"
            return f'{opens} name="{key}" string="{string}">{value_text(value)}{closes}'

        invokes = "\n".join(
            f'{cls.call_start} name="{c.name}">\n'
            + "\n".join(parameter(k, v) for k, v in c.args.items())
            + f"\n{cls.call_end}"
            for c in calls
        )
        return f"{cls.section_starts[0]}\n{invokes}\n{cls.section_ends[0]}"
