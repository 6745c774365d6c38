"""PLaMo 3 tool calls (vLLM's ``plamo3``, parser/plamo3.py), by Preferred Networks.

Format: every marker is ``<|plamo:...:plamo|>``, written with several special tokens. Calls sit
in a ``tool_requests`` section; each ``tool_request`` holds the function's name, then its
arguments as a JSON object after the ``json`` constraint marker (one line in the output,
wrapped here):

    Checking the weather.<|plamo:begin_tool_requests:plamo|><|plamo:begin_tool_request:plamo|>
    <|plamo:begin_tool_name:plamo|>get_weather<|plamo:end_tool_name:plamo|>
    <|plamo:begin_tool_arguments:plamo|><|plamo:constrain|>json<|plamo:msg|>{"city": "Tokyo"}
    <|plamo:end_tool_arguments:plamo|><|plamo:end_tool_request:plamo|>
    <|plamo:end_tool_requests:plamo|><|plamo:tag|>

The call starts once its name and the arguments marker are read; the arguments' JSON streams
verbatim up to its closing brace, so a call whose closing markers were cut off (``max_tokens``)
is complete once its object is. A marker cut off at the very end of the output (the model
stopped inside one of its multi-token markers) is dropped, as vLLM drops it. The reasoning
(``<|plamo:begin_think:plamo|>`` ... ``<|plamo:end_think:plamo|>``) is the ``plamo3``
reasoning parser's.

Differs from vLLM: a request written outside a section is still read as a call; a call whose
name or arguments were cut off is content (vLLM makes a call of what it had).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dyn.core.parsers.events import Event
from dyn.core.parsers.tool import TOOL_PARSERS, ToolCall
from dyn.core.parsers.tool.delimited import CallBodyReader
from dyn.core.parsers.tool.sectioned import CallHead, JsonArgsBody, SectionedToolParser

BEGIN_TOOL_REQUESTS = "<|plamo:begin_tool_requests:plamo|>"
END_TOOL_REQUESTS = "<|plamo:end_tool_requests:plamo|>"
BEGIN_TOOL_REQUEST = "<|plamo:begin_tool_request:plamo|>"
END_TOOL_REQUEST = "<|plamo:end_tool_request:plamo|>"
BEGIN_TOOL_NAME = "<|plamo:begin_tool_name:plamo|>"
END_TOOL_NAME = "<|plamo:end_tool_name:plamo|>"
BEGIN_TOOL_ARGUMENTS = "<|plamo:begin_tool_arguments:plamo|><|plamo:constrain|>json<|plamo:msg|>"
END_TOOL_ARGUMENTS = "<|plamo:end_tool_arguments:plamo|>"
BEGIN_THINK = "<|plamo:begin_think:plamo|>"
END_THINK = "<|plamo:end_think:plamo|>"
EOT = "<|plamo:tag|>"
"""The end of a turn (normally the stop token)."""

MARKERS = (
    BEGIN_TOOL_REQUESTS,
    END_TOOL_REQUESTS,
    BEGIN_TOOL_REQUEST,
    END_TOOL_REQUEST,
    BEGIN_TOOL_NAME,
    END_TOOL_NAME,
    BEGIN_TOOL_ARGUMENTS,
    END_TOOL_ARGUMENTS,
    BEGIN_THINK,
    END_THINK,
    EOT,
)
_PREFIX = "<|plamo:"

_HEAD = re.compile(
    r"\s*" + re.escape(BEGIN_TOOL_NAME) + r"\s*([^<>\s]+)\s*" + re.escape(END_TOOL_NAME) + r"\s*"
    + re.escape(BEGIN_TOOL_ARGUMENTS) + r"\s*(?=\{)"
)  # fmt: skip


def cut_marker(text: str) -> int:
    """Length of the end of ``text`` that is a PLaMo marker cut off (it starts with ``<|plamo:``
    and is the beginning of a marker), 0 when there is none."""
    at = text.rfind(_PREFIX)
    if at < 0:
        return 0
    tail = text[at:]
    return len(tail) if any(len(m) > len(tail) and m.startswith(tail) for m in MARKERS) else 0


@TOOL_PARSERS.register("plamo3")
class Plamo3ToolParser(SectionedToolParser):
    section_starts = (BEGIN_TOOL_REQUESTS,)
    section_ends = (END_TOOL_REQUESTS,)
    call_start = BEGIN_TOOL_REQUEST
    call_end = END_TOOL_REQUEST
    needs_special_tokens = True  # the markers' pieces are special tokens

    def body_reader(self) -> CallBodyReader:
        return JsonArgsBody(_read_head)

    def finish(self) -> list[Event]:
        events = super().finish()
        if events and isinstance(last := events[-1], str) and (cut := cut_marker(last)):
            events[-1] = last[:-cut]
            if not events[-1]:
                events.pop()
        return events

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        requests = "".join(
            f"{BEGIN_TOOL_REQUEST}{BEGIN_TOOL_NAME}{c.name}{END_TOOL_NAME}"
            f"{BEGIN_TOOL_ARGUMENTS}{c.arguments}{END_TOOL_ARGUMENTS}{END_TOOL_REQUEST}"
            for c in calls
        )
        return f"{BEGIN_TOOL_REQUESTS}{requests}{END_TOOL_REQUESTS}"


def _read_head(body: str, complete: bool) -> CallHead | None:
    match = _HEAD.match(body)
    return None if match is None else CallHead(match.group(1), None, match.end())
