"""MuseGlimmer reasoning (vLLM's ``muse_glimmer``): messages to ``self`` are reasoning.

Format (see ``dyn.core.parsers.muse_glimmer``): the output is a run of messages, each
``[<|start|>assistant] to=RECIPIENT<|message|>TEXT`` ended by ``<|eom|>`` or ``<|eot|>``; the
prompt ends with ``<|start|>assistant``, so the model starts with the first header:

     to=self<|message|>17 * 23 = 391. Give the result.<|eom|><|start|>assistant to=user<|message|>17 × 23 = **391**.<|eot|>

Messages to ``self`` are reasoning (several joined with a newline, as vLLM joins them); those to
``user`` (or to no one) are content, without their framing. A message to a tool stays content as
the model wrote it, header and end marker included, for the tool parser that runs after this one
(the ``muse_glimmer`` tool parser reads calls and reasoning together and takes this parser's
place). An output without any header is content. Reasoning cut off by ``max_tokens`` stays
reasoning.

Differences from vLLM's reading: every message to ``user`` is content (vLLM's unary reading keeps
the first, and leaves their framing in when the output also calls a tool); text outside the
messages is dropped in streaming too.
"""

from __future__ import annotations

from dyn.core.parsers.events import Event, Reasoning
from dyn.core.parsers.muse_glimmer import (
    REASONING_RECIPIENT,
    Begin,
    End,
    MessageEvent,
    MessageReader,
    Text,
    is_tool,
)
from dyn.core.parsers.reasoning import REASONING_PARSERS, ReasoningParser

_CONTENT, _REASONING, _RAW = 0, 1, 2
"""What the current message is: the answer, reasoning, or a tool call (passed on as written)."""


@REASONING_PARSERS.register("muse_glimmer")
class MuseGlimmerReasoningParser(ReasoningParser):
    needs_special_tokens = True  # vLLM's adjust_request keeps <|message|>, <|eom|>, ... in the text

    def setup(self) -> None:
        super().setup()
        self._reader = MessageReader()
        self._kind = _CONTENT
        self._fresh = False
        self._reasoned = False

    def feed(self, text: str) -> list[Event]:
        return self._events(self._reader.feed(text))

    def finish(self) -> list[Event]:
        return self._events(self._reader.finish())

    def _events(self, messages: list[MessageEvent]) -> list[Event]:
        events: list[Event] = []
        for message in messages:
            if isinstance(message, Begin):
                if is_tool(message.recipient):
                    self._kind = _RAW
                    events.append(message.header)
                else:
                    self._kind = _REASONING if message.recipient == REASONING_RECIPIENT else _CONTENT
                    self._fresh = True
            elif isinstance(message, Text):
                if self._kind != _REASONING:
                    events.append(message.text)
                else:
                    text = "\n" + message.text if self._fresh and self._reasoned else message.text
                    events.append(Reasoning(text))
                    self._fresh, self._reasoned = False, True
            elif isinstance(message, End):
                if self._kind == _RAW and message.marker:
                    events.append(message.marker)
            elif message.text:  # Plain
                events.append(message.text)
        return events
