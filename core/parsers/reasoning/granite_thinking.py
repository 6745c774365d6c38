"""IBM Granite 4.2 thinking models (vLLM's ``granite_thinking_parser``, parser/granite_thinking.py):
Nemotron 3's ``<think>`` reading (``nemotron_v3``), whose template the model follows:

    The user asks for 2 + 2. That is 4.
    </think>
    2 + 2 = 4.

The template opens the section, so the output is reasoning up to ``</think>`` (or a
``<tool_call>``) unless ``enable_thinking`` is false; the newlines the template writes after
``</think>`` are dropped, as is any leading whitespace of the content when thinking is off. With
``force_nonempty_content`` true (or thinking off) an output with no text after the reasoning
(cut off by ``max_tokens``, or ending at ``</think>``) gives its reasoning as content at the
end (vLLM swaps them; a stream has already sent the reasoning, so it stays reasoning too, as in
``nemotron_v3``); unlike Nemotron's reading, content that is only whitespace counts as content.

Differs from vLLM: leading spaces of the content are dropped too (vLLM drops only newlines).
"""

from __future__ import annotations

from dyn.core.parsers.events import Event
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.nemotron import NemotronV3ReasoningParser


@REASONING_PARSERS.register("granite_thinking_parser")
class GraniteThinkingReasoningParser(NemotronV3ReasoningParser):
    def setup(self) -> None:
        super().setup()
        self._strip = True  # the content starts after its leading whitespace, thinking on or off

    def _content(self, events: list[Event], final: bool) -> bool:
        if self._buf:
            self._content_seen = True  # text after the reasoning, even whitespace, is content
        return super()._content(events, final)
