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

from dyn.core.parsers.tool import TOOL_PARSERS
from dyn.core.parsers.tool.qwen3_coder import FunctionReader, Qwen3CoderToolParser


class VerbatimFunctionReader(FunctionReader):
    """``FunctionReader`` whose values are the text between the tags, untrimmed."""

    def value_text(self, raw: str) -> str:
        return raw


@TOOL_PARSERS.register("mimo")
class MiMoToolParser(Qwen3CoderToolParser):
    needs_special_tokens = True  # vLLM's adjust_request (its parser engine keeps special tokens)
    parameter_format = "<parameter={name}>{text}</parameter>\n"

    def call_begin(self) -> None:
        self._functions = VerbatimFunctionReader(self.tools)
