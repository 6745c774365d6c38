"""Poolside Laguna tool calls (vLLM's ``poolside_v1``): GLM's call format.

Format (Laguna's chat template, as vLLM's ``poolside_v1`` parser reads it): each call between
``<tool_call>`` and ``</tool_call>`` holds the function's name, then its arguments as key/value
pairs. The template writes past calls back to back; the model may also put each on its own line.
Text before the first call is content.

    Let me look at that file.<tool_call>read_file<arg_key>path</arg_key><arg_value>src/app.py</arg_value><arg_key>limit</arg_key><arg_value>200</arg_value></tool_call>

This is GLM-4.7's reading (``glm4_moe``), with two of vLLM's Poolside changes: a value whose
parameter the tool's schema types ``string`` is kept verbatim, whitespace included (code and file
bodies), where GLM trims it; the others are trimmed and read as JSON, then as a Python literal,
else kept as text. And the name is whatever stands before the first newline or ``<arg_key>``
(trimmed; it may hold spaces); a name followed by another tag is no call.

Differences from vLLM: text between and after calls is content (vLLM's unary reading keeps only
the text before the first call, its streaming all of it); a body that cannot be read is content
with its markers (vLLM drops it when another call was read).
"""

from __future__ import annotations

import re
from typing import Any

from dyn.core.parsers.tool import TOOL_PARSERS
from dyn.core.parsers.tool.glm4_moe import Glm47ToolParser
from dyn.core.parsers.tool.kv_arguments import parameter_schema, typed_value

_KEY = "<arg_key>"
_NAME_END = re.compile(r"\n|<")


@TOOL_PARSERS.register("poolside_v1")
class PoolsideV1ToolParser(Glm47ToolParser):
    """GLM-4.7's calls, written back to back, with verbatim string values (see the module)."""

    def member(self, pair: re.Match[str]) -> tuple[str, Any]:
        key, text = pair.group(1), pair.group(2)
        schema = parameter_schema(self.tools.get(self._name or ""), key)
        return key, text if schema.get("type") == "string" else typed_value(text.strip(), schema)

    def _read_name(self, body: str, complete: bool) -> tuple[str, int] | None:
        start = len(body) - len(body.lstrip())
        cut = _NAME_END.search(body, start)
        if cut is None:
            if not complete:
                return None
            end = len(body)
        elif cut.group() == "<" and not body.startswith(_KEY, cut.start()):
            if not complete and _KEY.startswith(body[cut.start() :]):
                return None  # maybe <arg_key>, not complete yet
            self._broken = True  # another tag right after the name
            return None
        else:
            end = cut.start()
        name = body[start:end].strip()
        if not name:
            self._broken = True
            return None
        return name, end
