"""rednote-hilab dots tool calls (vLLM's ``dots``): the dots.llm models of Xiaohongshu's hi lab.

Format (vLLM's dots_tool_parser.py and SGLang's dots detector): calls sit in
``<dots_function_call>`` ... ``</dots_function_call>`` blocks (plain text, not special tokens),
each block a run of ``invoke`` elements whose parameters are elements holding their value as
text, or one JSON object with ``name`` and ``arguments`` (or ``parameters``):

    Let me look.<dots_function_call>
    <invoke name="search">
    <parameter name="query">weather in Shanghai</parameter>
    <parameter name="limit">3</parameter>
    </invoke>
    </dots_function_call>

    <dots_function_call>{"name": "search", "arguments": {"query": "tables"}}</dots_function_call>

A name is the text after ``name=``, its quotes (``"`` or ``'``) dropped. A call starts once its
``<invoke name=...>`` is read; its arguments stream one member per ``</parameter>`` and close at
``</invoke>``. A value is its text, trimmed, typed as ``qwen3_coder`` types values
(``convert_value``) by the type the tool's schema gives the parameter (following ``$ref`` into
``$defs``, and the first ``anyOf`` / ``oneOf`` / ``allOf`` branch that is not null, as vLLM
does): ``null`` is null, a parameter the schema does not list stays text. A JSON block streams
its arguments verbatim once the name is read (``json_list.CallObject``: an object whose
arguments are missing or no object is no call). A block that is neither is content, markers
included; text around the blocks is content.

Where dyn's reading differs from vLLM's: vLLM drops calls to a tool the request does not offer
(and with none left, returns the whole output as content), where they are read here as the other
parsers read them; a JSON call without arguments is content here (vLLM gives it ``{}``); a
boolean written ``1`` is false here (true in vLLM); an invoke the block closes without
``</invoke>`` ends there (vLLM drops it); the text after the blocks is content (vLLM's unary
path drops it and trims the text before them, its streaming path keeps both as they are).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dyn.core.parsers.events import Event
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import DelimitedToolParser
from dyn.core.parsers.tool.json_list import CallObject
from dyn.core.parsers.tool.kv_arguments import ArgumentsWriter, MemberCalls, value_text
from dyn.core.parsers.tool.qwen3_coder import convert_value

BLOCK_START = "<dots_function_call>"
BLOCK_END = "</dots_function_call>"
INVOKE = "<invoke"
INVOKE_END = "</invoke>"

_INVOKE = re.compile(r"\s*<invoke\s+name\s*=\s*([^>]+)>")
_PARAMETER = re.compile(r"<parameter\s+name\s*=\s*([^>]+)>(.*?)</parameter>", re.DOTALL)
_MAX_REF_DEPTH = 10


def _unquoted(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def parameter_type(schema: Any, defs: Mapping[str, Any], depth: int = 0) -> Any:
    """The ``type`` a parameter's schema gives it, ``$ref`` and ``anyOf`` / ``oneOf`` / ``allOf``
    followed (a null branch skipped); ``None`` when it gives none."""
    if not isinstance(schema, Mapping) or depth > _MAX_REF_DEPTH:
        return None
    if "type" in schema:
        return schema["type"]
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return parameter_type(defs.get(ref.rsplit("/", 1)[-1]), defs, depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(key) or ():
            if isinstance(branch, Mapping) and branch.get("type") != "null":
                kind = parameter_type(branch, defs, depth + 1)
                if kind is not None:
                    return kind
    return None


@TOOL_PARSERS.register("dots")
class DotsToolParser(MemberCalls, DelimitedToolParser):
    call_start = BLOCK_START
    call_end = BLOCK_END
    # plain-text markers: vLLM asks for no change to the detokenisation

    def call_begin(self) -> None:
        super().call_begin()
        self._json: CallObject | None = None
        self._xml = False
        self._invokes = 0

    def call_events(self, body: str, *, complete: bool, final: bool) -> list[Event]:
        if self._json is None and not self._xml:
            lead = body.lstrip()
            if lead.startswith("{"):
                self._json = CallObject()
            elif lead.startswith(INVOKE):
                self._xml = True
            elif complete or final or not INVOKE.startswith(lead):
                return self.unreadable(body, complete, final)
            else:
                return []
        if self._json is not None:
            got = self._json.events(body, complete, final)
            return [self.raw_call(body, complete)] if got is None else got
        events: list[Event] = []
        while True:
            if self._name is None:
                head = _INVOKE.match(body, self._pos)
                if head is None:
                    break
                self.start_call(events, _unquoted(head.group(1)), head.end())
                self._invokes += 1
            end = body.find(INVOKE_END, self._pos)
            self.add_members(events, body if end < 0 else body[:end], _PARAMETER, self._parameter)
            if end < 0:
                break
            self.end_call(events)
            self._name, self._pos, self._args = None, end + len(INVOKE_END), ArgumentsWriter()
        if not self._invokes:
            return self.unreadable(body, complete, final)
        if complete and self._name is not None:
            self.end_call(events)
        return events

    def _parameter(self, parameter: re.Match[str]) -> tuple[str, Any]:
        key = _unquoted(parameter.group(1))
        tool = self.tools.get(self._name or "")
        schema: Mapping[str, Any] = tool.parameters if tool is not None else {}
        properties, defs = schema.get("properties"), schema.get("$defs")
        if not isinstance(properties, Mapping) or key not in properties:
            return key, convert_value(parameter.group(2).strip(), None)
        kind = parameter_type(properties[key], defs if isinstance(defs, Mapping) else {})
        return key, convert_value(parameter.group(2).strip(), {"type": kind or "string"})

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        invokes = "".join(
            f'<invoke name="{c.name}">\n'
            + "".join(f'<parameter name="{k}">{value_text(v)}</parameter>\n' for k, v in c.args.items())
            + f"{INVOKE_END}\n"
            for c in calls
        )
        return f"{BLOCK_START}\n{invokes}{BLOCK_END}"
