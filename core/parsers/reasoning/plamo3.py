"""PLaMo 3 reasoning (vLLM's ``plamo3``, parser/plamo3.py): ``<|plamo:begin_think:plamo|>`` ...
``<|plamo:end_think:plamo|>``, each marker written with several special tokens:

    <|plamo:begin_think:plamo|>The user wants Tokyo's weather.<|plamo:end_think:plamo|>
    It is sunny in Tokyo today.<|plamo:tag|>

Thinking is on unless the request's ``chat_template_kwargs`` set ``enable_thinking`` false (then
the output is content, verbatim but for the end-of-turn marker ``<|plamo:tag|>``, always
dropped). With thinking on the output is reasoning from its first character (the start marker
the model writes is dropped) up to the end marker, the end of the turn, or a tool-call section
(``<|plamo:begin_tool_requests:plamo|>``: it and what follows are content for the ``plamo3``
tool parser); a later start marker opens another section and a stray end marker is dropped. A
marker cut off at the very end of the output is dropped, as vLLM drops it.
"""

from __future__ import annotations

from dyn.core.parsers.events import Event
from dyn.core.parsers.reasoning import REASONING_PARSERS
from dyn.core.parsers.reasoning.think import TaggedReasoningParser
from dyn.core.parsers.tool.plamo3 import BEGIN_THINK, BEGIN_TOOL_REQUESTS, END_THINK, EOT, cut_marker


@REASONING_PARSERS.register("plamo3")
class Plamo3ReasoningParser(TaggedReasoningParser):
    needs_special_tokens = True  # the markers' pieces are special tokens
    start_tags = (BEGIN_THINK,)
    end_tags = (END_THINK, EOT)
    starts_in_reasoning = True
    thinking_keys = ("enable_thinking",)
    exits = (BEGIN_TOOL_REQUESTS,)
    reopens = True
    drops_stray_end = True
    drops = (EOT,)

    def finish(self) -> list[Event]:
        self._buf = self._buf[: len(self._buf) - cut_marker(self._buf)]
        return super().finish()
