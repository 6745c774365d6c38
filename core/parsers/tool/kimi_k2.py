"""Kimi K2 tool calls (vLLM's and Dynamo's ``kimi_k2``): Kimi-K2-Instruct, K2-Thinking, K2.5.

Format (MoonshotAI/Kimi-K2 docs/tool_call_guidance.md, "Manually Parsing Tool Calls", and the
model's chat template): a section of calls; each call is the model's call id
``functions.NAME:IDX``, the argument marker, then the arguments' JSON.

    I'll check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Beijing"}<|tool_call_end|><|tool_calls_section_end|>

(one line in the output; wrapped here).

The call id is the model's own (``ToolCallStart.id``), so a later turn can refer to it. Ids
without the ``functions.`` prefix (``get_weather:0``) are read too; K2.5's bare counters
(``0``) name the request's only tool, or the one tool whose parameters hold every argument
(then the call is read once complete), as vLLM does. Both spellings of the section markers
(``tool_calls_section`` and ``tool_call_section``) are accepted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import CallBodyReader
from dyn.core.parsers.tool.sectioned import CallHead, JsonArgsBody, SectionedToolParser

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"
ARGUMENTS = "<|tool_call_argument_begin|>"

_HEAD = re.compile(r"\s*([^\s<|]+?)\s*" + re.escape(ARGUMENTS) + r"\s*(?=\{)")
_CALL_ID = re.compile(r"(?:[^:]*\.)?([^.:]+):\d+")


@TOOL_PARSERS.register("kimi_k2")
class KimiK2ToolParser(SectionedToolParser):
    section_starts = (SECTION_BEGIN, "<|tool_call_section_begin|>")
    section_ends = (SECTION_END, "<|tool_call_section_end|>")
    call_start = CALL_BEGIN
    call_end = CALL_END
    needs_special_tokens = True  # the section and call markers are special tokens

    def body_reader(self) -> CallBodyReader:
        return JsonArgsBody(self._read_head)

    def _read_head(self, body: str, complete: bool) -> CallHead | None:
        match = _HEAD.match(body)
        if match is None:
            return None
        call_id = match.group(1)
        named = _CALL_ID.fullmatch(call_id)
        if named is not None:
            return CallHead(named.group(1), call_id, match.end())
        if not call_id.isdigit():
            return None
        name = self._tool_for_counter(body[match.end() :] if complete else None)
        return None if name is None else CallHead(name, call_id, match.end())

    def _tool_for_counter(self, arguments: str | None) -> str | None:
        """The tool a bare counter id stands for: the only tool offered, else (``arguments``
        given: the call is complete) the one tool whose parameters hold every argument."""
        if len(self.tools) == 1:
            return next(iter(self.tools))
        if arguments is None:
            return None
        try:
            args = json.loads(arguments)
        except ValueError:
            return None
        if not isinstance(args, dict) or not args:
            return None
        fits = [
            t.name
            for t in self.tools.values()
            if set(args) <= set((t.parameters or {}).get("properties") or {})
        ]
        return fits[0] if len(fits) == 1 else None

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        parts = []
        for index, call in enumerate(calls):
            call_id = call.id if call.id and _CALL_ID.fullmatch(call.id) else f"functions.{call.name}:{index}"
            parts.append(f"{CALL_BEGIN}{call_id}{ARGUMENTS}{call.arguments}{CALL_END}")
        return f"{SECTION_BEGIN}{''.join(parts)}{SECTION_END}"
