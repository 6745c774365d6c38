"""gpt-oss reasoning in OpenAI's Harmony format (Dynamo's ``gpt_oss``, vLLM's ``openai_gptoss``).

The ``analysis`` channel is reasoning; ``final`` messages and ``commentary`` preambles are
content, as vLLM's ``parse_chat_output`` splits them. A tool call (a message to
``functions.NAME``) stays content, as the text the model wrote, for there is no tool parser
to read it when this parser runs (the ``gpt_oss`` tool parser reads calls and reasoning
together and takes this parser's place). The rendered prompt says where the output starts
(normally right after ``<|start|>assistant``). See ``dyn.core.parsers.harmony``.
"""

from __future__ import annotations

from dyn.core.parsers.events import Event
from dyn.core.parsers.harmony import (
    HarmonyEvent,
    HarmonyParser,
    MessageEnd,
    MessageStart,
    MessageText,
    function_name,
)
from dyn.core.parsers.reasoning import REASONING_PARSERS, ReasoningParser


@REASONING_PARSERS.register("gpt_oss", "openai_gptoss")
class GptOssReasoningParser(HarmonyParser, ReasoningParser):
    def setup(self) -> None:
        super().setup()
        self.start_harmony(self.prompt_text)

    def _events(self, messages: list[HarmonyEvent]) -> list[Event]:
        events: list[Event] = []
        for message in messages:
            if isinstance(message, MessageStart):
                self._in_call = function_name(message) is not None
                if self._in_call:
                    raw = message.header
                else:
                    self._channels.begin(message)
                    continue
            elif isinstance(message, MessageText):
                if not self._in_call:
                    events.append(self._channels.text(message.text))
                    continue
                raw = message.text
            elif isinstance(message, MessageEnd):
                raw = message.marker if self._in_call else ""
                self._in_call = False
            else:
                raw = message.text
            if raw:
                events.append(raw)
        return events
