"""MuseGlimmer tool calls (vLLM's ``muse_glimmer``): ATEM markup in messages addressed to a tool.

Format (the model's chat template and tool prompt, as vLLM's ``muse_glimmer`` parser reads
them; the messages are ``dyn.core.parsers.muse_glimmer``'s): the model reasons in a message to
``self``, then writes each call in a message to the tool, an ``<atem:function_calls>`` block of
``<atem:invoke>`` elements whose parameters are elements too; it answers in a message to ``user``.

     to=self<|message|>I should check the forecast first.<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>
    <atem:invoke name="get_weather">
    <atem:parameter name="city">Paris</atem:parameter>
    <atem:parameter name="days">3</atem:parameter>
    </atem:invoke>
    </atem:function_calls><|eom|>

The reasoning is emitted too (``emits_reasoning``: this parser stands in for the ``muse_glimmer``
reasoning parser): messages to ``self`` are reasoning (several joined with a newline), those to
``user`` or to no one content; only messages to a tool are read for calls, so markup the model
quotes in its reasoning or answer is no call. A value is read as JSON, else kept as text
(``3`` is a number, ``Paris`` text), whatever the tool's schema says, as vLLM and the model's
own response schema read it. A name the template doubles for a tool registered without a
namespace (``get_weather.get_weather``) is the tool's name, as in vLLM. An output without any
header (the framing stripped) is read as one tool message.

A call starts once its invoke's name is read; its arguments go out one parameter at a time as
each closes, and ``</atem:invoke>`` (or the end of the message) ends it. Differences from vLLM,
which reads only complete invokes and drops the rest of a tool message: text in a tool message
outside the block (a call written as JSON, say) and an invoke without a name are content, markers
included; a call cut off by the end of the stream is reported as cut off; in an output without a
header, only the text around the block is content (vLLM keeps all of it); a reasoning message the
model leaves without ``<|eom|>`` ends at the next header (vLLM's unary reading runs it on into the
tool message and loses the call).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from dyn.core.parsers.events import Event, Reasoning
from dyn.core.parsers.muse_glimmer import (
    EOM,
    REASONING_RECIPIENT,
    START,
    Begin,
    End,
    MessageEvent,
    MessageReader,
    Plain,
    Text,
    is_tool,
)
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall, ToolParser
from dyn.core.parsers.tool.kv_arguments import MemberCalls, value_text
from dyn.core.parsers.tool.sectioned import SectionedToolParser

BLOCK_START = "<atem:function_calls>"
BLOCK_END = "</atem:function_calls>"
INVOKE = "<atem:invoke"
INVOKE_END = "</atem:invoke>"

_HEAD = re.compile(r'\s[^>]*?\bname="([^"]+)"[^>]*>')
_PARAMETER = re.compile(r'<atem:parameter\b[^>]*?\bname="([^"]+)"[^>]*>(.*?)</atem:parameter>', re.DOTALL)


def _no_constant(name: str) -> Any:
    raise ValueError(name)  # NaN and Infinity are no JSON values


def atem_value(text: str) -> Any:
    """A parameter's value: the JSON value ``text`` spells, else the text itself."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return text


class AtemCalls(MemberCalls, SectionedToolParser):
    """The calls in one tool message: ``<atem:invoke>`` elements, in an ``<atem:function_calls>``
    block (dropped around them)."""

    section_starts = (BLOCK_START,)
    section_ends = (BLOCK_END,)
    call_start = INVOKE
    call_end = INVOKE_END
    member_pattern = _PARAMETER

    def call_head(self, body: str, complete: bool) -> tuple[str, int] | None:
        head = _HEAD.match(body)
        return None if head is None else (self._tool_name(head.group(1)), head.end())

    def member(self, parameter: re.Match[str]) -> tuple[str, Any]:
        return parameter.group(1), atem_value(parameter.group(2))

    def _tool_name(self, name: str) -> str:
        """``name`` as the request's tools spell it: ``x.x`` is ``x`` when only ``x`` is a tool."""
        head, dot, tail = name.partition(".")
        if name not in self.tools and dot and head == tail and head in self.tools:
            return head
        return name

    def close(self) -> list[Event]:
        """The message ended: a call still open ends with the parameters read so far."""
        events = self.feed(INVOKE_END) if self._in_call else []
        return events + self.finish()


@TOOL_PARSERS.register("muse_glimmer")
class MuseGlimmerToolParser(ToolParser):
    emits_reasoning = True
    needs_special_tokens = True  # vLLM's adjust_request keeps <|message|>, <|eom|>, ... in the text

    def __init__(self, tools: Sequence[Tool] = (), prompt_text: str | None = None) -> None:
        """``prompt_text`` is accepted as for every parser that ``emits_reasoning``; the output
        always starts in the first header, so it is not needed."""
        super().__init__(tools)
        self._reader = MessageReader()
        self._calls: AtemCalls | None = None
        """The current message's calls, when it is to a tool."""
        self._reasoning: bool | None = None
        """The current message is reasoning (True), content (False); None outside messages."""
        self._fresh = False
        self._reasoned = False

    def feed(self, text: str) -> list[Event]:
        return self._events(self._reader.feed(text))

    def finish(self) -> list[Event]:
        events = self._events(self._reader.finish())
        if self._calls is not None:  # cut off inside a tool message
            events += self._calls.finish()
            self._calls = None
        return events

    def _events(self, messages: list[MessageEvent]) -> list[Event]:
        events: list[Event] = []
        for message in messages:
            if isinstance(message, Text):
                if self._calls is not None:
                    events += self._calls.feed(message.text)
                elif self._reasoning:
                    text = "\n" + message.text if self._fresh and self._reasoned else message.text
                    events.append(Reasoning(text))
                    self._fresh, self._reasoned = False, True
                elif self._reasoning is not None:
                    events.append(message.text)
            elif isinstance(message, Begin):
                if is_tool(message.recipient):
                    self._calls, self._reasoning = AtemCalls(list(self.tools.values())), None
                else:
                    self._reasoning = message.recipient == REASONING_RECIPIENT
                    self._fresh = True
            elif isinstance(message, End):
                if self._calls is not None:
                    events += self._calls.close()
                self._calls, self._reasoning = None, None
            elif isinstance(message, Plain):
                calls = AtemCalls(list(self.tools.values()))
                events += calls.feed(message.text) + calls.finish()
        return events

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        """Each call a message to its tool, the first one's header opened by the prompt."""
        return "".join(
            ("" if i == 0 else START + "assistant")
            + f" to={c.name}<|message|>{BLOCK_START}\n"
            + f'<atem:invoke name="{c.name}">\n'
            + "".join(
                f'<atem:parameter name="{k}">{value_text(v)}</atem:parameter>\n' for k, v in c.args.items()
            )
            + f"{INVOKE_END}\n{BLOCK_END}{EOM}"
            for i, c in enumerate(calls)
        )
