"""gpt-oss tool calls in OpenAI's Harmony format (vLLM's ``openai``, Dynamo's ``harmony``).

Format (OpenAI's "Harmony response format" guide, "Function calling"; openai/harmony): a call
is a message to a function on the ``commentary`` channel, its text the arguments' JSON, ended
by ``<|call|>``. Reasoning (the ``analysis`` channel) and the answer (``final``) are messages
of their own, so this parser also emits ``Reasoning`` (``emits_reasoning``) and stands in for
the ``gpt_oss`` reasoning parser.

    <|channel|>analysis<|message|>Need to use function get_current_weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_current_weather <|constrain|>json
    <|message|>{"location":"San Francisco"}<|call|>

(one line in the output; wrapped here).

A call starts when its header is read and streams the model's argument text verbatim; it ends
at ``<|call|>``, or at the end of the stream when its JSON is complete (``<|call|>`` is a stop
token, so engines usually leave it out of the text). Commentary without a recipient (a
preamble) is content, as in vLLM. Reading the text is ``dyn.core.parsers.harmony``'s job.
"""

from __future__ import annotations

from collections.abc import Sequence

from dyn.core.parsers.events import TOOL_CALL_END, Event, ToolCallArgs, ToolCallStart
from dyn.core.parsers.harmony import (
    HarmonyEvent,
    HarmonyParser,
    MessageEnd,
    MessageStart,
    MessageText,
    function_name,
)
from dyn.core.parsers.text import JsonScanner
from dyn.core.parsers.tool import TOOL_PARSERS, Tool, ToolCall, ToolParser


@TOOL_PARSERS.register("openai", "gpt_oss", "harmony")
class GptOssToolParser(HarmonyParser, ToolParser):
    emits_reasoning = True

    def __init__(self, tools: Sequence[Tool] = (), prompt_text: str | None = None) -> None:
        """``prompt_text``: the rendered prompt, when the caller has it (see ``HarmonyReader``)."""
        super().__init__(tools)
        self.start_harmony(prompt_text)
        self._args = ""
        self._scanner = JsonScanner()

    def finish(self) -> list[Event]:
        events = super().finish()
        if self._in_call and self._scanner.scan(self._args) >= 0:
            events.append(TOOL_CALL_END)
            self._in_call = False
        return events

    def _events(self, messages: list[HarmonyEvent]) -> list[Event]:
        events: list[Event] = []
        for message in messages:
            if isinstance(message, MessageStart):
                name = function_name(message)
                self._in_call = name is not None
                if name is not None:
                    self._args, self._scanner = "", JsonScanner()
                    events.append(ToolCallStart(name))
                else:
                    self._channels.begin(message)
            elif isinstance(message, MessageText):
                if self._in_call:
                    self._args += message.text
                    events.append(ToolCallArgs(message.text))
                else:
                    events.append(self._channels.text(message.text))
            elif isinstance(message, MessageEnd):
                if self._in_call:
                    if not self._args:
                        events.append(ToolCallArgs("{}"))
                    events.append(TOOL_CALL_END)
                self._in_call = False
            elif message.text:
                events.append(message.text)
        return events

    @classmethod
    def render(cls, calls: Sequence[ToolCall]) -> str:
        return "<|start|>assistant".join(
            f"<|channel|>commentary to=functions.{c.name} <|constrain|>json<|message|>{c.arguments}<|call|>"
            for c in calls
        )
