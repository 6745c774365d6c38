"""StepFun Step-3 tool calls (vLLM's ``step3``): a section of calls, each a call type, the
separator, then the function as ``steptml`` XML (stepfun-ai/step3's chat template; every marker
in ``<｜...｜>``, with U+FF5C bars, is a special token):

    Let me help you.
    <｜tool_calls_begin｜>
    <｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="search">
    <steptml:parameter name="query">rust programming</steptml:parameter>
    <steptml:parameter name="limit">10</steptml:parameter>
    </steptml:invoke><｜tool_call_end｜>
    <｜tool_calls_end｜>
    Here are the results...

The call starts once ``<steptml:invoke name="...">`` is read (the ``function<｜tool_sep｜>`` before
it may be missing; a call of another type is no function call and stays content). Its arguments
go out one parameter at a time, each once its closing tag is read, and the object is closed by
the call's end marker. A value is the text between the tags, trimmed; when the tool's schema
lists the parameter it is typed as ``qwen3_coder`` types values (``convert_value``: integers,
numbers, booleans, null, JSON objects and arrays), otherwise it stays text, as vLLM's reading
does. Text before and after the section is content.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.kv_arguments import MemberCalls, value_text
from dyn.core.parsers.tool.qwen3_coder import convert_value
from dyn.core.parsers.tool.sectioned import SectionedToolParser

SECTION_BEGIN = "<｜tool_calls_begin｜>"
SECTION_END = "<｜tool_calls_end｜>"
CALL_BEGIN = "<｜tool_call_begin｜>"
CALL_END = "<｜tool_call_end｜>"
SEPARATOR = "<｜tool_sep｜>"

_HEAD = re.compile(r"\s*(?:([^<>]*?)\s*" + re.escape(SEPARATOR) + r')?\s*<steptml:invoke name="([^"<>]*)">')
_PARAMETER = re.compile(r'<steptml:parameter name="([^"<>]*)">(.*?)</steptml:parameter>', re.DOTALL)


@TOOL_PARSERS.register("step3")
class Step3ToolParser(MemberCalls, SectionedToolParser):
    section_starts = (SECTION_BEGIN,)
    section_ends = (SECTION_END,)
    call_start = CALL_BEGIN
    call_end = CALL_END
    needs_special_tokens = True  # vLLM's adjust_request: the markers are special tokens
    member_pattern = _PARAMETER

    def call_begin(self) -> None:
        super().call_begin()
        self._properties: Mapping[str, Any] = {}

    def call_head(self, body: str, complete: bool) -> tuple[str, int] | None:
        """Also keeps the named tool's parameter schemas, which type the values."""
        head = _HEAD.match(body)
        kind = head.group(1) if head is not None else None
        if head is None or not head.group(2).strip() or (kind is not None and kind != "function"):
            return None
        name = head.group(2).strip()
        tool = self.tools.get(name)
        properties = (tool.parameters or {}).get("properties") if tool is not None else None
        self._properties = properties if isinstance(properties, Mapping) else {}
        return name, head.end()

    def member(self, parameter: re.Match[str]) -> tuple[str, Any]:
        key, raw = parameter.group(1), parameter.group(2).strip()
        schema = self._properties.get(key)
        return key, raw if schema is None else convert_value(raw, schema)

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        def call(c: ToolCall) -> str:
            parameters = "".join(
                f'<steptml:parameter name="{k}">{value_text(v)}</steptml:parameter>\n'
                for k, v in c.args.items()
            )
            return (
                f'{CALL_BEGIN}function{SEPARATOR}<steptml:invoke name="{c.name}">\n'
                f"{parameters}</steptml:invoke>{CALL_END}"
            )

        return SECTION_BEGIN + "\n" + "\n".join(call(c) for c in calls) + "\n" + SECTION_END
