"""What parsers emit: content text (a plain ``str``), reasoning text, and tool calls.

A choice's output becomes a sequence of events: ``str`` (content), ``Reasoning``,
``ToolCallStart`` (a call begins: its function name, maybe its id), ``ToolCallArgs`` (the next
piece of that call's arguments, JSON text) and ``TOOL_CALL_END`` (that call is complete). Calls
never interleave: a ``ToolCallStart`` follows the previous call's end. Joining every event of a
stream gives the same result however the text was split into pushes.
"""

from __future__ import annotations

from typing import NamedTuple


class Reasoning(NamedTuple):
    """Reasoning text (the ``reasoning_content`` of the response)."""

    text: str


class ToolCallStart(NamedTuple):
    """A tool call begins. ``id``: the model's own call id, when its format has one."""

    name: str
    id: str | None = None


class ToolCallArgs(NamedTuple):
    """The next piece of the current call's arguments (all pieces joined: one JSON object)."""

    text: str


class ToolCallEnd(NamedTuple):
    """The current call's arguments are complete."""


TOOL_CALL_END = ToolCallEnd()

Event = str | Reasoning | ToolCallStart | ToolCallArgs | ToolCallEnd
