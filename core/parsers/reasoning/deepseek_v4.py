"""DeepSeek V4 and V4.1 reasoning (vLLM's ``deepseek_v4`` and ``deepseek_v41``): ``<think>`` ...
``</think>``, then the answer or a DSML tool-call block (``<｜DSML｜tool_calls>`` in V4,
``<｜DSML｜ calls>`` in V4.1).

Thinking is on unless the request's ``chat_template_kwargs`` switch it off (``thinking`` or
``enable_thinking`` false, or ``reasoning_effort`` ``"none"``); then the output is content. With
thinking on the output is reasoning from its first character (a ``<think>`` the model writes
anyway is dropped) up to ``</think>``, or up to a tool-call block the model opens without closing
the section first: the block and what follows are content. After the section a later ``<think>``
opens another one and a stray ``</think>`` is dropped; whitespace before the end of a section is
dropped, as vLLM drops trailing reasoning whitespace. A template that closes an empty section in
the prompt (``</think>`` at its end) makes the output content, verbatim.

vLLM also accepts the misspelled block openers ``<｜DSML｜toolcalls>`` and ``<｜DSML｜tool>`` seen
from V4 in production; so do these.
"""

from __future__ import annotations

from typing import ClassVar

from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser


@REASONING_PARSERS.register("deepseek_v4")
class DeepSeekV4ReasoningParser(TaggedReasoningParser):
    """DeepSeek V4 (see the module)."""

    needs_special_tokens = True  # vLLM's parser keeps special tokens in the text it reads
    starts_in_reasoning = True
    thinking_keys = ("thinking", "enable_thinking")
    exits: ClassVar[tuple[str, ...]] = ("<｜DSML｜tool_calls>", "<｜DSML｜toolcalls>", "<｜DSML｜tool>")
    reopens = True
    drops_stray_end = True
    trims_reasoning_end = True

    def thinking(self) -> bool:
        return super().thinking() and self.chat_template_kwargs.get("reasoning_effort") != "none"


@REASONING_PARSERS.register("deepseek_v41")
class DeepSeekV41ReasoningParser(DeepSeekV4ReasoningParser):
    """DeepSeek V4.1: V4's reading with the spaced DSML block opener ``<｜DSML｜ calls>``."""

    exits = ("<｜DSML｜ calls>",)
