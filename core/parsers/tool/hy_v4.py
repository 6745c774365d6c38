"""Tencent Hunyuan HYV4 tool calls (vLLM's ``hy_v4``; the shapes of tencent/Hy4-preview, whose
markers carry the ``:opensource`` suffix, in vLLM's tests).

Format: Hy3's (``hy_v3``) without ``<tool_sep>``: a call's name runs up to its first ``<arg_key>``
(or to ``</tool_call>`` for a call without arguments), and the pairs are written back to back:

    Sure!<tool_calls:opensource>
    <tool_call:opensource>get_weather<arg_key:opensource>city</arg_key:opensource><arg_value:opensource>Beijing</arg_value:opensource><arg_key:opensource>days</arg_key:opensource><arg_value:opensource>3</arg_value:opensource></tool_call:opensource>
    </tool_calls:opensource>

The suffix (none, ``:opensource``, or another the checkpoint chose) is read from the served
model's vocabulary, as vLLM does (``hy_v3.token_suffix``); values are typed as Hy3's are
(``hy_v3.hy_value``).

Where dyn's reading differs from vLLM's, besides those ``hy_v3`` lists: vLLM's unary path
rejects a malformed block as a whole (the whole output is then content, the text before the
block included), so a block cut off by ``max_tokens`` returns no call there while its streaming
path returns what was written; dyn reads every call as vLLM's streaming path does, a call
without a name being content (vLLM's streaming path emits a call named ``""``). Whitespace
between a key's end tag and its value's start tag is allowed, as vLLM's later tests expect (0.32
rejects the block in its unary path and misreads the value in its streaming path).
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.hy_v3 import HyToolParser, Markers
from dyn.core.parsers.tool.kv_arguments import value_text


@TOOL_PARSERS.register("hy_v4")
class HyV4ToolParser(HyToolParser):
    """HYV4: the name ends at the first ``<arg_key>`` (see the module)."""

    def _head(self, body: str, complete: bool) -> tuple[str, int] | None:
        at = body.find(self.markers.key)
        if at < 0:
            return (body.strip(), len(body)) if complete else None
        return body[:at].strip(), at

    @staticmethod
    def write(calls: Sequence[ToolCall], m: Markers) -> str:
        body = "".join(
            f"{m.call}{c.name}"
            + "".join(
                f"{m.key}{k}{m.key_end}{m.value}{value_text(v)}{m.value_end}" for k, v in c.args.items()
            )
            + m.call_end
            for c in calls
        )
        return f"{m.section}\n{body}\n{m.section_end}"
