"""NVIDIA Nemotron reasoning, all ``<think>`` ... ``</think>``, under the names of two readings:

- ``nemotron_deci`` (Dynamo): Llama-Nemotron Super/Ultra and other Deci-architecture models,
  which write ``<think>`` themselves when the system prompt says "detailed thinking on"; a
  section exists only where the model opens one (Dynamo's ``basic`` reading).
- ``nemotron_v3`` (vLLM; also plain ``nemotron``; the ``nano_v3`` plugin of Nemotron-3-Nano's
  model card; SGLang's ``nemotron_3``; Dynamo's ``nemotron3`` and ``nemotron_nano``; Nemotron-Nano-9B-v2's
  ``nemotron_nano_v2`` plugin): the template opens the section (``<think>\\n``) or closes an
  empty one (``enable_thinking: false``); reasoning from the first character otherwise, ended
  by ``</think>`` or a ``<tool_call>``; whitespace before the end is dropped. When
  ``enable_thinking`` is false or ``force_nonempty_content`` is true and the output left no
  content, the reasoning is given as content at the end (vLLM swaps them; a stream has already
  sent the reasoning, so it is repeated as content, as vLLM's streaming fallback does).
  Dynamo's ``nemotron3``/``nemotron_nano`` are its ``deepseek_r1``, without the kwargs; we
  follow vLLM.
"""

from __future__ import annotations

from dyn.core.parsers.events import Event, Reasoning
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import BasicReasoningParser, TaggedReasoningParser


@REASONING_PARSERS.register("nemotron_deci")
class NemotronDeciReasoningParser(BasicReasoningParser):
    """Dynamo's ``nemotron_deci`` (see the module)."""


@REASONING_PARSERS.register(
    "nemotron_v3", "nemotron", "nano_v3", "nemotron_3", "nemotron3", "nemotron_nano", "nemotron_nano_v2"
)
class NemotronV3ReasoningParser(TaggedReasoningParser):
    """Nemotron 3 Nano/Super and Nemotron Nano 2 (see the module)."""

    starts_in_reasoning = True
    thinking_keys = ("enable_thinking",)
    exits = ("<tool_call>",)
    drops_stray_end = True
    trims_reasoning_end = True

    def setup(self) -> None:
        super().setup()
        kwargs = self.chat_template_kwargs
        self._force_content = (
            kwargs.get("enable_thinking") is False or kwargs.get("force_nonempty_content") is True
        )
        self._reasoning_seen: list[str] = []
        self._content_seen = False

    def feed(self, text: str) -> list[Event]:
        return self._watch(super().feed(text))

    def finish(self) -> list[Event]:
        events = self._watch(super().finish())
        if self._force_content and not self._content_seen and self._reasoning_seen:
            events.append("".join(self._reasoning_seen))
        return events

    def _watch(self, events: list[Event]) -> list[Event]:
        if self._force_content:
            for event in events:
                if isinstance(event, Reasoning):
                    self._reasoning_seen.append(event.text)
                elif isinstance(event, str) and event.strip():
                    self._content_seen = True
        return events
