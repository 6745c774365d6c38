"""GLM-4.5 / GLM-4.6 (vLLM's ``glm45``) and GLM-4.7 (vLLM's and Dynamo's ``glm47``) tool calls.

Format (the models' chat templates, zai-org/GLM-4.5 and GLM-4.7 ``chat_template.jinja``): each
call between ``<tool_call>`` and ``</tool_call>`` holds the function's name, then its
arguments as key/value pairs; GLM-4.5 puts each on its own line, GLM-4.7 writes them back to
back. Text before the first call is content.

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

Values are typed by the tool's parameter schema as vLLM does (``kv_arguments.typed_value``:
a ``string`` parameter keeps its text, the rest is read as JSON or a Python literal). The
call starts once its name is read (a newline or the first ``<arg_key>`` ends it); the
arguments object goes out one member per complete key/value pair and is closed by the call's
end, so the joined pieces are the unary result.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from dyn.core.parsers.text import find_first
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import DelimitedToolParser
from dyn.core.parsers.tool.kv_arguments import MemberCalls, parameter_schema, typed_value, value_text

_PAIR = re.compile(r"<arg_key>\s*([^<]*?)\s*</arg_key>(?:\\n|\s)*<arg_value>(.*?)</arg_value>", re.DOTALL)
_NAME = re.compile(r"[\w.:\-]+")
_NAME_ENDS = ("\n", "<arg_key>")


class GlmToolParser(MemberCalls, DelimitedToolParser):
    """The GLM call format; subclasses differ in how they write calls (``render_newline``)."""

    call_start = "<tool_call>"
    call_end = "</tool_call>"
    needs_special_tokens = True  # vLLM keeps <tool_call> in the text (skip_special_tokens=False)
    member_pattern = _PAIR

    def call_begin(self) -> None:
        super().call_begin()
        self._broken = False

    def call_head(self, body: str, complete: bool) -> tuple[str, int] | None:
        return None if self._broken else self._read_name(body, complete)

    def member(self, pair: re.Match[str]) -> tuple[str, Any]:
        key = pair.group(1)
        return key, typed_value(
            pair.group(2).strip(), parameter_schema(self.tools.get(self._name or ""), key)
        )

    def _read_name(self, body: str, complete: bool) -> tuple[str, int] | None:
        """(the name, where the arguments start): the name ends at a newline or the first
        ``<arg_key>``; None while it is not written, and for good (``_broken``: the call stays
        content) when it is no name."""
        start = len(body) - len(body.lstrip())
        cut = find_first(body, _NAME_ENDS, start)
        if cut is None and not complete:
            return None
        end = len(body) if cut is None else cut[0]
        name = body[start:end].strip()
        if not _NAME.fullmatch(name):
            self._broken = True
            return None
        return name, end

    render_newline: ClassVar[str] = "\n"
    """What ``render`` writes after the name, each key and each value, and between calls."""

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        nl = cls.render_newline
        return nl.join(
            f"<tool_call>{c.name}{nl}"
            + "".join(
                f"<arg_key>{k}</arg_key>{nl}<arg_value>{value_text(v)}</arg_value>{nl}"
                for k, v in c.args.items()
            )
            + "</tool_call>"
            for c in calls
        )


@TOOL_PARSERS.register("glm45")
class Glm45ToolParser(GlmToolParser):
    """GLM-4.5/4.6: calls written with a newline after the name, each key and each value."""


@TOOL_PARSERS.register("glm47", "ling3")
class Glm47ToolParser(GlmToolParser):
    """GLM-4.7: calls written without newlines. Also inclusionAI's Ling 3 (vLLM's ``ling3``, whose
    parser is vLLM's GLM-4.7 one: the same calls)."""

    render_newline = ""
