"""MiniMax M3 reasoning (vLLM's ``minimax_m3``): ``<mm:think>`` ... ``</mm:think>``, then the
answer.

With ``chat_template_kwargs: {"thinking_mode": "enabled"}`` the template opens the section in the
prompt, so the output is reasoning from its first character (a ``<mm:think>`` the model writes
anyway is dropped) up to ``</mm:think>``; so is it after a prompt that ends with ``<mm:think>``.
Otherwise (``adaptive``, ``disabled``, or no kwarg) the model decides: the output is content
until ``<mm:think>`` opens a section, and content again after its end. One section only: a later
``<mm:think>`` is content. A stray ``</mm:think>`` outside the section is dropped (M3 may begin an
answer with one; vLLM drops only that first one, and keeps later ones). A prompt that ends with a closed section does not make the output verbatim, as it does for
the ``<think>`` family: vLLM reads M3's output the same whatever the prompt, so a stray closer
after such a prompt is still dropped.
"""

from __future__ import annotations

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser


@REASONING_PARSERS.register("minimax_m3")
class MiniMaxM3ReasoningParser(TaggedReasoningParser):
    """MiniMax M3's ``<mm:think>`` section (see the module)."""

    start_tags = ("<mm:think>",)
    end_tags = ("</mm:think>",)
    drops_stray_end = True

    def opened_by_prompt(self, prompt: str) -> bool | None:
        if super().opened_by_prompt(prompt):
            return True
        return True if self.chat_template_kwargs.get("thinking_mode") == "enabled" else None
