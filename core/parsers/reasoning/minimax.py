"""MiniMax-M2 / M2.1 reasoning. Its template ends the prompt with ``<think>\\n`` and the model
writes its reasoning, ``</think>``, then the answer or ``<minimax:tool_call>`` blocks.

Three readings are in use under different names:

- ``minimax_m2`` (vLLM), ``minimax`` (SGLang), ``minimax_append_think`` (Dynamo; SGLang's
  ``minimax-append-think``): reasoning from the first character to ``</think>``; a tool-call
  block written before it ends the reasoning too (as vLLM reads it); a second ``</think>`` is
  dropped. Dynamo and SGLang get the same split by prepending ``<think>`` to the output.
- ``minimax_m2_append_think`` (vLLM): no split at all; the content is the output with the
  ``<think>`` the template swallowed put back in front, for clients that keep MiniMax's
  interleaved thinking in the conversation themselves.
"""

from __future__ import annotations

from dyn.core.parsers.events import Event
from dyn.core.parsers.reasoning import REASONING_PARSERS, ReasoningParser
from dyn.core.parsers.reasoning.think import TaggedReasoningParser


@REASONING_PARSERS.register("minimax_m2", "minimax", "minimax_append_think")
class MiniMaxM2ReasoningParser(TaggedReasoningParser):
    """MiniMax-M2's reasoning split (see the module)."""

    starts_in_reasoning = True
    exits = ("<minimax:tool_call>",)
    drops_stray_end = True


@REASONING_PARSERS.register("minimax_m2_append_think")
class MiniMaxM2AppendThinkReasoningParser(ReasoningParser):
    """vLLM's ``minimax_m2_append_think``: all content, ``<think>`` in front (see the module)."""

    def setup(self) -> None:
        super().setup()
        self._started = False

    def feed(self, text: str) -> list[Event]:
        if not text:
            return []
        if not self._started:
            self._started = True
            return ["<think>" + text]
        return [text]
