"""Xiaomi MiMo tool calls (vLLM's ``mimo``: MiMo-V2-Flash, MiMo-V2.5): the Qwen3-Coder XML
grammar (``qwen3_coder``), each parameter written compactly on one line and its value verbatim
(XiaomiMiMo/MiMo-V2-Flash's chat template; vLLM's parser/mimo.py):

    Let me execute that command for you.
    <tool_call>
    <function=execute_bash>
    <parameter=command>pwd && ls</parameter>
    </function>
    </tool_call>

Unlike Qwen3-Coder's, a value keeps the newlines at its ends (Qwen3-Coder's template puts one
around each value, MiMo's does not, so a trailing newline is part of the value). Values are typed
by the tool's schema as ``qwen3_coder`` types them (``convert_value``); without a schema they are
text. Calls, arguments streamed a parameter at a time, cut-off and unreadable calls: as
``qwen3_coder``.
"""

from __future__ import annotations

import json

from dyn.core.parsers.events import Event, ToolCallArgs
from dyn.core.parsers.text import find_first
from dyn.core.parsers.tool import TOOL_PARSERS
from dyn.core.parsers.tool.qwen3_coder import FunctionReader, Qwen3CoderToolParser, convert_value

_FUNCTION_END, _PARAMETER, _PARAMETER_END = "</function>", "<parameter=", "</parameter>"


class VerbatimFunctionReader(FunctionReader):
    """``FunctionReader`` whose values are the text between the tags, untrimmed."""

    def _read_value(self, param: tuple[str, int], body: str, complete: bool, events: list[Event]) -> bool:
        name, start = param
        hit = find_first(body, (_PARAMETER_END, _PARAMETER, _FUNCTION_END), start)
        if hit is None:
            if not complete:
                return False
            end = after = len(body)
        else:
            end, marker = hit
            after = end + len(marker) if marker == _PARAMETER_END else end
        value = convert_value(body[start:end], self._properties.get(name))
        piece = json.dumps(name, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)
        events.append(ToolCallArgs((", " if self._sent_any else "{") + piece))
        self._sent_any = True
        self._param = None
        self._pos = after
        return True


@TOOL_PARSERS.register("mimo")
class MiMoToolParser(Qwen3CoderToolParser):
    needs_special_tokens = True  # vLLM's adjust_request (its parser engine keeps special tokens)
    parameter_format = "<parameter={name}>{text}</parameter>\n"

    def call_begin(self) -> None:
        self._functions = VerbatimFunctionReader(self.tools)
