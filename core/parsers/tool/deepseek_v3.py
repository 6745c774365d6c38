"""DeepSeek-V3 / DeepSeek-R1-0528 tool calls (vLLM's and Dynamo's ``deepseek_v3``).

Format (DeepSeek-V3's ``tokenizer_config.json`` chat template; the markers use the full-width
bar ``｜`` U+FF5C and ``▁`` U+2581): a section of calls, each a type (``function``), the
function's name on the separator's line and its arguments in a JSON code block; text before
the section is content.

    Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

The call starts once its name and the arguments' ``{`` are read; the arguments are the model's
JSON, verbatim. The body reader also takes DeepSeek-V3.1's shape (``NAME<｜tool▁sep｜>{...}``),
as vLLM's newer parsers do, since the same checkpoints family writes both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import CallBodyReader
from dyn.core.parsers.tool.sectioned import CallHead, JsonArgsBody, SectionedToolParser

CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
SEP = "<\uff5ctool\u2581sep\uff5c>"

_V3_HEAD = re.compile(
    r"\s*[^<\n]*?" + re.escape(SEP) + r"[ \t]*([^\s{<]+)[ \t]*\n\s*(?:```(?:json)?[ \t]*\n\s*)?(?=\{)"
)
_V31_HEAD = re.compile(r"\s*([^\s{<]+)\s*" + re.escape(SEP) + r"\s*(?=\{)")


def read_deepseek_head(body: str, complete: bool = False) -> CallHead | None:
    """The head of a DeepSeek call body, V3 shape (``TYPE<sep>NAME\\n```json\\n{``) or V3.1
    shape (``NAME<sep>{``); ``None`` until the arguments' ``{`` is there."""
    match = _V3_HEAD.match(body) or _V31_HEAD.match(body)
    if match is None:
        return None
    return CallHead(match.group(1), None, match.end())


class DeepSeekToolParser(SectionedToolParser):
    """The DeepSeek call section; subclasses differ in how they write calls (``render``)."""

    section_starts = (CALLS_BEGIN,)
    section_ends = (CALLS_END,)
    call_start = CALL_BEGIN
    call_end = CALL_END
    # DeepSeek's tool markers are added tokens that are not special: vLLM asks for no change

    def body_reader(self) -> CallBodyReader:
        return JsonArgsBody(read_deepseek_head)


@TOOL_PARSERS.register("deepseek_v3")
class DeepSeekV3ToolParser(DeepSeekToolParser):
    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        body = "\n".join(
            f"{CALL_BEGIN}function{SEP}{c.name}\n```json\n{c.arguments}\n```{CALL_END}" for c in calls
        )
        return f"{CALLS_BEGIN}{body}{CALLS_END}"
